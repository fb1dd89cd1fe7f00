"""SQLite store: turns, judgements, sessions and cursors in one WAL-mode file.

The embedded default implementation of the `Store` protocol (`store/base.py`). It
is put together from one module per concern, each a class over the shared write
path:

    writer.py      SQLiteBase: the writer thread, retries, the spill file, flush/close
    schema.py      tables, migrations, column order, row <-> record conversion
    chunks.py      what turns repeat (prompt ids, messages, tools), stored once by content hash
    turns.py       TurnRows: capture's writes, session reads, version numbering
    judgements.py  JudgementRows: verdicts and the trainer cursors
    browse.py      BrowseRows: the dashboard's read-only pages and `stats`

Open one with `clawloop.store.open_store(path)` (or `naming.open_store(cfg)` for
a config's data dir). Run standalone only through the CLI (`clawloop export`,
`clawloop import`).
"""

from __future__ import annotations

from clawloop.store.browse import BrowseRows
from clawloop.store.judgements import JudgementRows
from clawloop.store.turns import TurnRows


class SQLiteStore(TurnRows, JudgementRows, BrowseRows):
    """One SQLite file under the data dir. Thread-safe; one writer thread.

    `max_queue`: ops the writer queue holds before callers spill instead (never block the
    event loop); `overloaded()` is True past `high_water` of it. `retries` / `backoff_s`: a
    failed batch is retried that many times, waiting backoff_s, 2x, 4x ... (at most 2 s)
    between tries, before its ops are spilled. `spill_path`: default `spill.jsonl` beside
    the database file."""
