"""The toolcall track: arithmetic with a sandboxed code interpreter or calculator tool; see `env.py`.

The names `clawloop.envs.toolcall` always had are exported here, so a generator file or a doc that
imports them keeps working.
"""

from clawloop.envs.toolcall.env import (ALLOWED_MODULES, CALCULATOR, CODE_INTERPRETER, DATA, DEFAULT_SYSTEM,
                                        MAX_OBSERVATION, N_GENERATED, REWARD_MODES, TRACK, RewardShaping,
                                        ToolCallEnv, ToolCallTrack, call_score, generated_problems,
                                        load_tools_config, reward_of)

__all__ = [
    "ALLOWED_MODULES", "CALCULATOR", "CODE_INTERPRETER", "DATA", "DEFAULT_SYSTEM", "MAX_OBSERVATION", "N_GENERATED",
    "REWARD_MODES", "TRACK", "RewardShaping", "ToolCallEnv", "ToolCallTrack", "call_score", "generated_problems",
    "load_tools_config", "reward_of",
]
