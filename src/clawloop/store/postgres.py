"""PostgreSQL store: the `Store` protocol on a database server, so several gateway processes (one machine or
many) share turns, sessions, linking, judge verdicts, trainer cursors and tenants.

    store = open_store("postgresql://user@host:5432/clawloop")     # clawloop ... --store postgresql://...

It is the SQLite store's concerns (`turns.py`, `judgements.py`, `browse.py`: the same ops, the same reads) on
another connection: the SQL both engines speak is shared, and this module says the rest its own way (upserts,
`GREATEST`, `RETURNING id`, JSON arrays, integer buckets). The write path is the SQLite store's (`writer.py`):
one writer thread per process drains its queue into one transaction, retries a failed batch with backoff and
spills it to `spill.jsonl` in the local data dir when the server stays away, re-importing it when writes
work again. Prompts are stored once the same way (`chunks.py`: the same keys, so export and import are
unchanged). Tables: the SQLite store's, plus `answers` (capture's conversation map, `pg_linking.py`) and
three columns: `sessions.next_index` / `sessions.last_main` (the index a gateway reserves next, the session's
last main turn) and `turns.request_hash` / `turns.owner` (a retry is known by its request; a pending row by
the gateway that wrote it).

What changes with several writers, and how it stays correct:

- Judgement row ids in commit order. A trainer's cursor is the last judgement id it consumed, so an id
  must never commit after a larger one (it would be skipped). Every verdict insert takes one transaction-level
  advisory lock first (`JUDGEMENT_ORDER`): ids are drawn and committed in the same order, by any number of
  judge processes.
- Pending rows of live gateways are not aborted. Each store holds a session-level advisory lock on its own
  random `owner` key for its life; `abort_pending` (capture, at start) aborts only the pending rows whose
  owner's lock is free: that gateway is gone (PostgreSQL drops a dead client's locks).
- Deadlocks and serialization failures are the database's, not the op's: the batch is retried.
- The schema is created under an advisory lock: N gateways starting at once do not race `CREATE TABLE`.

Reads use one autocommit connection per thread (each read sees every commit), reconnected when broken.
`path` is None: a server has no local file, so captured images are not kept (README, Scaling). The driver is
psycopg 3 (`pip install 'clawloop[postgres]'`), imported only when a postgresql:// store is opened.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg  # the optional driver: store/__init__.py imports this module only for a postgresql:// store
from psycopg import errors as pgerrors
from psycopg.pq import TransactionStatus

from clawloop.records import TURN_MAIN, Judgement, Turn
from clawloop.store.browse import BrowseRows
from clawloop.store.chunks import SCHEMA as _UNUSED_SQLITE_CHUNKS  # noqa: F401  (the same table, said below)
from clawloop.store.chunks import Chunks
from clawloop.store.judgements import JudgementRows
from clawloop.store.schema import (FINISH_TURN, INSERT_TURN, JUDGEMENT_COLS, MIGRATIONS, PENDING, TURN_COLS, dumps,
                                   put_prompt, put_tools, reasoning_json, turn_values, versions_json)
from clawloop.store.turns import TurnRows
from clawloop.store.writer import OPS, SPILLABLE, SQLiteBase

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    key BYTEA PRIMARY KEY,
    parent BYTEA,
    data BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    choice_index INTEGER NOT NULL DEFAULT 0,
    type TEXT NOT NULL,
    messages TEXT NOT NULL,
    tools TEXT,
    prompt_ids TEXT NOT NULL,
    response_ids TEXT NOT NULL,
    response_logprobs TEXT NOT NULL,
    response_text TEXT NOT NULL,
    tool_calls TEXT,
    finish_reason TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    next_state TEXT,
    final INTEGER NOT NULL DEFAULT 0,
    trainable INTEGER NOT NULL DEFAULT 1,
    request_id TEXT NOT NULL DEFAULT '',
    created_at DOUBLE PRECISION NOT NULL,
    next_state_at DOUBLE PRECISION,
    response_versions TEXT,
    tenant TEXT,
    sampling TEXT,
    prompt_ref BYTEA,
    prompt_tail BYTEA,
    messages_ref BYTEA,
    tools_ref BYTEA,
    request_hash BYTEA,
    owner BIGINT,
    UNIQUE (session_id, idx, choice_index)
);
CREATE INDEX IF NOT EXISTS turns_ready ON turns (type, trainable, final, next_state_at);
CREATE INDEX IF NOT EXISTS turns_pending ON turns (finish_reason) WHERE finish_reason = 'pending';
CREATE TABLE IF NOT EXISTS judgements (
    id BIGSERIAL PRIMARY KEY,
    turn_id BIGINT NOT NULL,
    judge TEXT NOT NULL,
    score INTEGER NOT NULL,
    votes TEXT NOT NULL,
    hint TEXT,
    latency_s DOUBLE PRECISION NOT NULL,
    malformed INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    reward DOUBLE PRECISION,
    hints TEXT,
    UNIQUE (turn_id, judge)
);
CREATE INDEX IF NOT EXISTS judgements_judge ON judgements (judge, id);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    closed_at DOUBLE PRECISION,
    closed_reason TEXT,
    next_index INTEGER NOT NULL DEFAULT 0,
    last_main INTEGER
);
CREATE INDEX IF NOT EXISTS sessions_seen ON sessions (last_seen);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS answers (
    key BYTEA PRIMARY KEY,
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    seen DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS answers_seen ON answers (seen);
"""
# Judgements have no foreign key to turns: SQLite does not enforce its one either, and a spilled verdict
# replayed before its spilled turn must not fail.

