"""Durable group state for the rollout buffer: one SQLite file (WAL), one writer thread.

Every item the buffer acknowledges is committed first, so a restart loses
nothing written. Items belong to groups, keyed by (task_type, instance_id):

    open ──(n reaches group size)──────────────▶ ready ──(read)──▶ handed out (rows deleted)
      └──(no write for group_timeout_s)──┬─ n ≥ ceil(min_group_ratio·size) ─▶ ready (stale)
                                         └─ else ─▶ dropped (counted)
    ready ──(read: hooks say invalid)──▶ dropped (counted)

A write for an instance_id whose group is no longer open starts a new group
(a second epoch over the same prompts gives fresh groups).

The writer thread owns the open groups: it batches whatever writes are queued
into one transaction (that is what makes ingest fast) and runs the stale
sweep between batches, so nothing else ever changes an open group. Readers
take a process-wide lock and a `BEGIN IMMEDIATE` transaction, and only touch
ready groups, so each group is handed out exactly once even with concurrent
readers.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import queue
import sqlite3
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_type TEXT PRIMARY KEY,
    group_size INTEGER NOT NULL,
    group_timeout_s REAL NOT NULL,
    min_group_ratio REAL NOT NULL,
    payload TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_type TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    group_size INTEGER NOT NULL,
    state TEXT NOT NULL,            -- open | ready | dropped
    stale INTEGER NOT NULL DEFAULT 0,
    first_write REAL NOT NULL,
    last_write REAL NOT NULL,
    ready_at REAL
);
CREATE INDEX IF NOT EXISTS groups_state ON groups (state, ready_at, id);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    group_id INTEGER NOT NULL,
    body BLOB NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS items_group ON items (group_id, id);
CREATE TABLE IF NOT EXISTS counters (
    task_type TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (task_type, name)
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

_BUMP = ("INSERT INTO counters (task_type, name, value) VALUES (?, ?, ?) "
         "ON CONFLICT(task_type, name) DO UPDATE SET value = value + excluded.value")


def instance_key(instance_id: Any) -> str:
    """The text key of an instance_id: its JSON (so 3 and "3" are different groups,
    and the original value comes back with json.loads)."""
    return json.dumps(instance_id, separators=(",", ":"))


@dataclass
class TaskSpec:
    group_size: int
    group_timeout_s: float
    min_group_ratio: float

    def min_stale_size(self, group_size: int) -> int:
        return max(1, math.ceil(self.min_group_ratio * group_size - 1e-9))


@dataclass
class _Open:
    id: int
    task_type: str
    n: int
    size: int
    last: float


@dataclass
class ReadyGroup:
    """A finished group as the reader sees it."""

    id: int
    task_type: str
    instance_key: str
    group_size: int
    stale: bool
    items: list[dict[str, Any]]


@dataclass
class GroupOutcome:
    """What the reader decided for one group."""

    handed: bool
    items: list[dict[str, Any]]
    """Items to hand out (after hooks) when handed."""
    reason: str = ""
    counts: dict[str, int] | None = None
    """Extra counters to bump for the group's task (filtered_items, padded_items, ...)."""


