"""The browsers of this process: per backend, up to $CLAWLOOP_GUI_BROWSERS (default: the CPU cores, at most 4).

Launched when first needed and reused across episodes: an episode takes a new
page (context) in the least busy browser. `close_browsers()` kills every browser
and driver this process started; it also runs at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from clawloop.envs.gui.browser import Browser
from clawloop.envs.gui.chromium import kill_group, started_process_groups, unregister_group


class BrowserPool:
    """Browsers of one backend, shared by the episodes of this process."""

    def __init__(self, backend: str, max_browsers: int):
        self.backend = backend
        self.max_browsers = max(1, max_browsers)
        self.browsers: list[Browser] = []
        self._lock = threading.Lock()
        self._launching = threading.Lock()
        self._next = 0

    def acquire(self, action_timeout_s: float) -> Browser:
        with self._launching:
            with self._lock:
                for b in self.browsers:
                    if not b.dead and not b.chromium.alive():
                        b.kill("chromium exited while idle")
                self.browsers = [b for b in self.browsers if not b.dead]
                live = sorted(self.browsers, key=lambda b: (b.pages, b.index))
                if live and (live[0].pages == 0 or len(live) >= self.max_browsers):
                    live[0].pages += 1
                    live[0].episodes += 1
                    return live[0]
                index, self._next = self._next, self._next + 1
            b = Browser(self.backend, index, action_timeout_s)
            b.launch()
            with self._lock:
                b.pages += 1
                b.episodes += 1
                self.browsers.append(b)
            return b

    def release(self, b: Browser) -> None:
        with self._lock:
            b.pages = max(0, b.pages - 1)

    def close(self) -> None:
        with self._lock:
            browsers, self.browsers = self.browsers, []
        for b in browsers:
            b.close()


_POOLS: dict[str, BrowserPool] = {}
_POOLS_LOCK = threading.Lock()


def max_browsers() -> int:
    try:
        return max(1, int(os.environ.get("CLAWLOOP_GUI_BROWSERS", "")))
    except ValueError:
        return max(1, min(4, os.cpu_count() or 1))


def browser_pool(backend: str) -> BrowserPool:
    with _POOLS_LOCK:
        pool = _POOLS.get(backend)
        if pool is None:
            pool = _POOLS[backend] = BrowserPool(backend, max_browsers())
        return pool


def browser_stats() -> list[dict[str, Any]]:
    """Every live browser of this process: memory (RSS/PSS of its process tree, MB) and call latency."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    return [b.stats() for p in pools for b in list(p.browsers)]


def close_browsers() -> None:
    """Kill every browser this process started (also run at exit)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        p.close()
    for pgid in started_process_groups():
        kill_group(pgid)
        unregister_group(pgid)


atexit.register(close_browsers)
