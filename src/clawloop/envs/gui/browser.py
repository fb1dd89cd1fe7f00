"""One browser: a chromium process, its driver (a backend), and the thread that makes every call to it.

Every call has a time limit: a browser that does not answer in time, or whose
process has died, is killed and `GuiBrowserError` says what happened (the pool
then launches a new one for the next episode). `stats()` reports its memory (RSS
and PSS of its process tree) and per-call latency.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from clawloop.envs.gui.backend import Backend
from clawloop.envs.gui.chromium import (LAUNCH_TIMEOUT_S, ChromiumProcess, GuiBrowserError, kill_group, memory_of,
                                         unregister_group)
from clawloop.envs.gui.playwright_backend import PlaywrightBackend
from clawloop.envs.gui.selenium_backend import SeleniumBackend

log = logging.getLogger(__name__)

ACTION_TIMEOUT_S = 30.0


class Browser:
    def __init__(self, backend: str, index: int, action_timeout_s: float = ACTION_TIMEOUT_S):
        self.backend_name = backend
        self.index = index
        self.action_timeout_s = action_timeout_s
        self.chromium = ChromiumProcess(f"{backend}{index}")
        self.backend: Backend = PlaywrightBackend() if backend == "playwright" else SeleniumBackend()
        self.pages = 0
        self.episodes = 0
        self.dead: str | None = None
        self._started = self._stopped = False
        self.version = ""
        self.calls = 0
        self.call_s = 0.0
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"gui-{backend}-{index}")
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                if not self._stopped:  # killed: let the driver go too (playwright's node process, chromedriver)
                    try:
                        self._stop_backend()
                    except Exception as e:  # noqa: BLE001 - its browser is gone already
                        log.debug("gui: stopping the driver of a dead browser: %s", e)
                return
            fn, args, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def _launch(self) -> str:
        self.chromium.start()
        self._started = True
        self.backend.start(self.chromium.port, self.action_timeout_s)
        return self.backend.version()

    def launch(self) -> None:
        try:
            self.version = self.call("launch", self._launch, timeout=LAUNCH_TIMEOUT_S + self.action_timeout_s)
        except Exception:
            self.kill("could not start")
            raise

    def call(self, what: str, fn: Callable, *args, timeout: float | None = None) -> Any:
        """Run fn(*args) on this browser's thread; a hang or a dead browser raises GuiBrowserError."""
        if self.dead:
            raise GuiBrowserError(f"browser {self.backend_name}#{self.index} is gone ({self.dead})")
        fut: Future = Future()
        t0 = time.monotonic()
        self._q.put((fn, args, fut))
        limit = timeout or self.action_timeout_s
        try:
            out = fut.result(timeout=limit)
        except FutureTimeout:
            self.kill(f"no answer to {what} in {limit:g} s")
            raise GuiBrowserError(f"the browser hung: no answer to {what} in {limit:g} s (chromium pid "
                                  f"{self.chromium.pid} killed; the next episode starts a new one)") from None
        except GuiBrowserError:
            raise
        except Exception as e:
            # The driver can see the page close before the kernel has the process gone (a loaded
            # machine): give a "closed" error a moment before calling it anything but a crash.
            settle = time.monotonic() + (3.0 if "closed" in str(e).lower() else 0.0)
            while self.chromium.alive() and time.monotonic() < settle:
                time.sleep(0.05)
            if not self.chromium.alive():
                self.kill("chromium exited")
                raise GuiBrowserError(f"the browser crashed during {what}: chromium pid {self.chromium.pid} "
                                      f"is gone ({type(e).__name__}: {str(e)[:200]}); the next episode starts a "
                                      "new one") from e
            raise
        finally:
            self.calls += 1
            self.call_s += time.monotonic() - t0
        return out

    def kill(self, why: str) -> None:
        """Kill chromium (its whole process group) and the driver; pending calls fail."""
        if self.dead is None:
            self.dead = why
        self.chromium.kill()
        drv = getattr(self.backend, "driver_pid", 0)
        if drv:
            kill_group(drv)
            unregister_group(drv)
        self._q.put(None)

    def _stop_backend(self) -> None:
        if not self._stopped and self._started:
            self._stopped = True
            self.backend.stop()

    def close(self) -> None:
        if self.dead is None and self.chromium.alive():
            try:
                self.call("stop", self._stop_backend, timeout=10)
            except Exception as e:  # noqa: BLE001 - killed below anyway
                log.debug("gui: stopping %s#%d: %s", self.backend_name, self.index, e)
        self.kill("closed")
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        mem = self.chromium.memory() if self.dead is None else {}
        drv = memory_of(self.backend.extra_pids()) if self.dead is None and self.backend.extra_pids() else None
        return {"backend": self.backend_name, "index": self.index, "pid": self.chromium.pid, "dead": self.dead,
                "pages": self.pages, "episodes": self.episodes, "launch_s": round(self.chromium.launch_s, 3),
                "sandboxed": self.chromium.sandboxed, "calls": self.calls,
                "mean_call_ms": round(1000 * self.call_s / self.calls, 2) if self.calls else None,
                **mem, **({"driver": drv} if drv else {})}
