"""Built-in `toolcall` generator: multi-step toolcall agent episodes in sandboxed environments.

Started by the rollout buffer (`POST /start_rollout {"task_type": "toolcall", ...}`, or
`ENV_TYPE=toolcall clawloop buffer`); see `clawloop.envs.rollout` for the payload keys
and the item shape, and `clawloop.envs.toolcall` for the environment.

The payload's `reward` picks the reward (`clawloop.envs.toolcall.RewardShaping`):
`outcome` (default, the reference's) or `shaped` (the outcome plus `reward_call_coef`
x the calls' mean score: 1 for a correct call, partial credit for a near one; plus
`reward_use_coef` when the final answer is the tool's result), so that dropping the tool
no longer pays. On the tiny model it keeps the tool but cannot make its calls right
(bench/RESULTS.md, tool-call learning).
"""

from __future__ import annotations

from typing import Any

TASK_TYPE = "toolcall"


def run_rollout(data: dict[str, Any]) -> dict[str, Any]:
    # imported when a rollout runs (in its own process), not when the buffer discovers this file
    from clawloop.envs.rollout import AgentRollout
    from clawloop.envs.toolcall import RewardShaping

    rollout = AgentRollout(TASK_TYPE, data)
    rollout.shaping = RewardShaping.from_data(data)
    return rollout.run()
