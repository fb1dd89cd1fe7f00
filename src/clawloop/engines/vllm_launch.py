"""Runs vLLM's OpenAI server as a child that dies with clawloop.

Executed by the *vLLM environment's* Python as a plain file (it imports
nothing from clawloop: `.venv-vllm` does not have clawloop installed):

    .venv-vllm/bin/python vllm_launch.py PARENT_PID -- --model DIR --port N ...

clawloop starts it in a new session (its own process group, so stopping it
stops vLLM's engine-core and worker processes too). Two guards against an
orphaned vLLM when its owner (clawloop, or the Ray actor that started it) dies
by any signal, SIGKILL included, where no cleanup code of the owner's runs:

- the parent-death signal: the kernel sends SIGTERM to this process when the
  owner exits (prctl PR_SET_PDEATHSIG), and vLLM's API server shuts down;
- a reaper: a forked process in a session of its own (a kill of the server's
  group does not reach it, and it ignores SIGTERM/SIGINT/SIGHUP) that watches
  the owner and this launcher. When either is gone it sends SIGTERM to the
  server's whole process group, then SIGKILL to what is left after a grace
  period, and exits; it also exits once the group is empty. A thread in this
  process could not do that: it dies with the launcher, and vLLM's engine
  core and workers (2.6 GB on CPU) outlived a killed launcher that way.
"""

import ctypes
import os
import runpy
import signal
import sys
import time

GRACE_S = float(os.environ.get("CLAWLOOP_REAP_GRACE_S", "10"))
POLL_S = 0.5


def _parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: the watchdog alone guards
        pass


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of a live process, None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ... starttime (22nd field)
    if fields[0] in ("Z", "X"):
        return None
    return fields[0], int(fields[2]), int(fields[19])


def _same_process(pid: int, started: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[2] == started  # a reused pid is another process


def _group_members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None and st[1] == pgid:
                out.append(int(name))
    return out


def _reap(pgid: int, watched: list[tuple[int, int]]) -> None:
    """The reaper's loop (see the module docstring); never returns."""
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while all(_same_process(pid, started) for pid, started in watched):
            if not _group_members(pgid):
                os._exit(0)
            time.sleep(POLL_S)
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            os._exit(0)
        deadline = time.monotonic() + GRACE_S
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finally:
        os._exit(0)


def _start_reaper(owner: int) -> None:
    watched = []
    for pid in (owner, os.getpid()):
        st = _proc_stat(pid)
        if st is None:
            raise SystemExit(1)  # the owner died already
        watched.append((pid, st[2]))
    pgid = os.getpgid(0)
    middle = os.fork()
    if middle == 0:  # forked twice, so the reaper is nobody's child here and never a zombie of vLLM's
        if os.fork() == 0:
            _reap(pgid, watched)
        os._exit(0)
    os.waitpid(middle, 0)


def main() -> None:
    parent = int(sys.argv[1])
    if sys.argv[2] != "--":
        raise SystemExit("usage: vllm_launch.py PARENT_PID -- VLLM_SERVER_ARGS...")
    _parent_death_signal()
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(1)
    _start_reaper(parent)  # before any thread exists: fork() copies only the calling thread
    # This file's folder is sys.path[0], and it holds clawloop's own `vllm.py`: drop it, so
    # `import vllm` finds the real package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[3:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
