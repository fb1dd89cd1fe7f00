"""Runs vLLM's OpenAI server as a child that dies with clawloop.

Executed by the *vLLM environment's* Python as a plain file (it imports
nothing from clawloop: `.venv-vllm` does not have clawloop installed):

    .venv-vllm/bin/python vllm_launch.py PARENT_PID -- --model DIR --port N ...

clawloop starts it in a new session (its own process group, so stopping it
stops vLLM's engine-core and worker processes too). Two guards against an
orphaned vLLM when clawloop itself is killed with SIGKILL, where no cleanup
code of clawloop's can run:

- the parent-death signal: the kernel sends SIGTERM to this process when the
  parent exits (prctl PR_SET_PDEATHSIG), and vLLM shuts down on SIGTERM;
- a watchdog thread that polls the parent pid, and on its death sends SIGTERM
  to the whole process group, then SIGKILL after a grace period (covers vLLM
  children, and the case where the signal was missed or ignored).
"""

import ctypes
import os
import runpy
import signal
import sys
import threading
import time

GRACE_S = 10.0


def _parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: the watchdog alone guards
        pass


def _watchdog(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            break
    pgid = os.getpgid(0)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    time.sleep(GRACE_S)
    os.killpg(pgid, signal.SIGKILL)


def main() -> None:
    parent = int(sys.argv[1])
    if sys.argv[2] != "--":
        raise SystemExit("usage: vllm_launch.py PARENT_PID -- VLLM_SERVER_ARGS...")
    _parent_death_signal()
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(1)
    threading.Thread(target=_watchdog, args=(parent,), name="clawloop-parent-watchdog", daemon=True).start()
    # This file's folder is sys.path[0], and it holds clawloop's own `vllm.py`: drop it, so
    # `import vllm` finds the real package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[3:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
