"""The SQLite store's write path: one writer thread, retries, and the spill file.

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

An op is a method `_op_<kind>(conn, args)` of the concern that owns it (`turns.py`:
begin/finish/add/abandon/next_state/close/abort_pending; `judgements.py`: judgement/cursor).
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
from typing import Any

from clawloop.records import Judgement, Turn
from clawloop.store.chunks import Chunks
from clawloop.store.schema import SCHEMA, migrate

log = logging.getLogger(__name__)

SPILL_NAME = "spill.jsonl"

OPS = frozenset({"noop", "begin", "finish", "add", "abandon", "next_state", "close", "judgement", "cursor",
                 "abort_pending"})
"""Every op the writer applies (each a method `_op_<kind>`)."""
SPILLABLE = frozenset({"begin", "finish", "add", "abandon", "next_state", "close", "judgement", "cursor"})
"""Ops whose loss would lose data; the others (barriers, the startup abort) are never spilled:
replaying `abort_pending` at a later start would abort that run's live requests."""


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


class SQLiteBase:
    """One SQLite file and the one thread that writes it; the concerns (`turns.py`, `judgements.py`,
    `browse.py`) add their ops and queries on top and `SQLiteStore` puts them together (its
    docstring says what the arguments mean)."""

    writer_connection_factory: type[sqlite3.Connection] = sqlite3.Connection
    """The writer's connection class (`sqlite3.connect(factory=...)`); tests swap in one that fails."""
    OPS = OPS
    SPILLABLE = SPILLABLE
    """The ops this store applies and those it spills (an implementation with more ops extends them)."""
    BEGIN_WRITE = "BEGIN IMMEDIATE"
    """How a write transaction starts (SQLite: take the write lock at once)."""
    DATABASE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
    """Errors of the database rather than of one op (locked, read-only, full, I/O): the batch is retried.
    A second implementation (`postgres.py`) names its own, with `_in_transaction` and its connections."""

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
        self.chunks = Chunks()
        """The pieces of prompts, messages and tools that turns share (stored once; `chunks.py`)."""
        conn = self._connect()
        conn.executescript(SCHEMA)
        migrate(conn)
        conn.commit()
        self._start_writer(conn)

    def _start_writer(self, conn: Any) -> None:
        """Re-import the spill file on `conn` (then closed), and start the writer thread."""
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

    @staticmethod
    def _in_transaction(conn: Any) -> bool:
        return conn.in_transaction

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
        conn.execute(self.BEGIN_WRITE)
        for job in jobs:
            try:
                conn.execute("SAVEPOINT job")
                res = self._run_op(conn, job.kind, job.args)
                conn.execute("RELEASE job")
                results.append((job, res, None))
            except self.DATABASE_ERRORS:  # the database (locked, read-only, full, I/O), not the op: retry all
                raise
            except Exception as e:  # one bad op must not lose the others
                if not self._in_transaction(conn):  # SQLite rolled the whole transaction back
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
            if self._in_transaction(conn):
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
        if kind not in self.SPILLABLE:
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

    # -- ops (run on the writer thread, each inside the batch's transaction) ---
    def _run_op(self, conn: sqlite3.Connection, kind: str, args: dict[str, Any]) -> Any:
        """Apply the op `kind`: the method `_op_<kind>` a concern defines (`turns.py`, `judgements.py`)."""
        if kind not in self.OPS:
            raise ValueError(f"unknown store op {kind!r}")
        return getattr(self, f"_op_{kind}")(conn, args)

    def _op_noop(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        """A barrier: `flush()` waits for it, so for everything enqueued before it."""
        return None

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
            if job.kind not in self.SPILLABLE:
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
            conn.execute(self.BEGIN_WRITE)
            try:
                for line in raw:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line, object_hook=_decode)
                        conn.execute("SAVEPOINT job")
                        try:
                            self._run_op(conn, rec["op"], {**rec["args"], "replay": True})
                            conn.execute("RELEASE job")
                        except Exception:
                            if not self._in_transaction(conn):
                                raise
                            conn.execute("ROLLBACK TO job")
                            conn.execute("RELEASE job")
                            raise
                        done += 1
                    except self.DATABASE_ERRORS:
                        raise
                    except Exception as e:
                        log.error("store: spilled op could not be re-imported (kept in %s): %s", self.spill_path, e)
                        kept.append(line)
                conn.execute("COMMIT")
            except BaseException:
                if self._in_transaction(conn):
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
