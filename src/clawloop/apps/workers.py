"""`clawloop serve --workers N`: N gateway processes on one port, sharing one PostgreSQL store.

    clawloop serve --store postgresql://... --workers 4 --port 8000

The parent binds nothing and serves nothing: it forks N workers (before any engine, thread or store exists in
it) and waits. Each worker is a whole gateway (its own engine, its own store connections, its own PID) that
binds the port with SO_REUSEPORT, so the kernel spreads incoming connections over them; the requests of one
session may reach any worker, and capture links them through the shared store (`store/pg_linking.py`).
N `clawloop serve` processes on several machines behind any HTTP balancer work the same way (docs/SCALING.md).

Lifetimes: a worker asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG; checked once more
after asking, for a parent that died first), so no worker outlives `clawloop serve`, even one killed by
SIGKILL. SIGINT/SIGTERM to the parent is passed to each worker (each finishes its requests, flushes its
store, exits) and the parent waits for exactly those PIDs. A worker that dies on its own is started again,
up to `MAX_RESTARTS` times in all, then the parent stops the others and exits non-zero.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
from typing import Callable

log = logging.getLogger("clawloop")

MAX_RESTARTS = 5
PR_SET_PDEATHSIG = 1


def bind_shared(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other workers bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's signal forwarding is all there is
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _spawn(i: int, parent: int, serve_one: Callable[[Callable[[], socket.socket]], int], host: str, port: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the worker: never returns into the parent's code
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        _die_with_parent(parent)
        print(f"clawloop: worker {i} pid {os.getpid()}", flush=True)
        code = serve_one(lambda: bind_shared(host, port)) or 0
    except BaseException:
        log.exception("worker %d failed", i)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_workers(n: int, host: str, port: int, serve_one: Callable[[Callable[[], socket.socket]], int]) -> int:
    """Fork `n` workers running `serve_one(bind)`, where `bind()` makes the worker's listening socket once it
    is ready to serve (the kernel sends connections only to workers that listen); wait for them."""
    bind_shared(host, port).close()  # a port taken by someone else fails here, once, not in N workers
    parent = os.getpid()
    stopping = False

    def stop(signum, frame):  # noqa: ARG001
        nonlocal stopping
        stopping = True
        for pid in list(workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    workers: dict[int, int] = {}
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    restarts, failed = 0, False
    try:
        for i in range(n):
            workers[_spawn(i, parent, serve_one, host, port)] = i
        print(f"clawloop: {n} gateway workers on http://{host}:{port}/v1 (pids "
              f"{', '.join(map(str, workers))}); stop with Ctrl-C", flush=True)
        while workers:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            i = workers.pop(pid, None)
            if i is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if stopping:
                continue
            if restarts >= MAX_RESTARTS:
                log.error("worker %d (pid %d) exited (%d); %d restarts spent: stopping", i, pid, code, restarts)
                failed = True
                stop(signal.SIGTERM, None)
                continue
            restarts += 1
            log.warning("worker %d (pid %d) exited (%d); starting it again (%d/%d)", i, pid, code, restarts,
                        MAX_RESTARTS)
            time.sleep(min(5.0, 0.5 * 2 ** (restarts - 1)))
            if not stopping:
                workers[_spawn(i, parent, serve_one, host, port)] = i
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 1 if failed else 0