# Advisory lock keys (one 64-bit space per database): two constants and, per store, a random owner key
# above them.
LINK_CONNECTIONS = 8
"""Linking connections a gateway process opens at most (`pg_linking`): claims and finishes of that many
requests run at once; more wait for one."""
SCHEMA_LOCK = 0x636C61770001
JUDGEMENT_ORDER = 0x636C61770002

INSERT_PG_TURN = INSERT_TURN.replace(") VALUES (", ", request_hash, owner) VALUES (").replace("?)", "?,?,?)")
FINISH_PG_TURN = (
    FINISH_TURN.replace("CASE WHEN ? THEN", "CASE WHEN ?::boolean THEN")
    .replace("final=MAX(final, ?)", "final=GREATEST(final, ?)")
    # an untrainable end (aborted) drops a next state held on its pending row: never linked to an aborted turn
    .replace("next_state=COALESCE(?, next_state), next_state_at=COALESCE(?, next_state_at)",
             "next_state=CASE WHEN ?::boolean THEN COALESCE(?, next_state) END, "
             "next_state_at=CASE WHEN ?::boolean THEN COALESCE(?, next_state_at) END")
    .replace("WHERE session_id=? AND idx=? AND choice_index=?", ", owner=NULL WHERE session_id=? AND idx=? AND choice_index=?")
)
PG_TYPES = {"BLOB": "BYTEA", "REAL": "DOUBLE PRECISION", "TEXT": "TEXT", "INTEGER": "BIGINT"}


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "postgresql://…"
    if p.password is None:
        return url
    host = p.hostname or ""
    netloc = f"{p.username}:***@{host}" + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


