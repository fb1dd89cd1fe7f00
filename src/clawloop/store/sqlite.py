"""SQLite store: turns, judgements, sessions and cursors in one WAL-mode file.

Writes go through one writer thread with its own connection, so the gateway
never waits on the disk: it enqueues and moves on. The writer drains whatever
is queued into a single transaction, which is what makes it fast. Reads use a
connection per thread (WAL lets them run beside the writer). `flush()` waits
until everything enqueued so far is committed (or spilled, below).

Nothing is lost silently. Every write is a named op (`begin`, `finish`,
`next_state`, `close`, `judgement`, ...) whose outcome the writer checks: a
batch that fails (SQLITE_BUSY from a `clawloop judge`/`train` process beside
us, a full disk, a read-only file) is retried with exponential backoff; if it
still fails, its ops are appended as JSON lines to `spill.jsonl` beside the
database (whole lines under an exclusive lock, fsync'd) and counted
(`capture/store_failures`, `capture/spilled`). The spill file is re-imported
when a store is next opened, and by the writer as soon as the database takes
writes again. Every op is idempotent, so an op applied twice (a crash between
a re-import's commit and the truncation of the spill file) changes nothing.

The writer queue is bounded (`max_queue` ops): past it an op is spilled at
once by the caller instead of waiting, and `overloaded()` (the queue past its
high-water mark) tells the gateway to answer 429 before that happens.

A turn is written twice: a `pending` row when its request begins (the prompt
and the request, `finish_reason='pending'`, untrainable) and the response
when it ends. A `kill -9` therefore loses at most the tokens of the answers
being generated; `abort_pending()` (run by capture at start) marks such rows
`abort`, still untrainable, rather than dropping them.

Run standalone only through the CLI (`clawloop export`, `clawloop import`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any, Iterator

from clawloop.records import TURN_MAIN, Judgement, Turn

log = logging.getLogger(__name__)

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
    tenant TEXT,
    sampling TEXT,
    UNIQUE (session_id, idx, choice_index)
);
CREATE INDEX IF NOT EXISTS turns_session ON turns (session_id, idx);
CREATE INDEX IF NOT EXISTS turns_ready ON turns (type, trainable, final, next_state_at);
CREATE INDEX IF NOT EXISTS turns_pending ON turns (finish_reason) WHERE finish_reason = 'pending';
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
    ("turns", "tenant", "TEXT"),
    ("turns", "sampling", "TEXT"),
    ("judgements", "reward", "REAL"),  # a judge's continuous reward (Judgement.reward); NULL: the score
    ("judgements", "hints", "TEXT"),  # JSON list, Judgement.hint_candidates; NULL: `hint` is the only one
)
# Indexes over migrated columns would go here; the partial pending index only needs finish_reason.

PENDING = "pending"
"""`finish_reason` of a turn whose request began and whose response is not stored yet."""
ABORT = "abort"

_TURN_COLS = (
    "id, session_id, idx, choice_index, type, messages, tools, prompt_ids, response_ids, "
    "response_logprobs, response_text, tool_calls, finish_reason, policy_version, next_state, "
    "final, trainable, request_id, created_at, next_state_at, response_versions, tenant, sampling"
)
_INSERT_TURN = (f"INSERT INTO turns ({_TURN_COLS.removeprefix('id, ')}) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
# What a turn's end writes over its pending row (everything the begin did not know). The row is found
# by its request key (also once a restart marked it aborted: a spilled end replayed later completes it),
# or, replaying the same end twice, by the turn's own request id.
_FINISH_TURN = (
    "UPDATE turns SET tools=?, prompt_ids=COALESCE(?, prompt_ids), response_ids=?, response_logprobs=?, "
    "response_text=?, tool_calls=?, finish_reason=?, policy_version=?, next_state=COALESCE(?, next_state), "
    "next_state_at=COALESCE(?, next_state_at), final=MAX(final, ?), trainable=?, request_id=?, created_at=?, "
    "response_versions=?, tenant=?, sampling=? "
    "WHERE session_id=? AND idx=? AND choice_index=? "
    "AND ((finish_reason IN ('pending', 'abort') AND request_id=?) OR (request_id<>'' AND request_id=?)) RETURNING id"
)

SPILL_NAME = "spill.jsonl"


def _dumps(x: Any) -> str | None:
    return None if x is None else json.dumps(x, separators=(",", ":"))


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _row_to_turn(r: sqlite3.Row | tuple) -> Turn:
    (id_, sid, idx, choice, typ, msgs, tools, pids, rids, rlps, text, tcs, fin, ver, ns,
     final, trainable, req, created, ns_at, rvers, tenant, sampling) = r
    return Turn(
        id=id_, session_id=sid, index=idx, choice_index=choice, type=typ,
        messages=json.loads(msgs), tools=_loads(tools), prompt_ids=json.loads(pids),
        response_ids=json.loads(rids), response_logprobs=json.loads(rlps),
        response_text=text, tool_calls=_loads(tcs), finish_reason=fin, policy_version=ver,
        next_state=_loads(ns), final=bool(final), trainable=bool(trainable), request_id=req,
        created_at=created, next_state_at=ns_at, response_versions=_loads(rvers),
        tenant=tenant or "", sampling=_loads(sampling),
    )


def _turn_values(t: Turn) -> tuple:
    return (
        t.session_id, t.index, t.choice_index, t.type, json.dumps(t.messages), _dumps(t.tools),
        _dumps(list(t.prompt_ids)), _dumps(list(t.response_ids)), _dumps(list(t.response_logprobs)),
        t.response_text, _dumps(t.tool_calls), t.finish_reason, int(t.policy_version), _dumps(t.next_state),
        int(t.final), int(t.trainable), t.request_id, t.created_at, t.next_state_at, _versions(t),
        t.tenant or None, _dumps(t.sampling),
    )


def _versions(t: Turn) -> str | None:
    return _dumps(None if t.response_versions is None else [int(v) for v in t.response_versions])


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


_JUDGEMENT_COLS = "turn_id, judge, score, votes, hint, latency_s, malformed, created_at, reward, hints"
_N_JUDGEMENT_COLS = len(_JUDGEMENT_COLS.split(","))


def _row_to_judgement(r: tuple) -> Judgement:
    turn_id, judge, score, votes, hint, latency, malformed, created, reward, hints = r
    return Judgement(turn_id=turn_id, judge=judge, score=score, votes=json.loads(votes),
                     hint=hint, latency_s=latency, malformed=malformed, created_at=created,
                     reward=None if reward is None else float(reward),
                     hint_candidates=None if hints is None else json.loads(hints))


# -- spill records -------------------------------------------------------------
def _encode(x: Any) -> Any:
    if isinstance(x, Turn):
        d = x.to_dict()
        d["id"] = None
        return {"__turn__": d}
    if isinstance(x, Judgement):
        return {"__judgement__": x.to_dict()}
    raise TypeError(f"cannot spill {type(x).__name__}")


def _decode(d: dict[str, Any]) -> Any:
    if "__turn__" in d:
        return Turn(**d["__turn__"])
    if "__judgement__" in d:
        return Judgement(**d["__judgement__"])
    return d


class _Job:
    __slots__ = ("kind", "args", "fut")

    def __init__(self, kind: str, args: dict[str, Any]):
        self.kind, self.args, self.fut = kind, args, Future()


def _resolve(fut: Future, result: Any) -> None:
    try:  # a caller may have cancelled its future; the write still happened
        fut.set_result(result)
    except InvalidStateError:
        pass


class Store:
    """One SQLite file under the data dir. Thread-safe; one writer thread.

    `max_queue`: ops the writer queue holds before callers spill instead (never block the
    event loop); `overloaded()` is True past `high_water` of it. `retries` / `backoff_s`: a
    failed batch is retried that many times, waiting backoff_s, 2x, 4x ... (at most 2 s)
    between tries, before its ops are spilled. `spill_path`: default `spill.jsonl` beside
    the database file."""

    writer_connection_factory: type[sqlite3.Connection] = sqlite3.Connection
    """The writer's connection class (`sqlite3.connect(factory=...)`); tests swap in one that fails."""

    def __init__(self, path: str | Path, *, max_queue: int = 10_000, high_water: float = 0.8,
                 retries: int = 5, backoff_s: float = 0.05, spill_path: str | Path | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.spill_path = Path(spill_path) if spill_path is not None else self.path.with_name(SPILL_NAME)
        self.max_queue = max(1, int(max_queue))
        self.high_water = max(1, int(self.max_queue * high_water))
        self.retries = retries
        self.backoff_s = backoff_s
        self._local = threading.local()
        self._q: queue.Queue[_Job | None] = queue.Queue(maxsize=self.max_queue)
        self._closed = False
        self._degraded = False
        """The last batch was spilled: try the next one once, and spill at once if it fails too."""
        self._spilled_here = False
        """Something was spilled since the last re-import: re-import as soon as writes work."""
        self._spill_dirty = False
        """A caller appended to the spill file without fsync (queue full); the writer syncs it."""
        self.failures = 0
        self.spilled = 0
        self.lost = 0
        self.reindexed = 0
        self.imported = 0
        self._said: dict[str, float] = {}
        conn = self._connect()
        conn.executescript(SCHEMA)
        _migrate(conn)
        conn.commit()
        try:
            self._import_spill(conn)
        except Exception:
            log.exception("store: re-importing %s failed; its lines stay there for the next start", self.spill_path)
        finally:
            conn.close()
        self._writer = threading.Thread(target=self._write_loop, name="clawloop-store-writer", daemon=True)
        self._writer.start()

    # -- connections -------------------------------------------------------
    def _connect(self, factory: type[sqlite3.Connection] = sqlite3.Connection,
                 busy_ms: int = 30000) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=busy_ms / 1000, check_same_thread=False, factory=factory)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    # -- the writer ----------------------------------------------------------
    def _write_loop(self) -> None:
        conn: sqlite3.Connection | None = None
        while True:
            batch = [self._q.get()]
            while True:  # drain what is already queued into the same transaction
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            jobs = [b for b in batch if b is not None]
            if jobs:
                conn = self._write_batch(conn, jobs)
            if self._spill_dirty:
                self._sync_spill()
            if len(jobs) < len(batch):
                if conn is not None:
                    conn.close()
                return

    def _write_batch(self, conn: sqlite3.Connection | None, jobs: list[_Job]) -> sqlite3.Connection | None:
        """Commit `jobs` in one transaction, retrying with backoff; spill them when that fails."""
        tries = 1 if self._degraded else 1 + self.retries
        err: BaseException | None = None
        for attempt in range(tries):
            if attempt:
                time.sleep(min(2.0, self.backoff_s * 2 ** (attempt - 1)))
            try:
                if conn is None:  # a short busy timeout: the retries with backoff do the waiting
                    conn = self._connect(self.writer_connection_factory, busy_ms=2000)
                results = self._apply(conn, jobs)
            except Exception as e:  # BUSY past the timeout, a full disk, a read-only file, I/O
                err = e
                self.failures += 1
                conn = self._after_failure(conn)
                if self._say("write-failed"):
                    log.warning("store: write of %d op(s) failed (try %d/%d): %s", len(jobs), attempt + 1, tries, e)
                continue
            self._degraded = False
            failed = [(job, e) for job, _, e in results if e is not None]
            if failed:
                self.failures += len(failed)
                for job, e in failed:
                    log.error("store: %s op failed: %s; spilling it", job.kind, e)
                self._spill([job for job, _ in failed], retry_soon=False)  # the same op would fail again
            if self._spilled_here:  # writes work again: bring back what was spilled (before the futures resolve)
                self._spilled_here = False
                try:
                    self._import_spill(conn)
                except Exception as e:
                    log.warning("store: re-importing %s failed (%s); it stays for the next start", self.spill_path, e)
            for job, res, e in results:
                _resolve(job.fut, res if e is None else self._spilled_result(job))
            return conn
        self._degraded = True
        if self._say("spilling"):
            log.error("store: %d op(s) could not be written after %d tries (%s); spilling them to %s "
                      "(%d spilled so far)", len(jobs), tries, err, self.spill_path, self.spilled + len(jobs))
        self._spill(jobs)
        for job in jobs:
            _resolve(job.fut, self._spilled_result(job))
        return conn

    def _apply(self, conn: sqlite3.Connection, jobs: list[_Job]) -> list[tuple[_Job, Any, BaseException | None]]:
        results: list[tuple[_Job, Any, BaseException | None]] = []
        conn.execute("BEGIN IMMEDIATE")
        for job in jobs:
            try:
                conn.execute("SAVEPOINT job")
                res = _OPS[job.kind](self, conn, job.args)
                conn.execute("RELEASE job")
                results.append((job, res, None))
            except sqlite3.OperationalError:  # the database (locked, read-only, full, I/O), not the op: retry all
                raise
            except Exception as e:  # one bad op must not lose the others
                if not conn.in_transaction:  # SQLite rolled the whole transaction back
                    raise
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                results.append((job, None, e))
        conn.execute("COMMIT")
        return results

    def _after_failure(self, conn: sqlite3.Connection | None) -> sqlite3.Connection | None:
        """Roll back what the failed try left; drop the connection so the next try opens a fresh one."""
        if conn is None:
            return None
        try:
            if conn.in_transaction:
                conn.rollback()
        except Exception:
            pass
        try:
            conn.close()
        except Exception:
            pass
        return None

    @staticmethod
    def _spilled_result(job: _Job) -> Any:
        return True if job.kind == "judgement" else None  # a spilled verdict is saved, just not here yet

    def _submit(self, kind: str, args: dict[str, Any]) -> Future:
        if self._closed:
            raise RuntimeError("store is closed")
        job = _Job(kind, args)
        if kind not in _SPILLABLE:
            self._q.put(job)  # barriers and startup ops: callers wait off the event loop
            return job.fut
        try:
            self._q.put_nowait(job)
        except queue.Full:  # never block the caller: straight to the spill file (page cache; fsync'd by the writer)
            if self._say("queue-full"):
                log.error("store: writer queue full (%d ops); spilling ops to %s", self.max_queue, self.spill_path)
            self._spill([job], sync=False)
            _resolve(job.fut, self._spilled_result(job))
        return job.fut

    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every write enqueued before this call is committed or spilled."""
        self._submit("noop", {}).result(timeout)

    def pending_writes(self) -> int:
        return self._q.qsize()

    def overloaded(self) -> bool:
        """True while the writer queue is past its high-water mark: answer 429 rather than queue more."""
        return self._q.qsize() >= self.high_water

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._q.put(None)
        self._writer.join(timeout=30)

    # -- the spill file -----------------------------------------------------
    def _say(self, what: str, every_s: float = 10.0) -> bool:
        """Rate-limit a repeated log line (a failing disk fails every batch)."""
        now = time.monotonic()
        if now - self._said.get(what, -every_s) < every_s:
            return False
        self._said[what] = now
        return True

    def _spill(self, jobs: list[_Job], sync: bool = True, retry_soon: bool = True) -> None:
        lines = []
        for job in jobs:
            if job.kind not in _SPILLABLE:
                continue
            try:
                lines.append(json.dumps({"op": job.kind, "args": job.args, "at": time.time()},
                                        default=_encode, separators=(",", ":")))
            except Exception:
                self.lost += 1
                log.exception("store: a %s op cannot be spilled; it is lost", job.kind)
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode()
        try:
            fd = os.open(self.spill_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            self.lost += len(lines)
            log.exception("store: cannot open %s; %d op(s) lost", self.spill_path, len(lines))
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # whole lines, also against other processes' appends and re-imports
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if sync:
                    os.fsync(fd)
                else:
                    self._spill_dirty = True
            except OSError:
                os.ftruncate(fd, start)  # never leave half a line for the next append to glue onto
                raise
            self.spilled += len(lines)
            self._spilled_here = self._spilled_here or retry_soon
        except OSError:
            self.lost += len(lines)
            log.exception("store: cannot append to %s; %d op(s) lost", self.spill_path, len(lines))
        finally:
            os.close(fd)

    def _sync_spill(self) -> None:
        self._spill_dirty = False
        try:
            fd = os.open(self.spill_path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _import_spill(self, conn: sqlite3.Connection) -> int:
        """Apply the spill file's ops in order in one transaction, then keep only the lines that failed."""
        if not self.spill_path.exists() or self.spill_path.stat().st_size == 0:
            return 0
        fd = os.open(self.spill_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read().splitlines()
            kept: list[bytes] = []
            done = 0
            conn.execute("BEGIN IMMEDIATE")
            try:
                for line in raw:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line, object_hook=_decode)
                        conn.execute("SAVEPOINT job")
                        try:
                            _OPS[rec["op"]](self, conn, {**rec["args"], "replay": True})
                            conn.execute("RELEASE job")
                        except Exception:
                            if not conn.in_transaction:
                                raise
                            conn.execute("ROLLBACK TO job")
                            conn.execute("RELEASE job")
                            raise
                        done += 1
                    except sqlite3.OperationalError:
                        raise
                    except Exception as e:
                        log.error("store: spilled op could not be re-imported (kept in %s): %s", self.spill_path, e)
                        kept.append(line)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
            os.ftruncate(fd, 0)
            if kept:
                os.write(fd, b"\n".join(kept) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if done:
            self.imported += done
            log.warning("store: re-imported %d spilled op(s) from %s", done, self.spill_path)
        return done

    # -- ops (run on the writer thread, each inside the batch's transaction) ---
    def _op_noop(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        return None

    def _touch_session(self, conn: sqlite3.Connection, session_id: str) -> None:
        now = time.time()
        conn.execute(
            "INSERT INTO sessions (session_id, created_at, last_seen) VALUES (?, ?, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET last_seen=excluded.last_seen, closed_at=NULL, closed_reason=NULL",
            (session_id, now, now),
        )

    def _op_begin(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int | None:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id)
        cur = conn.execute(_INSERT_TURN + " ON CONFLICT(session_id, idx, choice_index) DO NOTHING", _turn_values(t))
        if cur.rowcount == 0 and not a.get("replay"):
            log.warning("store: turn %d of session %r is taken; this request's row waits for its end",
                        t.index, t.session_id)
        return cur.lastrowid if cur.rowcount else None

    def _op_finish(self, conn: sqlite3.Connection, a: dict[str, Any]) -> list[int]:
        turns: list[Turn] = a["turns"]
        key = a.get("key") or ""
        if turns:
            self._touch_session(conn, turns[0].session_id)
        return [self._store_turn(conn, t, key if t.choice_index == 0 else "", a.get("prompt_stored", False))
                for t in turns]

    def _op_add(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id)
        return self._store_turn(conn, t, "")

    def _store_turn(self, conn: sqlite3.Connection, t: Turn, key: str, prompt_stored: bool = False) -> int:
        """Complete the turn's pending row (or re-apply the same request: idempotent), else insert it.
        A row of another request at the same index (capture state out of step with the file) never
        drops this turn: it goes to the session's next free index, with a warning."""
        if key or t.request_id:
            row = conn.execute(_FINISH_TURN, (  # the prompt ids the pending row has are not written again
                _dumps(t.tools), None if prompt_stored else _dumps(list(t.prompt_ids)), _dumps(list(t.response_ids)),
                _dumps(list(t.response_logprobs)), t.response_text, _dumps(t.tool_calls), t.finish_reason,
                int(t.policy_version), _dumps(t.next_state), t.next_state_at, int(t.final), int(t.trainable),
                t.request_id, t.created_at, _versions(t), t.tenant or None, _dumps(t.sampling),
                t.session_id, t.index, t.choice_index, key or None, t.request_id,  # None: matches no row
            )).fetchall()
            if row:
                t.id = row[0][0]
                return t.id
        values = _turn_values(t)
        try:
            cur = conn.execute(_INSERT_TURN, values)
        except sqlite3.IntegrityError:
            nxt = conn.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM turns WHERE session_id=?",
                               (t.session_id,)).fetchone()[0]
            log.warning("store: turn %d of session %r is taken by another request; stored as turn %d",
                        t.index, t.session_id, nxt)
            self.reindexed += 1
            t.index = nxt
            cur = conn.execute(_INSERT_TURN, (values[0], nxt) + values[2:])
        t.id = cur.lastrowid
        return t.id

    def _op_abandon(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        n = conn.execute("DELETE FROM turns WHERE session_id=? AND idx=? AND finish_reason='pending' AND request_id=?",
                         (a["session_id"], a["index"], a["key"])).rowcount
        conn.execute("DELETE FROM sessions WHERE session_id=? AND NOT EXISTS "
                     "(SELECT 1 FROM turns WHERE session_id=?)", (a["session_id"], a["session_id"]))
        return n

    def _missing(self, conn: sqlite3.Connection, session_id: str, index: int) -> bool:
        return conn.execute("SELECT 1 FROM turns WHERE session_id=? AND idx=? LIMIT 1",
                            (session_id, index)).fetchone() is None

    def _op_next_state(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        now = time.time()
        payload = json.dumps(a["next_state"])
        sid, index, text = a["session_id"], a["index"], a.get("response_text")
        n = 0
        if text is not None:
            n = conn.execute(
                "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                "AND response_text=? AND next_state IS NULL",
                (payload, now, sid, index, text),
            ).rowcount
        if n == 0:
            n = conn.execute(
                "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                "AND choice_index=0 AND next_state IS NULL",
                (payload, now, sid, index),
            ).rowcount
        if n == 0 and self._missing(conn, sid, index):
            raise LookupError(f"turn {index} of session {sid!r} is not stored (spilled?)")
        return n

    def _op_close(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        sid, last = a["session_id"], a.get("last_main_index")
        conn.execute("UPDATE sessions SET closed_at=?, closed_reason=? WHERE session_id=?",
                     (time.time(), a["reason"], sid))
        if last is not None:
            n = conn.execute("UPDATE turns SET final=1 WHERE session_id=? AND idx=?", (sid, last)).rowcount
            if n == 0:
                raise LookupError(f"turn {last} of session {sid!r} is not stored (spilled?)")

    def _op_judgement(self, conn: sqlite3.Connection, a: dict[str, Any]) -> bool:
        j: Judgement = a["judgement"]
        cur = conn.execute(
            f"INSERT OR IGNORE INTO judgements ({_JUDGEMENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (j.turn_id, j.judge, int(j.score), json.dumps(j.votes), j.hint, float(j.latency_s),
             int(j.malformed), j.created_at, None if j.reward is None else float(j.reward),
             None if j.hint_candidates is None else json.dumps(list(j.hint_candidates))),
        )
        return cur.rowcount == 1

    def _op_cursor(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        # A replayed cursor never moves one that was set after it back.
        keep = "MAX(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))" if a.get("replay") else "excluded.value"
        conn.execute(f"INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value={keep}",
                     (f"cursor:{a['name']}", str(int(a["value"]))))

    def _op_abort_pending(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        return conn.execute("UPDATE turns SET finish_reason=?, trainable=0 WHERE finish_reason=?",
                            (ABORT, PENDING)).rowcount

    # -- turns ---------------------------------------------------------------
    def add_turn(self, turn: Turn) -> Future:
        """Enqueue a whole turn; the future resolves to its row id (None when it was spilled)."""
        return self._submit("add", {"turn": turn})

    def begin_turn(self, turn: Turn, key: str) -> Future:
        """Enqueue the pending row of a request that just began (`turn`: its prompt and request,
        `finish_reason='pending'`, untrainable, `request_id=key`). `finish_turns` completes it."""
        return self._submit("begin", {"turn": turn})

    def finish_turns(self, turns: list[Turn], key: str | None, prompt_stored: bool = False) -> Future:
        """Enqueue a request's turns (one per choice); choice 0 completes the pending row `key`
        (`prompt_stored`: that row has the same prompt ids already)."""
        return self._submit("finish", {"turns": turns, "key": key, "prompt_stored": prompt_stored})

    def abandon_turn(self, session_id: str, index: int, key: str) -> Future:
        """Drop the pending row of a request that ended without a turn."""
        return self._submit("abandon", {"session_id": session_id, "index": index, "key": key})

    def abort_pending(self) -> int:
        """Mark every pending row `abort` (untrainable): requests in flight when the last process died.
        Only the process that serves this store may call it, at start (capture does)."""
        return self._submit("abort_pending", {}).result(60) or 0

    def set_next_state(self, session_id: str, index: int, next_state: dict[str, Any],
                       response_text: str | None = None) -> Future:
        """Attach the next state to turn `index` of a session (never over one it has).

        With n > 1 choices, the one whose text the client echoed back
        (`response_text`) gets it; if none matches, choice 0 does.
        """
        return self._submit("next_state", {"session_id": session_id, "index": index, "next_state": next_state,
                                           "response_text": response_text})

    def close_session(self, session_id: str, reason: str, last_main_index: int | None) -> Future:
        """Mark a session closed and its last main turn final (judge it without next state)."""
        return self._submit("close", {"session_id": session_id, "reason": reason,
                                      "last_main_index": last_main_index})

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

    def next_index(self, session_id: str) -> int:
        """The first turn index no stored row of the session uses."""
        r = self._reader().execute("SELECT MAX(idx) FROM turns WHERE session_id=?", (session_id,)).fetchone()
        return 0 if r[0] is None else r[0] + 1

    def max_policy_version(self) -> int | None:
        """The newest policy version any stored turn was served with (None: no turn yet). A run that
        starts from the base weights without resuming continues numbering after it, so a version
        names one set of weights per store."""
        c = self._reader()
        top = c.execute("SELECT MAX(policy_version) FROM turns").fetchone()[0]
        mixed = c.execute("SELECT MAX(CAST(j.value AS INTEGER)) FROM turns t, json_each(t.response_versions) j "
                          "WHERE t.response_versions IS NOT NULL").fetchone()[0]
        vs = [v for v in (top, mixed) if v is not None and v >= 0]
        return max(vs) if vs else None

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

    def recent_answers(self, sessions: int) -> list[tuple[str, int, str, list[dict[str, Any]], str,
                                                           list[dict[str, Any]] | None, bool]]:
        """The last trainable main turn of the `sessions` most recently seen sessions, oldest first:
        (session_id, index, tenant, request messages, response_text, tool_calls, has next state) per choice.
        Capture rebuilds its conversation map from these (header-less sessions survive a restart)."""
        c = self._reader()
        sids = [r[0] for r in c.execute("SELECT session_id FROM sessions ORDER BY last_seen DESC LIMIT ?",
                                        (sessions,)).fetchall()]
        out = []
        for sid in reversed(sids):
            rows = c.execute(
                "SELECT idx, tenant, messages, response_text, tool_calls, next_state IS NOT NULL FROM turns "
                "WHERE session_id=? AND idx=(SELECT MAX(idx) FROM turns WHERE session_id=? AND type=? "
                "AND trainable=1) ORDER BY choice_index", (sid, sid, TURN_MAIN)).fetchall()
            for idx, tenant, msgs, text, tcs, linked in rows:
                out.append((sid, idx, tenant or "", json.loads(msgs), text, _loads(tcs), bool(linked)))
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
        """Store a verdict; a second verdict for the same (turn, judge) is ignored. Resolves to
        whether it was new (True when it was spilled: saved, re-imported on the next start)."""
        return self._submit("judgement", {"judgement": j})

    def get_judgement(self, turn_id: int, judge: str) -> Judgement | None:
        r = self._reader().execute(
            f"SELECT {_JUDGEMENT_COLS} FROM judgements WHERE turn_id=? AND judge=?",
            (turn_id, judge),
        ).fetchone()
        return _row_to_judgement(r) if r else None

    def judged_turns(self, judge: str, after_id: int, limit: int) -> list[tuple[int, Turn, Judgement]]:
        """(judgement row id, turn, judgement) with judgement id > after_id, in order.

        The trainer keeps the last id it consumed as its cursor (see get_cursor)."""
        rows = self._reader().execute(
            f"SELECT j.id, {', '.join('j.' + c.strip() for c in _JUDGEMENT_COLS.split(','))}, "
            f"{', '.join('t.' + c.strip() for c in _TURN_COLS.split(','))} "
            "FROM judgements j JOIN turns t ON t.id=j.turn_id "
            "WHERE j.judge=? AND j.id>? ORDER BY j.id LIMIT ?",
            (judge, after_id, limit),
        ).fetchall()
        n = 1 + _N_JUDGEMENT_COLS
        return [(r[0], _row_to_turn(r[n:]), _row_to_judgement(r[1:n])) for r in rows]

    # -- cursors and counters --------------------------------------------
    def get_cursor(self, name: str, default: int = 0) -> int:
        r = self._reader().execute("SELECT value FROM kv WHERE key=?", (f"cursor:{name}",)).fetchone()
        return int(r[0]) if r else default

    def set_cursor(self, name: str, value: int) -> Future:
        return self._submit("cursor", {"name": name, "value": int(value)})

    def write_stats(self) -> dict[str, float]:
        """The writer's own counters (cheap: no query)."""
        return {
            "capture/store_failures": float(self.failures),
            "capture/spilled": float(self.spilled),
            "capture/store_lost": float(self.lost),
            "capture/spill_imported": float(self.imported),
            "capture/store_reindexed": float(self.reindexed),
            "capture/store_overloaded": float(self.overloaded()),
        }

    # -- dashboard reads (read-only; gateway/dashboard.py) ----------------------
    def list_sessions(self, limit: int, offset: int = 0, *, judge: str,
                      tenant: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(how many sessions there are, one page of them, most recently seen first). `tenant`: only
        sessions with a turn of that tenant ("" for turns served without keys); None: all. Each row:
        session_id, created_at, last_seen, closed_at, closed_reason, tenant, turns (distinct indexes),
        rows (choices included), main_turns, judged, score_pos, score_zero, score_neg (verdicts of
        `judge`), last_version (the newest that served one of its turns)."""
        where, params = self._tenant_filter(tenant)
        c = self._reader()
        total = c.execute(f"SELECT COUNT(*) FROM sessions s {where}", params).fetchone()[0]
        rows = c.execute(f"SELECT session_id FROM sessions s {where} ORDER BY s.last_seen DESC, s.session_id "
                         "LIMIT ? OFFSET ?", (*params, max(0, int(limit)), max(0, int(offset)))).fetchall()
        return total, self._session_rows([r[0] for r in rows], judge)

    def session_summary(self, session_id: str, *, judge: str, tenant: str | None = None) -> dict[str, Any] | None:
        """One session's `list_sessions` row; None when it is unknown (or not `tenant`'s)."""
        where, params = self._tenant_filter(tenant)
        where = f"{where} AND s.session_id=?" if where else "WHERE s.session_id=?"
        r = self._reader().execute(f"SELECT session_id FROM sessions s {where}", (*params, session_id)).fetchone()
        rows = self._session_rows([r[0]], judge) if r else []
        return rows[0] if rows else None

    @staticmethod
    def _tenant_filter(tenant: str | None) -> tuple[str, tuple]:
        if tenant is None:
            return "", ()
        return ("WHERE EXISTS (SELECT 1 FROM turns t WHERE t.session_id=s.session_id AND COALESCE(t.tenant, '')=?)",
                (tenant,))

    def _session_rows(self, ids: list[str], judge: str) -> list[dict[str, Any]]:
        if not ids:
            return []
        c = self._reader()
        marks = ",".join("?" * len(ids))
        info = {r[0]: r for r in c.execute(
            f"SELECT session_id, created_at, last_seen, closed_at, closed_reason FROM sessions "
            f"WHERE session_id IN ({marks})", ids)}
        counts = {r[0]: r[1:] for r in c.execute(
            "SELECT t.session_id, COUNT(DISTINCT t.idx), COUNT(*), SUM(t.type=?), MAX(t.tenant), COUNT(j.score), "
            "SUM(j.score>0), SUM(j.score=0), SUM(j.score<0), MAX(t.policy_version) "
            "FROM turns t LEFT JOIN judgements j ON j.turn_id=t.id AND j.judge=? "  # one per turn: unique (turn, judge)
            f"WHERE t.session_id IN ({marks}) GROUP BY t.session_id", (TURN_MAIN, judge, *ids))}
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

    def session_turns_page(self, session_id: str, limit: int, offset: int = 0, *,
                           tenant: str | None = None) -> list[Turn]:
        """Rows `offset`.. of a session's turns in order (index, then choice); `tenant`: only its turns."""
        extra, params = ("", ()) if tenant is None else (" AND COALESCE(tenant, '')=?", (tenant,))
        rows = self._reader().execute(
            f"SELECT {_TURN_COLS} FROM turns WHERE session_id=?{extra} ORDER BY idx, choice_index LIMIT ? OFFSET ?",
            (session_id, *params, max(0, int(limit)), max(0, int(offset)))).fetchall()
        return [_row_to_turn(r) for r in rows]

    def judgements_of(self, turn_ids: list[int]) -> dict[int, list[tuple[int, Judgement]]]:
        """Every judge's verdict on each of `turn_ids`: turn id -> [(judgement row id, judgement)], oldest
        first. The row id is what the trainer's cursor counts (see `judged_turns`)."""
        out: dict[int, list[tuple[int, Judgement]]] = {}
        ids = [int(t) for t in turn_ids]
        for start in range(0, len(ids), 500):  # SQLite caps bound parameters
            chunk = ids[start:start + 500]
            for r in self._reader().execute(
                    f"SELECT id, {_JUDGEMENT_COLS} FROM judgements WHERE turn_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY id", chunk):
                out.setdefault(r[1], []).append((r[0], _row_to_judgement(r[1:])))
        return out

    def judgement_counts(self, since: float, bucket_s: float, *, judge: str,
                         limit: int = 2000) -> list[dict[str, Any]]:
        """`judge`'s verdicts stored since `since` (unix time) per `bucket_s` window, oldest first: [{"t":
        window start, "pos", "zero", "neg"}], the newest `limit` windows (those without a verdict left out)."""
        bucket_s = max(1e-3, float(bucket_s))
        rows = self._reader().execute(
            "SELECT CAST(created_at / ? AS INTEGER) AS b, SUM(score>0), SUM(score=0), SUM(score<0) FROM judgements "
            "WHERE created_at>=? AND judge=? GROUP BY b ORDER BY b DESC LIMIT ?",
            (bucket_s, float(since), judge, max(1, int(limit)))).fetchall()
        return [{"t": b * bucket_s, "pos": pos, "zero": zero, "neg": neg} for b, pos, zero, neg in reversed(rows)]

    def stats(self) -> dict[str, int | float]:
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
            **self.write_stats(),
        }


_OPS = {
    "noop": Store._op_noop, "begin": Store._op_begin, "finish": Store._op_finish, "add": Store._op_add,
    "abandon": Store._op_abandon, "next_state": Store._op_next_state, "close": Store._op_close,
    "judgement": Store._op_judgement, "cursor": Store._op_cursor, "abort_pending": Store._op_abort_pending,
}
# Ops whose loss would lose data; the others (barriers, the startup abort) are never spilled:
# replaying `abort_pending` at a later start would abort that run's live requests.
_SPILLABLE = frozenset({"begin", "finish", "add", "abandon", "next_state", "close", "judgement", "cursor"})
