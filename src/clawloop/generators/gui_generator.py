"""Built-in `gui` generator: multi-step browser episodes on MiniWoB++ pages in headless chromium.

Started by the rollout buffer (`POST /start_rollout {"task_type": "gui", ...}`, or
`ENV_TYPE=gui clawloop buffer`); see `clawloop.envs.rollout` for the payload keys and
the item shape (plus `extra_info.screenshots`: the PNG of every observation, saved under
the buffer's `artifacts/gui/<uid>/`), and `clawloop.envs.gui` for the environment.
"""

from __future__ import annotations

from typing import Any

TASK_TYPE = "gui"


def run_rollout(data: dict[str, Any]) -> dict[str, Any]:
    # imported when a rollout runs (in its own process), not when the buffer discovers this file
    from clawloop.envs.rollout import run_agent_rollout

    return run_agent_rollout(TASK_TYPE, data)
