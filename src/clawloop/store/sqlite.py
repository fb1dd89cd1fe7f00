"""SQLite store: turns, judgements, sessions and cursors in one WAL-mode file.

Writes go through one writer thread with its own connection, so the gateway
never waits on the disk: it enqueues and moves on. The writer drains whatever
is queued into a single transaction, which is what makes it fast. Reads use a
connection per thread (WAL lets them run beside the writer). `flush()` waits
until everything enqueued so far is committed.

Run standalone only through the CLI (`clawloop export`, `clawloop import`).
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any, Callable, Iterator

from clawloop.records import TURN_MAIN, Judgement, Turn

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
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
    created_at REAL NOT NULL,
    next_state_at REAL,
    response_versions TEXT,
    UNIQUE (session_id, idx, choice_index)
);
CREATE INDEX IF NOT EXISTS turns_session ON turns (session_id, idx);
CREATE INDEX IF NOT EXISTS turns_ready ON turns (type, trainable, final, next_state_at);
CREATE TABLE IF NOT EXISTS judgements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id INTEGER NOT NULL REFERENCES turns(id),
    judge TEXT NOT NULL,
    score INTEGER NOT NULL,
    votes TEXT NOT NULL,
    hint TEXT,
    latency_s REAL NOT NULL,
    malformed INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (turn_id, judge)
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    closed_at REAL,
    closed_reason TEXT
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Columns added after a store file may already exist: (table, column, type). A file written by an
# older clawloop gets them with ALTER TABLE when it is opened; their old rows read as NULL.
MIGRATIONS = (
    ("turns", "response_versions", "TEXT"),
)

_TURN_COLS = (
    "id, session_id, idx, choice_index, type, messages, tools, prompt_ids, response_ids, "
    "response_logprobs, response_text, tool_calls, finish_reason, policy_version, next_state, "
    "final, trainable, request_id, created_at, next_state_at, response_versions"
)


def _dumps(x: Any) -> str | None:
    return None if x is None else json.dumps(x, separators=(",", ":"))


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _row_to_turn(r: sqlite3.Row | tuple) -> Turn:
    (id_, sid, idx, choice, typ, msgs, tools, pids, rids, rlps, text, tcs, fin, ver, ns,
     final, trainable, req, created, ns_at, rvers) = r
    return Turn(
        id=id_, session_id=sid, index=idx, choice_index=choice, type=typ,
        messages=json.loads(msgs), tools=_loads(tools), prompt_ids=json.loads(pids),
        response_ids=json.loads(rids), response_logprobs=json.loads(rlps),
        response_text=text, tool_calls=_loads(tcs), finish_reason=fin, policy_version=ver,
        next_state=_loads(ns), final=bool(final), trainable=bool(trainable), request_id=req,
        created_at=created, next_state_at=ns_at, response_versions=_loads(rvers),
    )


def _migrate(conn: sqlite3.Connection) -> None:
    """Add the MIGRATIONS columns a store file lacks. Two processes may open one old file at once
    (`clawloop up` and `clawloop train`): the loser of that race finds the column there and moves on."""
    for table, column, typ in MIGRATIONS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column in have:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {typ}")
        except sqlite3.OperationalError as e:
            if "duplicate column" not in str(e).lower():
                raise


def _row_to_judgement(r: tuple) -> Judgement:
    turn_id, judge, score, votes, hint, latency, malformed, created = r
    return Judgement(turn_id=turn_id, judge=judge, score=score, votes=json.loads(votes),
                     hint=hint, latency_s=latency, malformed=malformed, created_at=created)


class Store:
    """One SQLite file under the data dir. Thread-safe; one writer thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._q: queue.Queue[tuple[Callable[[sqlite3.Connection], Any], Future] | None] = queue.Queue()
        self._closed = False
        conn = self._connect()
        conn.executescript(SCHEMA)
        _migrate(conn)
        conn.commit()
        self._writer_conn: sqlite3.Connection | None = None
        self._writer = threading.Thread(target=self._write_loop, name="clawloop-store-writer", daemon=True)
        self._writer.start()

    # -- connections -------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def _write_loop(self) -> None:
        conn = self._connect()
        self._writer_conn = conn
        while True:
            item = self._q.get()
            batch = [item]
            # Drain what is already queued into the same transaction.
            while True:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is None for b in batch)
            jobs = [b for b in batch if b is not None]
            results: list[tuple[Future, Any, BaseException | None]] = []
            try:
                conn.execute("BEGIN IMMEDIATE")
                for fn, fut in jobs:
                    try:
                        conn.execute("SAVEPOINT job")
                        res = fn(conn)
                        conn.execute("RELEASE job")
                        results.append((fut, res, None))
                    except Exception as e:  # one bad write must not lose the others
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                        results.append((fut, None, e))
                conn.execute("COMMIT")
            except Exception as e:
                conn.rollback()
                results = [(fut, None, e) for _, fut in jobs]
            for fut, res, err in results:
                try:  # a caller may have cancelled its future; the write still happened
                    if err is not None:
                        fut.set_exception(err)
                    else:
                        fut.set_result(res)
                except InvalidStateError:
                    pass
            if stop:
                conn.close()
                return

    def _submit(self, fn: Callable[[sqlite3.Connection], Any]) -> Future:
        if self._closed:
            raise RuntimeError("store is closed")
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut

    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every write enqueued before this call is committed."""
        self._submit(lambda conn: None).result(timeout)

    def pending_writes(self) -> int:
        return self._q.qsize()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._q.put(None)
        self._writer.join(timeout=30)

    # -- turns ---------------------------------------------------------------
    def add_turn(self, turn: Turn) -> Future:
        """Enqueue a turn; the future resolves to its row id."""

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            conn.execute(
                "INSERT INTO sessions (session_id, created_at, last_seen) VALUES (?, ?, ?) "
                "ON CONFLICT(session_id) DO UPDATE SET last_seen=excluded.last_seen, "
                "closed_at=NULL, closed_reason=NULL",
                (turn.session_id, now, now),
            )
            cur = conn.execute(
                f"INSERT INTO turns ({_TURN_COLS.removeprefix('id, ')}) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    turn.session_id, turn.index, turn.choice_index, turn.type,
                    json.dumps(turn.messages), _dumps(turn.tools), _dumps(list(turn.prompt_ids)),
                    _dumps(list(turn.response_ids)), _dumps(list(turn.response_logprobs)),
                    turn.response_text, _dumps(turn.tool_calls), turn.finish_reason,
                    int(turn.policy_version), _dumps(turn.next_state), int(turn.final),
                    int(turn.trainable), turn.request_id, turn.created_at, turn.next_state_at,
                    _dumps(None if turn.response_versions is None else [int(v) for v in turn.response_versions]),
                ),
            )
            turn.id = cur.lastrowid
            return cur.lastrowid

        return self._submit(op)

    def set_next_state(self, session_id: str, index: int, next_state: dict[str, Any],
                       response_text: str | None = None) -> Future:
        """Attach the next state to turn `index` of a session.

        With n > 1 choices, the one whose text the client echoed back
        (`response_text`) gets it; if none matches, choice 0 does.
        """

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            payload = json.dumps(next_state)
            n = 0
            if response_text is not None:
                n = conn.execute(
                    "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                    "AND response_text=? AND next_state IS NULL",
                    (payload, now, session_id, index, response_text),
                ).rowcount
            if n == 0:
                n = conn.execute(
                    "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                    "AND choice_index=0 AND next_state IS NULL",
                    (payload, now, session_id, index),
                ).rowcount
            return n

        return self._submit(op)

    def close_session(self, session_id: str, reason: str, last_main_index: int | None) -> Future:
        """Mark a session closed and its last main turn final (judge it without next state)."""

        def op(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute(
                "UPDATE sessions SET closed_at=?, closed_reason=? WHERE session_id=?",
                (now, reason, session_id),
            )
            if last_main_index is not None:
                conn.execute(
                    "UPDATE turns SET final=1 WHERE session_id=? AND idx=?",
                    (session_id, last_main_index),
                )

        return self._submit(op)

    def get_turn(self, turn_id: int) -> Turn | None:
        r = self._reader().execute(f"SELECT {_TURN_COLS} FROM turns WHERE id=?", (turn_id,)).fetchone()
        return _row_to_turn(r) if r else None

    def session_turns(self, session_id: str) -> list[Turn]:
        rows = self._reader().execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE session_id=? ORDER BY idx, choice_index",
            (session_id,),
        ).fetchall()
        return [_row_to_turn(r) for r in rows]

    def iter_sessions(self) -> Iterator[tuple[str, list[Turn]]]:
        """Every session with its turns, oldest session first."""
        ids = [r[0] for r in self._reader().execute(
            "SELECT session_id, MIN(id) AS first FROM turns GROUP BY session_id ORDER BY first"
        ).fetchall()]
        for sid in ids:
            yield sid, self.session_turns(sid)

    def session_state(self) -> list[dict[str, Any]]:
        """Open sessions with their last turn index, last main turn index, and that
        index again as `pending_main_index` if the turn still waits for its next
        state (to rebuild capture state on restart)."""
        rows = self._reader().execute(
            "SELECT s.session_id, s.last_seen, "
            "(SELECT MAX(idx) FROM turns t WHERE t.session_id=s.session_id), "
            "(SELECT MAX(idx) FROM turns t WHERE t.session_id=s.session_id AND t.type=? AND t.trainable=1) "
            "FROM sessions s WHERE s.closed_at IS NULL",
            (TURN_MAIN,),
        ).fetchall()
        out = []
        for sid, ls, li, lm in rows:
            pending = None
            if lm is not None:
                waiting = self._reader().execute(
                    "SELECT COUNT(*) FROM turns WHERE session_id=? AND idx=? AND next_state IS NULL",
                    (sid, lm)).fetchone()[0]
                pending = lm if waiting else None
            out.append({"session_id": sid, "last_seen": ls, "last_index": li, "last_main_index": lm,
                        "pending_main_index": pending})
        return out

    # -- judging ------------------------------------------------------------
    def turns_to_judge(self, judge: str, limit: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[Turn]:
        """Main, trainable turns whose next state arrived (or session closed) and that
        `judge` has not scored yet, oldest first."""
        rows = self._reader().execute(
            f"SELECT {_TURN_COLS} FROM turns t WHERE t.type=? AND t.trainable=1 "
            "AND (t.next_state IS NOT NULL OR t.final=1) "
            "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.turn_id=t.id AND j.judge=?) "
            "ORDER BY t.id LIMIT ?",
            (TURN_MAIN, judge, limit + len(exclude)),
        ).fetchall()
        turns = [_row_to_turn(r) for r in rows if r[0] not in exclude]
        return turns[:limit]

    def count_pending_judgement(self, judge: str) -> int:
        return self._reader().execute(
            "SELECT COUNT(*) FROM turns t WHERE t.type=? AND t.trainable=1 "
            "AND (t.next_state IS NOT NULL OR t.final=1) "
            "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.turn_id=t.id AND j.judge=?)",
            (TURN_MAIN, judge),
        ).fetchone()[0]

    def save_judgement(self, j: Judgement) -> Future:
        """Store a verdict; a second verdict for the same (turn, judge) is ignored."""

        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT OR IGNORE INTO judgements (turn_id, judge, score, votes, hint, latency_s, "
                "malformed, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (j.turn_id, j.judge, int(j.score), json.dumps(j.votes), j.hint, float(j.latency_s),
                 int(j.malformed), j.created_at),
            )
            return cur.rowcount == 1

        return self._submit(op)

    def get_judgement(self, turn_id: int, judge: str) -> Judgement | None:
        r = self._reader().execute(
            "SELECT turn_id, judge, score, votes, hint, latency_s, malformed, created_at "
            "FROM judgements WHERE turn_id=? AND judge=?",
            (turn_id, judge),
        ).fetchone()
        return _row_to_judgement(r) if r else None

    def judged_turns(self, judge: str, after_id: int, limit: int) -> list[tuple[int, Turn, Judgement]]:
        """(judgement row id, turn, judgement) with judgement id > after_id, in order.

        The trainer keeps the last id it consumed as its cursor (see get_cursor)."""
        rows = self._reader().execute(
            "SELECT j.id, j.turn_id, j.judge, j.score, j.votes, j.hint, j.latency_s, j.malformed, "
            f"j.created_at, {', '.join('t.' + c.strip() for c in _TURN_COLS.split(','))} "
            "FROM judgements j JOIN turns t ON t.id=j.turn_id "
            "WHERE j.judge=? AND j.id>? ORDER BY j.id LIMIT ?",
            (judge, after_id, limit),
        ).fetchall()
        return [(r[0], _row_to_turn(r[9:]), _row_to_judgement(r[1:9])) for r in rows]

    # -- cursors and counters --------------------------------------------
    def get_cursor(self, name: str, default: int = 0) -> int:
        r = self._reader().execute("SELECT value FROM kv WHERE key=?", (f"cursor:{name}",)).fetchone()
        return int(r[0]) if r else default

    def set_cursor(self, name: str, value: int) -> Future:
        return self._submit(lambda conn: conn.execute(
            "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (f"cursor:{name}", str(int(value))),
        ))

    def stats(self) -> dict[str, int]:
        c = self._reader()
        turns, main, side = c.execute(
            "SELECT COUNT(*), SUM(type='main'), SUM(type='side') FROM turns"
        ).fetchone()
        judged = c.execute("SELECT COUNT(*) FROM judgements").fetchone()[0]
        sessions, open_ = c.execute(
            "SELECT COUNT(*), SUM(closed_at IS NULL) FROM sessions"
        ).fetchone()
        return {
            "turns": turns or 0, "main_turns": main or 0, "side_turns": side or 0,
            "judgements": judged or 0, "sessions": sessions or 0, "open_sessions": open_ or 0,
        }
