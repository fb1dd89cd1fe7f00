"""Durable storage of turns, judgements and trainer cursors.

`Store` is the protocol components take (`store/base.py`); `SQLiteStore` the embedded default
(one WAL-mode file, `store/sqlite.py`); `PostgresStore` (`store/postgres.py`, `store/pg_linking.py`)
the one several gateway processes share; `open_store` the one place that picks an implementation
(`naming.open_store(cfg)` opens the store a config names through it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawloop.store.base import SharedSessions, Store, StoreUnavailable, TurnClaim
from clawloop.store.sqlite import SQLiteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(spec: str | Path) -> bool:
    return isinstance(spec, str) and spec.startswith(POSTGRES_SCHEMES)


def open_store(path: str | Path, **options: Any) -> Store:
    """Open (create) the store at `path`: a SQLite file, or a `postgresql://` URL (then `spill_path`, a
    local file, is required). `options` go to the implementation (max_queue, high_water, retries,
    backoff_s, spill_path). This is the one place that picks an implementation."""
    if is_postgres_url(path):
        # psycopg is an optional dependency: imported only for a PostgreSQL store
        from clawloop.store.pg_linking import PostgresStore

        return PostgresStore(str(path), **options)
    return SQLiteStore(path, **options)


__all__ = ["SQLiteStore", "SharedSessions", "Store", "StoreUnavailable", "TurnClaim", "is_postgres_url", "open_store"]
