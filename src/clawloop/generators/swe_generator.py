"""Built-in `swe` generator: multi-step swe agent episodes in sandboxed environments.

Started by the rollout buffer (`POST /start_rollout {"task_type": "swe", ...}`, or
`ENV_TYPE=swe clawloop buffer`); see `clawloop.envs.rollout` for the payload keys
and the item shape, and `clawloop.envs.swe` for the environment.
"""

from __future__ import annotations

from typing import Any

TASK_TYPE = "swe"


def run_rollout(data: dict[str, Any]) -> dict[str, Any]:
    # imported when a rollout runs (in its own process), not when the buffer discovers this file
    from clawloop.envs.rollout import run_agent_rollout

    return run_agent_rollout(TASK_TYPE, data)