class PgConnection:
    """A psycopg connection in autocommit mode that speaks the SQLite store's dialect of placeholders
    (`?`), so the queries both engines share are written once. Transactions are explicit (`BEGIN` ...
    `COMMIT`), as the writer issues them."""

    _sql: dict[str, str] = {}

    def __init__(self, url: str, *, synchronous_commit: bool = True):
        self.raw = psycopg.connect(url, autocommit=True, connect_timeout=10)
        if not synchronous_commit:
            self.raw.execute("SET synchronous_commit = off")

    @classmethod
    def _q(cls, sql: str) -> str:
        q = cls._sql.get(sql)
        if q is None:
            q = cls._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return q

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        if not params:  # no placeholders to bind: the text goes as it is
            return self.raw.execute(sql)
        return self.raw.execute(self._q(sql), tuple(params))

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(self._q(sql), rows)

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @property
    def broken(self) -> bool:
        return self.raw.closed or self.raw.broken

    def commit(self) -> None:
        if self.in_transaction:
            self.raw.execute("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            self.raw.execute("ROLLBACK")

    def close(self) -> None:
        try:
            self.raw.close()
        except Exception:
            pass


class PgChunks(Chunks):
    INSERT = "INSERT INTO chunks (key, parent, data) VALUES (?,?,?) ON CONFLICT (key) DO NOTHING"


class PostgresBase(SQLiteBase):
    """The write path of `writer.py` over a PostgreSQL server: connections, the schema, the owner lock."""

    BEGIN_WRITE = "BEGIN"
    DATABASE_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, pgerrors.SerializationFailure,
                       pgerrors.DeadlockDetected, pgerrors.LockNotAvailable)
    OPS = OPS | {"close_shared", "close_idle", "prune_answers", "answers"}
    SPILLABLE = SPILLABLE | {"close_shared", "answers"}

    def __init__(self, url: str, *, spill_path: str | Path, max_queue: int = 10_000, high_water: float = 0.8,
                 retries: int = 5, backoff_s: float = 0.05):
        self.url = url
        self.path = None
        self.spill_path = Path(spill_path)
        self.spill_path.parent.mkdir(parents=True, exist_ok=True)
        self.max_queue = max(1, int(max_queue))
        self.high_water = max(1, int(self.max_queue * high_water))
        self.retries, self.backoff_s = retries, backoff_s
        self._local = threading.local()
        import queue

        self._q = queue.Queue(maxsize=self.max_queue)
        self._closed = self._degraded = self._spilled_here = self._spill_dirty = False
        self.failures = self.spilled = self.lost = self.reindexed = self.imported = 0
        self._said: dict[str, float] = {}
        self.chunks = PgChunks()
        self.owner = random.randrange(1 << 40, 1 << 62)
        """This store's key: its pending rows carry it, and it holds the advisory lock on it while open."""
        self._owner_conn = PgConnection(url)
        self._owner_conn.execute("SELECT pg_advisory_lock(?)", (self.owner,))
        conn = PgConnection(url)
        try:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
            conn.raw.execute(SCHEMA)
            for table, column, typ in MIGRATIONS:  # the SQLite store's later columns, the same names here
                conn.raw.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {PG_TYPES[typ]}")
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            self._owner_conn.close()
            raise
        self._link_mutex = threading.Lock()
        self._link_slots = threading.BoundedSemaphore(LINK_CONNECTIONS)
        self._link_idle: list[PgConnection] = []
        self._link_open: list[PgConnection] = []
        self._start_writer(conn)

    def _connect(self, factory: Any = None, busy_ms: int = 30000) -> PgConnection:  # noqa: ARG002
        return PgConnection(self.url)

    def _reader(self) -> PgConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.broken:
            conn = self._local.conn = PgConnection(self.url)
        return conn

    @staticmethod
    def _in_transaction(conn: Any) -> bool:
        return conn.in_transaction

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        with self._link_mutex:
            for c in self._link_open:
                c.close()
            self._link_open, self._link_idle = [], []
        try:  # released here, answered by the server: a close() is not seen a moment later by the server's backend
            self._owner_conn.execute("SELECT pg_advisory_unlock(?)", (self.owner,))
        except Exception:
            pass  # the connection is gone already: so is its lock
        self._owner_conn.close()


