"""A past revision's `src/clawloop`, unpacked, for benches that run "before" and "after" side by side in
one run (each in its own subprocess with PYTHONPATH pointing at one of them)."""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def unpack_source(rev: str, dest: Path) -> Path:
    """`git archive REV src/clawloop` into `dest`; returns the folder to put on PYTHONPATH."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/clawloop"], capture_output=True)
    if tar.returncode != 0:
        raise SystemExit(f"git archive {rev}: {tar.stderr.decode()[-500:]} (run from a clone with history)")
    tarfile.open(fileobj=BytesIO(tar.stdout)).extractall(dest)
    return dest / "src"