class BufferStore:
    """The buffer's SQLite file. Thread-safe; writes go through one writer thread."""

    def __init__(self, path: str | Path, default: TaskSpec):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The writer thread caches open groups in memory, so two buffers on one file would
        # diverge: refuse the second one.
        self._lock_file = open(self.path.with_name(self.path.name + ".lock"), "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"another rollout buffer is using {self.path}; give each buffer its own --data-dir") \
                from None
        self.default = default
        self._q: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self._read_lock = threading.Lock()
        self._local = threading.local()
        self._closed = False
        conn = self._connect()
        conn.executescript(SCHEMA)
        conn.commit()
        self.tasks: dict[str, TaskSpec] = {
            t: TaskSpec(g, to, r) for t, g, to, r in
            conn.execute("SELECT task_type, group_size, group_timeout_s, min_group_ratio FROM tasks")
        }
        row = conn.execute("SELECT value FROM kv WHERE key='current_task'").fetchone()
        self.current_task: str | None = row[0] if row else None
        self._open: dict[tuple[str, str], _Open] = {}
        self._load_open(conn)
        self._writer = threading.Thread(target=self._write_loop, name="clawloop-buffer-writer", daemon=True)
        self._writer.start()

    # -- connections ----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a process crash
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def _load_open(self, conn: sqlite3.Connection) -> None:
        self._open = {
            (t, k): _Open(i, t, n, size, last) for i, t, k, n, size, last in conn.execute(
                "SELECT id, task_type, instance_id, n, group_size, last_write FROM groups WHERE state='open'")
        }

    def spec(self, task_type: str) -> TaskSpec:
        return self.tasks.get(task_type, self.default)

    # -- writer thread ----------------------------------------------------------
    def _write_loop(self) -> None:
        conn = self._connect()
        last_sweep = 0.0
        while True:
            try:
                job = self._q.get(timeout=self._sweep_interval())
            except queue.Empty:
                job = None
            batch = [] if job is None else [job]
            while len(batch) < 4096:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = any(kind == "stop" for kind, _, _ in batch)
            now = time.time()
            sweep = now - last_sweep >= self._sweep_interval()
            if sweep:
                last_sweep = now
                sweep = any(now - g.last >= self.spec(g.task_type).group_timeout_s for g in self._open.values())
            if batch or sweep:
                self._apply(conn, batch, now, sweep)
            if stop:
                conn.close()
                return

    def _sweep_interval(self) -> float:
        timeouts = [s.group_timeout_s for s in self.tasks.values()] + [self.default.group_timeout_s]
        return min(1.0, max(0.05, min(timeouts) / 4))

    def _apply(self, conn: sqlite3.Connection, batch: list[tuple[str, Any, Any]], now: float, sweep: bool) -> None:
        results: list[tuple[Any, Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            item_rows: list[tuple[int, bytes, float]] = []
            touched: dict[int, _Open] = {}
            ready: set[int] = set()
            written: dict[str, int] = defaultdict(int)
            for kind, arg, done in batch:
                if kind == "write":
                    out = []
                    for task_type, key, body in arg:
                        g = self._open.get((task_type, key))
                        if g is None:
                            size = self.spec(task_type).group_size
                            cur = conn.execute(
                                "INSERT INTO groups (task_type, instance_id, n, group_size, state, first_write, "
                                "last_write) VALUES (?, ?, 0, ?, 'open', ?, ?)", (task_type, key, size, now, now))
                            g = self._open[(task_type, key)] = _Open(cur.lastrowid, task_type, 0, size, now)
                        item_rows.append((g.id, body, now))
                        g.n += 1
                        g.last = now
                        touched[g.id] = g
                        written[task_type] += 1
                        if g.n >= g.size:
                            ready.add(g.id)
                            del self._open[(task_type, key)]
                        out.append((g.n, g.size))
                    results.append((done, out, None))
                elif kind == "task":
                    task_type, spec, payload = arg
                    conn.execute(
                        "INSERT INTO tasks (task_type, group_size, group_timeout_s, min_group_ratio, payload, "
                        "started_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(task_type) DO UPDATE SET "
                        "group_size=excluded.group_size, group_timeout_s=excluded.group_timeout_s, "
                        "min_group_ratio=excluded.min_group_ratio, payload=excluded.payload, "
                        "started_at=excluded.started_at",
                        (task_type, spec.group_size, spec.group_timeout_s, spec.min_group_ratio,
                         json.dumps(payload, default=str), now))
                    conn.execute("INSERT INTO kv (key, value) VALUES ('current_task', ?) "
                                 "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (task_type,))
                    self.tasks[task_type] = spec
                    self.current_task = task_type
                    results.append((done, None, None))
                else:  # flush / stop
                    results.append((done, None, None))
            if item_rows:
                conn.executemany("INSERT INTO items (group_id, body, created_at) VALUES (?, ?, ?)", item_rows)
            if touched:
                conn.executemany(
                    "UPDATE groups SET n=?, last_write=?, state=?, ready_at=? WHERE id=?",
                    [(g.n, g.last, "ready" if g.id in ready else "open", now if g.id in ready else None, g.id)
                     for g in touched.values()])
            if written:
                conn.executemany(_BUMP, [(t, "written", n) for t, n in written.items()])
            if sweep:
                self._sweep(conn, now)
            conn.execute("COMMIT")
        except BaseException as e:  # noqa: BLE001 - report to every waiter, then carry on
            log.exception("buffer store: write batch failed")
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._load_open(conn)  # in-memory open groups must match what is committed
            results = [(done, None, e) for _, _, done in batch]
        for done, res, err in results:
            if done is not None:
                try:
                    done(res, err)
                except Exception:  # noqa: BLE001 - e.g. the waiter's event loop is gone; others still wait
                    log.exception("buffer store: completion callback failed")

    def _sweep(self, conn: sqlite3.Connection, now: float) -> None:
        """Finish or drop open groups that have had no write for their task's timeout."""
        bumps: list[tuple[str, str, int]] = []
        for key, g in list(self._open.items()):
            spec = self.spec(g.task_type)
            if now - g.last < spec.group_timeout_s:
                continue
            del self._open[key]
            if g.n >= spec.min_stale_size(g.size):
                conn.execute("UPDATE groups SET state='ready', stale=1, ready_at=? WHERE id=?", (now, g.id))
                log.info("buffer: stale group %s/%s finished with %d of %d items", g.task_type, key[1], g.n, g.size)
            else:
                conn.execute("DELETE FROM items WHERE group_id=?", (g.id,))
                conn.execute("UPDATE groups SET state='dropped', ready_at=? WHERE id=?", (now, g.id))
                bumps += [(g.task_type, "dropped_stale_groups", 1), (g.task_type, "dropped_stale_items", g.n)]
                log.warning("buffer: stale group %s/%s dropped with %d of %d items (needs %d)",
                            g.task_type, key[1], g.n, g.size, spec.min_stale_size(g.size))
        if bumps:
            conn.executemany(_BUMP, bumps)

    def _submit(self, kind: str, arg: Any, done: Callable[[Any, BaseException | None], None] | None) -> None:
        if self._closed:
            raise RuntimeError("buffer store is closed")
        self._q.put((kind, arg, done))

    def _wait(self, kind: str, arg: Any, timeout: float = 60.0) -> Any:
        ev = threading.Event()
        box: list[Any] = [None, None]

        def done(res: Any, err: BaseException | None) -> None:
            box[0], box[1] = res, err
            ev.set()

        self._submit(kind, arg, done)
        if not ev.wait(timeout):
            raise TimeoutError(f"buffer store: {kind} not committed within {timeout}s")
        if box[1] is not None:
            raise box[1]
        return box[0]

    # -- public API -----------------------------------------------------------------
    def write_async(self, entries: list[tuple[str, str, bytes]],
                    done: Callable[[list[tuple[int, int]] | None, BaseException | None], None]) -> None:
        """Queue items `(task_type, instance_key, body)`; `done(results, error)` runs on
        the writer thread after the commit, with (items in group, group size) per item."""
        self._submit("write", entries, done)

    def write(self, entries: list[tuple[str, str, bytes]], timeout: float = 60.0) -> list[tuple[int, int]]:
        """Write and wait for the commit."""
        return self._wait("write", entries, timeout)

    def register_task(self, task_type: str, spec: TaskSpec, payload: dict[str, Any]) -> None:
        """Record a task's group size and stale settings (on /start_rollout); it becomes
        the task that items without a `task_type` belong to."""
        self._wait("task", (task_type, spec, payload))

    def flush(self, timeout: float = 60.0) -> None:
        """Block until everything queued so far is committed (and run a stale sweep)."""
        self._wait("flush", None, timeout)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._q.put(("stop", None, None))
        self._writer.join(timeout=30)
        self._lock_file.close()  # releases the flock

    def ready_items(self) -> int:
        return self._conn().execute("SELECT COALESCE(SUM(n), 0) FROM groups WHERE state='ready'").fetchone()[0]

    def read(self, batch_size: int | None, decide: Callable[[ReadyGroup], GroupOutcome],
             task_type: str | None = None) -> dict[str, Any]:
        """Hand out ready groups, oldest first, exactly once.

        `decide` runs the hooks on each group. With `batch_size`, groups are taken
        until at least that many items are handed out; if fewer are available,
        nothing is handed out (invalid groups met on the way are still dropped).
        Returns {"groups": [(ReadyGroup, GroupOutcome)], "handed_items", "available",
        "enough", "finished": [(task_type, instance_key)]}.
        """
        with self._read_lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                res = self._read_locked(conn, batch_size, decide, task_type)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return res

    def _read_locked(self, conn: sqlite3.Connection, batch_size: int | None,
                     decide: Callable[[ReadyGroup], GroupOutcome], task_type: str | None) -> dict[str, Any]:
        where, args = "state='ready'", ()
        if task_type is not None:
            where, args = "state='ready' AND task_type=?", (task_type,)
        rows = conn.execute(f"SELECT id, task_type, instance_id, group_size, stale, n FROM groups WHERE {where} "
                            "ORDER BY ready_at, id", args).fetchall()
        available = sum(r[5] for r in rows)
        res: dict[str, Any] = {"groups": [], "handed_items": 0, "available": available, "enough": True,
                               "finished": []}
        if batch_size and available < batch_size:
            res["enough"] = False
            return res
        decided: list[tuple[ReadyGroup, GroupOutcome]] = []
        handed = 0
        bodies: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for i, (gid, task, key, size, stale, _n) in enumerate(rows):
            if batch_size and handed >= batch_size:
                break
            if gid not in bodies:  # load items a chunk of groups at a time: a small batch reads little
                chunk = [r[0] for r in rows[i:i + (16 if batch_size else 500)]]
                for g_id, body in conn.execute(
                        f"SELECT group_id, body FROM items WHERE group_id IN ({','.join('?' * len(chunk))}) "
                        "ORDER BY group_id, id", chunk):
                    bodies[g_id].append(json.loads(body))
            group = ReadyGroup(gid, task, key, size, bool(stale), bodies.pop(gid, []))
            outcome = decide(group)
            decided.append((group, outcome))
            if outcome.handed:
                handed += len(outcome.items)
        if batch_size and handed < batch_size:
            # Not enough valid data: keep the valid groups for later, drop the invalid ones now.
            res["enough"] = False
            decided = [(g, o) for g, o in decided if not o.handed]
            handed = 0
        bumps: list[tuple[str, str, int]] = []
        finished_ids = [g.id for g, _ in decided]
        for group, outcome in decided:
            if outcome.handed:
                bumps += [(group.task_type, "read", len(outcome.items)), (group.task_type, "groups_read", 1)]
                if group.stale:
                    bumps.append((group.task_type, "stale_groups_read", 1))
            else:
                bumps += [(group.task_type, "dropped_invalid_groups", 1),
                          (group.task_type, "dropped_invalid_items", len(group.items))]
            for name, v in (outcome.counts or {}).items():
                if v:
                    bumps.append((group.task_type, name, v))
            res["finished"].append((group.task_type, group.instance_key))
        # Stale groups dropped by the writer since the last read are finished too.
        dropped = conn.execute("SELECT id, task_type, instance_id FROM groups WHERE state='dropped'").fetchall()
        res["finished"] += [(t, k) for _, t, k in dropped]
        finished_ids += [i for i, _, _ in dropped]
        for chunk in range(0, len(finished_ids), 500):
            ids = finished_ids[chunk:chunk + 500]
            marks = ",".join("?" * len(ids))
            conn.execute(f"DELETE FROM items WHERE group_id IN ({marks})", ids)
            conn.execute(f"DELETE FROM groups WHERE id IN ({marks})", ids)
        if bumps:
            conn.executemany(_BUMP, bumps)
        res["groups"] = decided
        res["handed_items"] = handed
        return res

    def stats(self) -> dict[str, Any]:
        """Counters and pending groups, per task."""
        conn = self._conn()
        per: dict[str, dict[str, Any]] = defaultdict(lambda: {
            "written": 0, "read": 0, "open_groups": 0, "open_items": 0, "ready_groups": 0, "ready_items": 0})
        for t, name, v in conn.execute("SELECT task_type, name, value FROM counters"):
            per[t][name] = v
        for t, state, groups, items in conn.execute(
                "SELECT task_type, state, COUNT(*), SUM(n) FROM groups WHERE state IN ('open', 'ready') "
                "GROUP BY task_type, state"):
            per[t][f"{state}_groups"] = groups
            per[t][f"{state}_items"] = items or 0
        for t, spec in self.tasks.items():
            per[t]["group_size"] = spec.group_size
        totals: dict[str, Any] = defaultdict(int)
        for d in per.values():
            for k, v in d.items():
                if k != "group_size":
                    totals[k] += v
        return {"totals": dict(totals), "per_task": {t: dict(d) for t, d in per.items()}}
