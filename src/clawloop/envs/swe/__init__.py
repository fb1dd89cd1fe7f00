"""The SWE track: fix a bug in a repo, checked by its tests (`env.py`); `tasks.py` makes the shipped tasks
(`clawloop swe make-tasks`) from `repos.py`, `mutations.py` and `suite.py`.

The names `clawloop.envs.swe` always had are exported here, so a generator file or a doc that
imports them keeps working.
"""

from clawloop.envs.swe.env import (DIFF_TIMEOUT_S, FORMAT_ERROR, INSTANCE_TEMPLATE, LONG_OUTPUT, MAX_OBSERVATION,
                                   MAX_PATCH_BYTES, REQUIRED, SHIPPED, SUBMIT, SYSTEM_PROMPT, TIMEOUT_TEMPLATE,
                                   TRACK, SWEEnv, SWETrack, checkout, user_task)

__all__ = [
    "DIFF_TIMEOUT_S", "FORMAT_ERROR", "INSTANCE_TEMPLATE", "LONG_OUTPUT", "MAX_OBSERVATION", "MAX_PATCH_BYTES",
    "REQUIRED", "SHIPPED", "SUBMIT", "SYSTEM_PROMPT", "TIMEOUT_TEMPLATE", "TRACK", "SWEEnv", "SWETrack", "checkout",
    "user_task",
]