class PgRows(PostgresBase):
    """Where the SQL of `turns.py`, `judgements.py` and `browse.py` is SQLite's own, PostgreSQL's here."""

    # -- turns and sessions ------------------------------------------------------------
    def _touch_session(self, conn: Any, session_id: str, next_index: int = 0) -> None:
        now = time.time()
        conn.execute(
            "INSERT INTO sessions (session_id, created_at, last_seen, next_index) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET last_seen=EXCLUDED.last_seen, closed_at=NULL, closed_reason=NULL, "
            "next_index=GREATEST(sessions.next_index, EXCLUDED.next_index)",
            (session_id, now, now, next_index))

    def _insert_turn(self, conn: Any, t: Turn, values: tuple | None = None) -> int | None:
        values = values or turn_values(t, self.chunks, conn)
        row = conn.execute(INSERT_PG_TURN + " ON CONFLICT (session_id, idx, choice_index) DO NOTHING RETURNING id",
                           values + (None, self.owner if t.finish_reason == PENDING else None)).fetchone()
        return None if row is None else row[0]

    def _op_begin(self, conn: Any, a: dict[str, Any]) -> int | None:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id, t.index + 1)
        rid = self._insert_turn(conn, t)
        if rid is None and not a.get("replay"):
            log.warning("store: turn %d of session %r is taken; this request's row waits for its end",
                        t.index, t.session_id)
        return rid

    def _op_finish(self, conn: Any, a: dict[str, Any]) -> list[int]:
        turns: list[Turn] = a["turns"]
        key = a.get("key") or ""
        if turns:
            self._touch_session(conn, turns[0].session_id, turns[0].index + 1)
        return [self._store_turn(conn, t, key if t.choice_index == 0 else "", a.get("prompt_stored", False))
                for t in turns]

    def _op_add(self, conn: Any, a: dict[str, Any]) -> int:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id, t.index + 1)
        return self._store_turn(conn, t, "")

    def _store_turn(self, conn: Any, t: Turn, key: str, prompt_stored: bool = False) -> int:
        """`turns.py`'s `_store_turn` (complete the pending row, else insert; a taken index moves the turn
        to the session's next free one), with a conflict that aborts nothing."""
        if key or t.request_id:
            pref, ptail = (None, None) if prompt_stored else put_prompt(t, self.chunks, conn)
            tools, tref = put_tools(t, self.chunks, conn)
            keep = bool(t.trainable)
            row = conn.execute(FINISH_PG_TURN, (
                tools, tref, None if prompt_stored else "", prompt_stored, pref, prompt_stored, ptail,
                dumps(list(t.response_ids)), dumps(list(t.response_logprobs)), t.response_text, dumps(t.tool_calls),
                t.finish_reason, int(t.policy_version), keep, dumps(t.next_state), keep, t.next_state_at,
                int(t.final), int(t.trainable), t.request_id, t.created_at, versions_json(t), t.tenant or None,
                dumps(t.sampling), reasoning_json(t), t.session_id, t.index, t.choice_index, key or None, t.request_id,
            )).fetchall()
            if row:
                t.id = row[0][0]
                return t.id
        values = turn_values(t, self.chunks, conn)
        rid = self._insert_turn(conn, t, values)
        if rid is None:
            nxt = conn.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM turns WHERE session_id=?",
                               (t.session_id,)).fetchone()[0]
            log.warning("store: turn %d of session %r is taken by another request; stored as turn %d",
                        t.index, t.session_id, nxt)
            self.reindexed += 1
            t.index = nxt
            rid = self._insert_turn(conn, t, (values[0], nxt) + values[2:])
            self._touch_session(conn, t.session_id, nxt + 1)
        t.id = rid
        return rid

    def _op_abort_pending(self, conn: Any, a: dict[str, Any]) -> int:
        n = 0
        for (owner,) in conn.execute("SELECT DISTINCT owner FROM turns WHERE finish_reason=?", (PENDING,)).fetchall():
            if owner == self.owner:
                continue
            if owner is not None and not conn.execute("SELECT pg_try_advisory_xact_lock(?)", (owner,)).fetchone()[0]:
                continue  # its gateway is alive: those requests are running
            n += conn.execute("UPDATE turns SET finish_reason='abort', trainable=0 WHERE finish_reason=? "
                              "AND owner IS NOT DISTINCT FROM ?", (PENDING, owner)).rowcount
        return n

    def iter_sessions(self) -> Iterator[tuple[str, list[Turn]]]:
        ids = [r[0] for r in self._reader().execute(
            "SELECT session_id, MIN(id) AS first_id FROM turns GROUP BY session_id ORDER BY first_id").fetchall()]
        for sid in ids:
            yield sid, self.session_turns(sid)

    def max_policy_version(self) -> int | None:
        c = self._reader()
        top = c.execute("SELECT MAX(policy_version) FROM turns").fetchone()[0]
        mixed = c.execute("SELECT MAX(v::int) FROM turns t, jsonb_array_elements_text(t.response_versions::jsonb) v "
                          "WHERE t.response_versions IS NOT NULL").fetchone()[0]
        vs = [v for v in (top, mixed) if v is not None and v >= 0]
        return max(vs) if vs else None

    # -- judgements and cursors --------------------------------------------------------
    def _op_judgement(self, conn: Any, a: dict[str, Any]) -> bool:
        j: Judgement = a["judgement"]
        # ids drawn and committed in one order across processes: a trainer's cursor never skips one
        conn.execute("SELECT pg_advisory_xact_lock(?)", (JUDGEMENT_ORDER,))
        cur = conn.execute(
            f"INSERT INTO judgements ({JUDGEMENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (turn_id, judge) DO NOTHING",
            (j.turn_id, j.judge, int(j.score), json.dumps(j.votes), j.hint, float(j.latency_s),
             int(j.malformed), j.created_at, None if j.reward is None else float(j.reward),
             None if j.hint_candidates is None else json.dumps(list(j.hint_candidates))))
        return cur.rowcount == 1

    def _op_cursor(self, conn: Any, a: dict[str, Any]) -> None:
        keep = ("GREATEST(CAST(kv.value AS BIGINT), CAST(EXCLUDED.value AS BIGINT))::text" if a.get("replay")
                else "EXCLUDED.value")
        conn.execute(f"INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value={keep}",
                     (f"cursor:{a['name']}", str(int(a["value"]))))

    # -- the dashboard's counts ----------------------------------------------------------
    def _session_rows(self, ids: list[str], judge: str) -> list[dict[str, Any]]:
        if not ids:
            return []
        c = self._reader()
        info = {r[0]: r for r in c.execute(
            "SELECT session_id, created_at, last_seen, closed_at, closed_reason FROM sessions "
            "WHERE session_id = ANY(?)", (ids,)).fetchall()}
        counts = {r[0]: r[1:] for r in c.execute(
            "SELECT t.session_id, COUNT(DISTINCT t.idx), COUNT(*), SUM(CASE WHEN t.type=? THEN 1 ELSE 0 END), "
            "MAX(t.tenant), COUNT(j.score), SUM(CASE WHEN j.score>0 THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN j.score=0 THEN 1 ELSE 0 END), SUM(CASE WHEN j.score<0 THEN 1 ELSE 0 END), "
            "MAX(t.policy_version) FROM turns t LEFT JOIN judgements j ON j.turn_id=t.id AND j.judge=? "
            "WHERE t.session_id = ANY(?) GROUP BY t.session_id", (TURN_MAIN, judge, ids)).fetchall()}
        out = []
        for sid in ids:
            if sid not in info:
                continue
            _, created, seen, closed_at, reason = info[sid]
            turns, rows, main, tenant, judged, pos, zero, neg, version = counts.get(
                sid, (0, 0, 0, None, 0, 0, 0, 0, None))
            out.append({"session_id": sid, "created_at": created, "last_seen": seen, "closed_at": closed_at,
                        "closed_reason": reason, "tenant": tenant or "", "turns": turns, "rows": rows,
                        "main_turns": main or 0, "judged": judged or 0, "score_pos": pos or 0,
                        "score_zero": zero or 0, "score_neg": neg or 0, "last_version": version})
        return out

    def judgement_counts(self, since: float, bucket_s: float, *, judge: str,
                         limit: int = 2000) -> list[dict[str, Any]]:
        bucket_s = max(1e-3, float(bucket_s))
        rows = self._reader().execute(
            "SELECT CAST(FLOOR(created_at / ?) AS BIGINT) AS b, SUM(CASE WHEN score>0 THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN score=0 THEN 1 ELSE 0 END), SUM(CASE WHEN score<0 THEN 1 ELSE 0 END) FROM judgements "
            "WHERE created_at>=? AND judge=? GROUP BY b ORDER BY b DESC LIMIT ?",
            (bucket_s, float(since), judge, max(1, int(limit)))).fetchall()
        return [{"t": b * bucket_s, "pos": pos, "zero": zero, "neg": neg} for b, pos, zero, neg in reversed(rows)]

    def stats(self) -> dict[str, int | float]:
        c = self._reader()
        turns, main, side = c.execute("SELECT COUNT(*), SUM(CASE WHEN type='main' THEN 1 ELSE 0 END), "
                                      "SUM(CASE WHEN type='side' THEN 1 ELSE 0 END) FROM turns").fetchone()
        judged = c.execute("SELECT COUNT(*) FROM judgements").fetchone()[0]
        sessions, open_ = c.execute("SELECT COUNT(*), SUM(CASE WHEN closed_at IS NULL THEN 1 ELSE 0 END) "
                                    "FROM sessions").fetchone()
        return {"turns": turns or 0, "main_turns": main or 0, "side_turns": side or 0, "judgements": judged or 0,
                "sessions": sessions or 0, "open_sessions": open_ or 0, **self.write_stats()}


# The composed store is in pg_linking.py (PostgresStore: these rows plus the shared-session ops).
__all__ = ["PgRows", "PgConnection", "PostgresBase", "redact", "TurnRows", "JudgementRows", "BrowseRows", "TURN_COLS"]
