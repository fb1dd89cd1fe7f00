"""Stored Responses-API responses: what `previous_response_id` continues and `GET /v1/responses/{id}` returns.

    store = ResponseStore(Path(cfg.data_dir) / "responses.sqlite")
    await store.put(record)                       # one committed transaction
    rec = await store.get(response_id, tenant)    # None for another tenant's id

One SQLite file beside the turn store (WAL, one short transaction per write, so a crash keeps
every response written before it and never half of one). Each row holds one response's own
conversation step, not the whole history: the messages it added (its input, in chat shape,
without `instructions`, which OpenAI does not carry over) and its output message, plus the id of
the response it continued; `conversation()` walks that chain back. Rows are per tenant: another
tenant's id reads as missing. Calls run in a worker thread, each on its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_CHAIN = 10_000
"""Longest `previous_response_id` chain followed (a guard against a cycle written by hand)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    previous_id TEXT,
    session_id TEXT,
    messages TEXT NOT NULL,
    response TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""


@dataclass
class ResponseRecord:
    id: str
    tenant: str
    previous_id: str | None
    session_id: str | None
    """The capture session the response's turn went to, when it was named (explicitly or inherited);
    None: capture inferred it from the conversation, and will again for a continuation."""
    messages: list[dict[str, Any]]
    """This step's chat messages: the new input, then the assistant's output message."""
    response: dict[str, Any]
    """The Response object as it was returned."""
    created_at: float = 0.0


class ResponseStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._ready = False
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        if not self._ready:
            with self._lock:
                if not self._ready:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute(_SCHEMA)
                    conn.commit()
                    self._ready = True
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # -- sync ----------------------------------------------------------------
    def put_sync(self, rec: ResponseRecord) -> None:
        with contextlib.closing(self._connect()) as conn, conn:
            conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (rec.id, rec.tenant, rec.previous_id, rec.session_id,
                          json.dumps(rec.messages, ensure_ascii=False), json.dumps(rec.response, ensure_ascii=False),
                          rec.created_at or time.time()))

    def get_sync(self, response_id: str, tenant: str) -> ResponseRecord | None:
        with contextlib.closing(self._connect()) as conn:
            return self._get(conn, response_id, tenant)

    @staticmethod
    def _get(conn: sqlite3.Connection, response_id: str, tenant: str) -> ResponseRecord | None:
        row = conn.execute("SELECT id, tenant, previous_id, session_id, messages, response, created_at "
                           "FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)).fetchone()
        if row is None:
            return None
        return ResponseRecord(row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5]), row[6])

    def conversation_sync(self, response_id: str, tenant: str) -> tuple[ResponseRecord, list[dict[str, Any]]] | None:
        """The response and the chat messages of its whole chain, oldest first; None when it (or a
        response it continued) is missing."""
        with contextlib.closing(self._connect()) as conn:
            head = rec = self._get(conn, response_id, tenant)
            steps: list[list[dict[str, Any]]] = []
            while rec is not None:
                steps.append(rec.messages)
                if rec.previous_id is None:
                    break
                if len(steps) > MAX_CHAIN:
                    return None
                rec = self._get(conn, rec.previous_id, tenant)
            if head is None or rec is None:
                return None
        return head, [m for step in reversed(steps) for m in step]

    def delete_sync(self, response_id: str, tenant: str) -> bool:
        with contextlib.closing(self._connect()) as conn, conn:
            return conn.execute("DELETE FROM responses WHERE id = ? AND tenant = ?",
                                (response_id, tenant)).rowcount > 0

    # -- async (off the event loop) -------------------------------------------
    async def put(self, rec: ResponseRecord) -> None:
        await asyncio.to_thread(self.put_sync, rec)

    async def get(self, response_id: str, tenant: str) -> ResponseRecord | None:
        return await asyncio.to_thread(self.get_sync, response_id, tenant)

    async def conversation(self, response_id: str, tenant: str) -> tuple[ResponseRecord, list[dict[str, Any]]] | None:
        return await asyncio.to_thread(self.conversation_sync, response_id, tenant)

    async def delete(self, response_id: str, tenant: str) -> bool:
        return await asyncio.to_thread(self.delete_sync, response_id, tenant)
