"""Built-in `toolcall` generator: multi-step toolcall agent episodes in sandboxed environments.

Started by the rollout buffer (`POST /start_rollout {"task_type": "toolcall", ...}`, or
`ENV_TYPE=toolcall clawloop buffer`); see `clawloop.envs.rollout` for the payload keys
and the item shape, and `clawloop.envs.toolcall` for the environment.
"""

from __future__ import annotations

from typing import Any

TASK_TYPE = "toolcall"


def run_rollout(data: dict[str, Any]) -> dict[str, Any]:
    from clawloop.envs.rollout import run_agent_rollout

    return run_agent_rollout(TASK_TYPE, data)
