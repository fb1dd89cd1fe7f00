"""Durable storage of turns, judgements and trainer cursors (SQLite, WAL)."""

from clawloop.store.sqlite import Store

__all__ = ["Store"]
