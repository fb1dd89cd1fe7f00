"""Durable storage of turns, judgements and trainer cursors.

`Store` is the protocol components take (`store/base.py`); `SQLiteStore` the embedded default
(one WAL-mode file, `store/sqlite.py`); `open_store` the one place that picks an implementation
(`naming.open_store(cfg)` opens the store of a config's data dir through it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawloop.store.base import Store
from clawloop.store.sqlite import SQLiteStore


def open_store(path: str | Path, **options: Any) -> Store:
    """Open (create) the store at `path`, a SQLite file. `options` go to the implementation
    (`SQLiteStore`: max_queue, high_water, retries, backoff_s, spill_path). A second
    implementation (a PostgreSQL URL) is chosen here, and nowhere else."""
    return SQLiteStore(path, **options)


__all__ = ["SQLiteStore", "Store", "open_store"]
