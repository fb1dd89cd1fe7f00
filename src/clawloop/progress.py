"""Progress of long commands: a bar with rate and ETA on a terminal, plain lines otherwise.

    with Progress(total, "env check terminal") as bar:
        for x in work:
            ...
            bar.update(1, note="task-a: ok")

On a terminal one line is redrawn in place (`[#####.....] 12/32 1.3/s ETA 15s task-a: ok`);
anywhere else (CI logs, pipes) a plain line is printed at most every `every_s`
seconds and at the end, so logs stay short but show that work moves.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt_s(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    return f"{s // 3600:.0f}h{(s % 3600) // 60:02.0f}m"


class Progress:
    def __init__(self, total: int, label: str, *, out: TextIO | None = None, every_s: float = 10.0,
                 width: int = 24):
        self.total = max(0, int(total))
        self.label = label
        self.out = out if out is not None else sys.stderr
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.every_s = every_s
        self.width = width
        self.done = 0
        self.t0 = time.monotonic()
        self._last_print = 0.0
        self.note = ""

    def __enter__(self) -> "Progress":
        if not self.tty:
            print(f"{self.label}: {self.total} to do", file=self.out, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        eta_s = _fmt_s(eta) if eta == eta else "?"
        return (f"{self.label} [{bar}] {self.done}/{self.total} {rate:.2f}/s elapsed {_fmt_s(elapsed)} "
                f"ETA {eta_s}" + (f" {self.note}" if self.note else ""))

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self.note = note
        now = time.monotonic()
        if self.tty:
            print("\r\x1b[2K" + self.line()[:200], end="", file=self.out, flush=True)
        elif now - self._last_print >= self.every_s or self.done >= self.total:
            self._last_print = now
            print(self.line(), file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)
