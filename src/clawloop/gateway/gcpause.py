"""The garbage collector's pauses in a serving process: measured, and kept short.

CPython's cyclic collector stops every thread while it runs. A full (oldest-generation) collection
walks every tracked object, and a process with a model, its tokenizer and the web stack loaded holds
millions of them, none of which ever becomes cyclic garbage; each request allocates enough to trigger
young collections constantly and, now and then, a full one. `freeze()` (serve.gc_freeze, on by
default) moves everything alive once startup is done into the collector's permanent generation
(`gc.freeze`, Python >= 3.7), so later collections walk only what serving allocated since. A frozen
object is still freed when its last reference goes; only a cycle among frozen objects would stay.

`GcWatch` times every collection (`gc.callbacks`) and reports, under `gateway/gc_*` in /metrics,
the total time collections took, the longest one and how many full ones ran (since the freeze, when
there is one: what serving paused, not what loading the model did).
"""

from __future__ import annotations

import gc
import threading
import time

_watch: GcWatch | None = None
_lock = threading.Lock()


class GcWatch:
    """Collection times of this process (one per process: `watch()`)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.max_s = 0.0
        self.full = 0
        self.collections = 0
        self.frozen = 0
        self._t0: float | None = None
        self.counting = True
        """False while `freeze()` collects: startup's own collection is not a serving pause."""
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if not self.counting:
            self._t0 = None
            return
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        dt = time.perf_counter() - self._t0
        self._t0 = None
        self.total_s += dt
        self.collections += 1
        if dt > self.max_s:
            self.max_s = dt
        if info.get("generation") == 2:
            self.full += 1

    def stats(self) -> dict[str, float]:
        return {"gateway/gc_pause_s_total": self.total_s, "gateway/gc_pause_max_s": self.max_s,
                "gateway/gc_collections": float(self.collections), "gateway/gc_full_collections": float(self.full),
                "gateway/gc_frozen_objects": float(self.frozen)}


def watch() -> GcWatch:
    """This process's watch (created on first use)."""
    global _watch
    with _lock:
        if _watch is None:
            _watch = GcWatch()
        return _watch


def freeze() -> int:
    """Collect once, then put every object now alive out of later collections' way; returns how many."""
    w = watch()
    w.counting = False
    try:
        gc.collect()
    finally:
        w.counting = True
    gc.freeze()
    n = gc.get_freeze_count()
    w.frozen = n
    w.total_s = w.max_s = 0.0  # from here on the figures are serving's: startup's collections (loading
    w.full = w.collections = 0  # a model, 100-200 ms each over ~270 k objects) are not its pauses
    return n


def unfreeze() -> None:
    """Back into the oldest generation: collectable again."""
    gc.unfreeze()
    watch().frozen = 0
