"""What the turns of one conversation repeat, stored once: prompt ids, request messages and tools.

Why: an agent resends its whole conversation every turn (OpenClaw's default prompt is a 28 k-token
system prompt and tool schemas, then every earlier turn), so a store that keeps each turn's prompt as it
came grows with the square of the conversation: turn 20 of such a session repeats ~29 k ids and ~45 k
characters of messages that turns 0..19 already hold.

How: content addressing with chains, as a prefix cache hashes its KV blocks. A prompt is cut into
CHUNK-id pieces from its start; each piece is a node keyed by a hash of its parent's key and its own
ids, so the key of a piece names the whole prefix up to it. Two prompts that share a prefix (the next
turn of a session, or another session with the same system prompt) share its nodes; a turn keeps the
key of its last whole piece and the ids after it (fewer than CHUNK) inline. Messages are chained the
same way, one node per message; tools (the same list every turn) are one node. So a turn adds its new
ids and messages, one partial piece and three keys, however long its conversation is. Nodes are
immutable (a key names its content), so reads are cached without invalidation; a node is never
deleted (one an abandoned request left behind costs its bytes, nothing else).

Used by `schema.py` (row <-> record) on the writer thread and the readers; nothing else knows it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import threading
from array import array
from collections import OrderedDict
from typing import Any

CHUNK = 256
"""Prompt ids per chained piece: a turn rewrites at most this many ids of a prefix it shares (its tail),
and a 28 k-token prompt is ~110 nodes to read back."""

# A rowid table, not WITHOUT ROWID: there a row past ~1 KB (a 256-id piece and its two keys) spills to
# an overflow page of its own, and the pieces took four times their bytes (measured).
SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    key BLOB NOT NULL UNIQUE,
    parent BLOB,
    data BLOB NOT NULL
);
"""

_IDS, _MSG, _TOOLS = b"i", b"m", b"t"  # hash domains: an id piece never collides with a message


def _key(kind: bytes, parent: bytes | None, data: bytes) -> bytes:
    h = hashlib.blake2b(kind, digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update(data)
    return h.digest()


def pack_ids(ids: list[int] | array) -> bytes:
    """Token ids as one width byte and little-endian uint16 (every id < 65 536: the tiny model's, 32 k
    vocabularies) or int32 (larger ones): 2 or 4 bytes an id, where JSON takes ~5-7."""
    a = array("H" if all(0 <= i < 65536 for i in ids) else "i", ids)
    if sys.byteorder == "big":
        a.byteswap()
    return bytes((a.itemsize,)) + a.tobytes()


def unpack_ids(data: bytes) -> array:
    a = array({2: "H", 4: "i"}[data[0]])
    a.frombytes(data[1:])
    if sys.byteorder == "big":
        a.byteswap()
    return a


class Chunks:
    """Writes and reads of the `chunks` table, with a bounded cache of the chains read (content
    addressed, so a cached chain is never stale). One per store; safe across threads."""

    INSERT = "INSERT OR IGNORE INTO chunks (key, parent, data) VALUES (?,?,?)"
    """A node, unless its key is there (the PostgreSQL store says it its own way: `ON CONFLICT DO NOTHING`)."""

    def __init__(self, cache: int = 64):
        self._cache: OrderedDict[bytes, tuple] = OrderedDict()
        self._cache_size = cache
        self._lock = threading.Lock()

    # -- writes (on the writer thread, inside the batch's transaction) -------------------------
    def put_ids(self, conn: sqlite3.Connection, ids: list[int]) -> tuple[bytes | None, bytes]:
        """Store the whole CHUNK-id pieces of `ids`; (key of the last one or None, the rest packed)."""
        whole = len(ids) - len(ids) % CHUNK
        parent: bytes | None = None
        rows = []
        for a in range(0, whole, CHUNK):
            data = pack_ids(ids[a:a + CHUNK])
            key = _key(_IDS, parent, data)
            rows.append((key, parent, data))
            parent = key
        if rows:
            conn.executemany(self.INSERT, rows)
        return parent, pack_ids(ids[whole:])

    def put_messages(self, conn: sqlite3.Connection, messages: list[dict[str, Any]]) -> bytes | None:
        """Store each message as a chained node; the last node's key (None for no messages)."""
        parent: bytes | None = None
        rows = []
        for m in messages:
            data = json.dumps(m).encode()
            key = _key(_MSG, parent, data)
            rows.append((key, parent, data))
            parent = key
        if rows:
            conn.executemany(self.INSERT, rows)
        return parent

    def put_tools(self, conn: sqlite3.Connection, tools_json: str) -> bytes:
        data = tools_json.encode()
        key = _key(_TOOLS, None, data)
        conn.execute(self.INSERT, (key, None, data))
        return key

    # -- reads ------------------------------------------------------------------------------
    def _chain(self, conn: sqlite3.Connection, key: bytes) -> tuple:
        """The data of `key`'s chain, root first (cached)."""
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        rows = conn.execute(
            "WITH RECURSIVE c(key, parent, data, n) AS ("
            " SELECT key, parent, data, 0 FROM chunks WHERE key=?"
            " UNION ALL SELECT k.key, k.parent, k.data, c.n + 1 FROM chunks k JOIN c ON k.key = c.parent)"
            " SELECT parent, data FROM c ORDER BY n DESC", (key,)).fetchall()
        if not rows or rows[0][0] is not None:  # a node missing: never hand back a shortened prompt
            raise LookupError(f"store: chunk chain {key.hex()} is incomplete ({len(rows)} node(s) found)")
        chain = tuple(bytes(r[1]) for r in rows)
        with self._lock:
            self._cache[key] = chain
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return chain

    def ids(self, conn: sqlite3.Connection, key: bytes | None, tail: bytes) -> list[int]:
        out: list[int] = []
        for piece in (self._chain(conn, key) if key is not None else ()):
            out.extend(unpack_ids(piece).tolist())
        out.extend(unpack_ids(bytes(tail)).tolist())
        return out

    def messages(self, conn: sqlite3.Connection, key: bytes) -> list[dict[str, Any]]:
        return [json.loads(d) for d in self._chain(conn, key)]

    def tools(self, conn: sqlite3.Connection, key: bytes) -> Any:
        return json.loads(self._chain(conn, key)[0])
