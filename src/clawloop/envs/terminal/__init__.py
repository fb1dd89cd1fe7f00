"""The terminal track (terminal-bench style): a job in a Linux shell, checked by the task's tests; see `env.py` (the
persistent bash it drives is `shell.py`).

The names `clawloop.envs.terminal` always had are exported here, so a generator file or a doc that
imports them keeps working.
"""

from clawloop.envs.terminal.env import (DEFAULT_TEST_TIMEOUT_S, MAX_OBSERVATION, REQUIRED, SETTLE_S, SHIPPED,
                                        SYSTEM_PROMPT, TOOLS, TRACK, VIEW_WAIT_S, WRITE_INPUT_SEND_S,
                                        WRITE_INPUT_WAIT_S, TerminalEnv, TerminalTrack, load_task, task_folders)
from clawloop.envs.terminal.shell import CHUNK_HEAD, CHUNK_TAIL, WATCH_EVERY_S, Shell

__all__ = [
    "CHUNK_HEAD", "CHUNK_TAIL", "DEFAULT_TEST_TIMEOUT_S", "MAX_OBSERVATION", "REQUIRED", "SETTLE_S", "SHIPPED",
    "SYSTEM_PROMPT", "TOOLS", "TRACK", "VIEW_WAIT_S", "WATCH_EVERY_S", "WRITE_INPUT_SEND_S", "WRITE_INPUT_WAIT_S",
    "Shell", "TerminalEnv", "TerminalTrack", "load_task", "task_folders",
]
