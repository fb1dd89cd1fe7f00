"""Nothing captured is lost silently: a writer that fails (busy, read-only,
full disk) retries, then spills to `spill.jsonl`, re-imported on the next
open; a full queue spills instead of blocking; a `kill -9` keeps the request
of every answer being generated (pending rows, aborted at restart). Plus the
columns added since (tenant, sampling) and the versions a store has seen.

Real SQLite files; failures come from the file system (an immutable file, a
file-size limit) or, for BUSY, from a writer connection class that fails on
cue."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest

from clawloop.gateway.capture import Capture
from clawloop.records import Turn
from clawloop.store import SQLiteStore, Store
from conftest import free_port


def turn(i: int, sid: str = "s", **kw) -> Turn:
    return Turn(session_id=sid, index=i, messages=[{"role": "user", "content": f"q{i}"}], prompt_ids=[1, 2, i],
                response_ids=[3, 4], response_logprobs=[-0.1, -0.2], response_text=f"a{i}",
                request_id=f"req-{sid}-{i}", **kw)


def count_turns(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    finally:
        conn.close()


def spill_lines(store: Store) -> list[dict]:
    if not store.spill_path.exists():
        return []
    return [json.loads(x) for x in store.spill_path.read_text().splitlines() if x.strip()]


class FlakyConnection(sqlite3.Connection):
    """Fails `BEGIN IMMEDIATE` with SQLITE_BUSY while `fails` > 0 (as a `clawloop train` process
    holding the write lock past the timeout would); `gate` (an Event), when set on the class,
    holds every BEGIN until it is set."""

    fails = 0
    gate: threading.Event | None = None

    def execute(self, sql, *args):
        if sql == "BEGIN IMMEDIATE":
            if FlakyConnection.gate is not None:
                FlakyConnection.gate.wait(30)
            if FlakyConnection.fails > 0:
                FlakyConnection.fails -= 1
                raise sqlite3.OperationalError("database is locked")
        return super().execute(sql, *args)


class FlakyStore(SQLiteStore):
    writer_connection_factory = FlakyConnection


@pytest.fixture
def flaky():
    FlakyConnection.fails, FlakyConnection.gate = 0, None
    yield FlakyConnection
    FlakyConnection.fails, FlakyConnection.gate = 0, None


# ------------------------------------------------------------------ columns and versions

def test_tenant_and_sampling_are_stored_exported_and_added_to_old_files(tmp_path):
    from clawloop.trajectories import iter_export

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)  # a file from before the tenant and sampling columns
    conn.executescript("CREATE TABLE turns (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
                       "idx INTEGER NOT NULL, choice_index INTEGER NOT NULL DEFAULT 0, type TEXT NOT NULL, "
                       "messages TEXT NOT NULL, tools TEXT, prompt_ids TEXT NOT NULL, response_ids TEXT NOT NULL, "
                       "response_logprobs TEXT NOT NULL, response_text TEXT NOT NULL, tool_calls TEXT, "
                       "finish_reason TEXT NOT NULL, policy_version INTEGER NOT NULL, next_state TEXT, "
                       "final INTEGER NOT NULL DEFAULT 0, trainable INTEGER NOT NULL DEFAULT 1, "
                       "request_id TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, next_state_at REAL, "
                       "response_versions TEXT, UNIQUE (session_id, idx, choice_index));"
                       "INSERT INTO turns (session_id, idx, type, messages, prompt_ids, response_ids, "
                       "response_logprobs, response_text, finish_reason, policy_version, created_at) "
                       "VALUES ('old', 0, 'main', '[]', '[1]', '[2]', '[-1.0]', 'x', 'stop', 0, 0);")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    sampling = {"temperature": 0.7, "top_p": 0.9, "seed": 5, "logprobs": "raw"}
    tid = store.add_turn(turn(0, "new", tenant="alice", sampling=sampling)).result()
    old = store.session_turns("old")[0]
    assert (old.tenant, old.sampling) == ("", None)
    new = store.get_turn(tid)
    assert (new.tenant, new.sampling) == ("alice", sampling)
    exported = {s["session_id"]: s["turns"][0] for s in iter_export(store)}
    assert exported["new"]["tenant"] == "alice" and exported["new"]["sampling"] == sampling
    store.close()


def test_max_policy_version_counts_mixed_responses(tmp_path):
    store = SQLiteStore(tmp_path / "v.db")
    assert store.max_policy_version() is None
    store.add_turn(turn(0, policy_version=3))
    store.add_turn(turn(1, policy_version=2, response_versions=[2, 6]))
    store.flush()
    assert store.max_policy_version() == 6
    store.close()


# ------------------------------------------------------------------ the writer: retry, spill, re-import

def test_busy_writer_retries_with_backoff_and_loses_nothing(tmp_path, flaky):
    flaky.fails = 3
    store = FlakyStore(tmp_path / "b.db", retries=5, backoff_s=0.001)
    ids = [store.add_turn(turn(i)) for i in range(20)]
    store.flush()
    assert all(f.result() is not None for f in ids)
    assert count_turns(store.path) == 20
    stats = store.stats()
    assert stats["capture/store_failures"] == 3 and stats["capture/spilled"] == 0
    store.close()


def test_writer_failing_past_its_retries_spills_and_the_next_open_imports(tmp_path, flaky):
    flaky.fails = 10**9
    store = FlakyStore(tmp_path / "f.db", retries=2, backoff_s=0.001)
    sent = 0
    for i in range(30):
        store.add_turn(turn(i))
        sent += 1
        if i % 7 == 0:
            store.flush()  # several batches: the first is retried, the rest spilled at once
    store.set_next_state("s", 3, {"role": "user", "content": "thanks"})
    store.close_session("s", "done", 29)
    store.flush()
    assert count_turns(store.path) == 0
    ops = [x["op"] for x in spill_lines(store)]
    assert ops.count("add") == sent and ops[-2:] == ["next_state", "close"]
    assert store.stats()["capture/spilled"] == len(ops)
    store.close()
    spilled = store.spill_path.read_bytes()
    flaky.fails = 0
    again = SQLiteStore(tmp_path / "f.db")  # the next start
    turns = again.session_turns("s")
    assert len(turns) == sent and turns[3].next_state["content"] == "thanks" and turns[29].final
    assert spill_lines(again) == [] and again.stats()["capture/spill_imported"] == len(ops)
    again.close()
    # importing the same ops twice changes nothing (a crash between the commit and the truncation)
    store.spill_path.write_bytes(spilled)
    twice = SQLiteStore(tmp_path / "f.db")
    assert [(t.index, t.next_state, t.final) for t in twice.session_turns("s")] == \
        [(t.index, t.next_state, t.final) for t in turns]
    twice.close()


def test_writer_that_recovers_reimports_its_spill_in_the_same_run(tmp_path, flaky):
    flaky.fails = 10**9
    store = FlakyStore(tmp_path / "r.db", retries=1, backoff_s=0.001)
    for i in range(10):
        store.add_turn(turn(i))
    store.flush()
    assert store.stats()["capture/spilled"] == 10 and count_turns(store.path) == 0
    flaky.fails = 0  # the other process let go of the lock
    for i in range(10, 20):
        store.add_turn(turn(i))
    store.flush()
    assert count_turns(store.path) == 20 and spill_lines(store) == []
    store.close()


def _immutable(path, on: bool) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(
        ["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


def test_read_only_database_file_spills_every_turn(tmp_path):
    path = tmp_path / "ro.db"
    SQLiteStore(path).close()
    if os.geteuid() != 0:
        os.chmod(path, 0o444)
    elif not _immutable(path, True):  # root writes through permissions; an immutable file it cannot
        pytest.skip("cannot make a read-only file here (needs chattr as root)")
    try:
        store = SQLiteStore(path, retries=1, backoff_s=0.001)
        for i in range(25):
            store.add_turn(turn(i))
        store.flush()
        assert store.stats()["capture/spilled"] == 25 and count_turns(path) == 0
        store.close()
    finally:
        if os.geteuid() == 0:
            _immutable(path, False)
        else:
            os.chmod(path, 0o644)
    again = SQLiteStore(path)
    assert len(again.session_turns("s")) == 25 and spill_lines(again) == []
    again.close()


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from clawloop.records import Turn
from clawloop.store import SQLiteStore

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
store = SQLiteStore(sys.argv[1], retries=1, backoff_s=0.001)
# A big first turn grows the WAL; a limit just above it leaves the database no room to grow and the
# spill file (a new file) up to that much.
store.add_turn(Turn("filler", 0, messages=[{"role": "user", "content": "x" * 600_000}]))
store.flush()
limit = Path(sys.argv[1] + "-wal").stat().st_size + 64 * 1024
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
for i in range(300):
    # a message of its own per turn: the same one would be stored once, and the disk never fill
    store.add_turn(Turn("s", i, messages=[{"role": "user", "content": f"{i} " + "q" * 1000}], prompt_ids=list(range(60)),
                        response_ids=[1, 2], response_logprobs=[-0.5, -0.5], response_text="a", request_id=f"r{i}"))
    if i % 20 == 0:
        store.flush()
store.close()
s = store.write_stats()
print(int(s["capture/spilled"]), int(s["capture/store_lost"]))
"""


def count_session(path, sid) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM turns WHERE session_id=?", (sid,)).fetchone()[0]
    finally:
        conn.close()


def test_full_disk_spills_and_nothing_is_missing(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) in a child process stands in for a full file system."""
    path = tmp_path / "full.db"
    res = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    spilled, lost = map(int, res.stdout.split())
    stored_then = count_session(path, "s")
    assert lost == 0 and spilled > 0 and stored_then > 0 and stored_then + spilled == 300, (stored_then, spilled, lost)
    again = SQLiteStore(path)
    assert len(again.session_turns("s")) == 300 and spill_lines(again) == []
    again.close()


def test_full_queue_spills_at_once_instead_of_blocking(tmp_path, flaky):
    flaky.gate = threading.Event()  # the writer hangs in BEGIN (a disk that stopped answering)
    store = FlakyStore(tmp_path / "q.db", max_queue=8, high_water=0.5)
    t0 = time.perf_counter()
    for i in range(40):
        store.add_turn(turn(i))
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0 and store.overloaded()
    assert store.stats()["capture/spilled"] >= 40 - 8 - 8  # past the queue and the batch the writer holds
    flaky.gate.set()
    store.flush()
    store.flush()
    assert not store.overloaded()
    assert count_turns(store.path) == 40 and spill_lines(store) == []  # re-imported once writes worked
    store.close()


# ------------------------------------------------------------------ kill -9: pending rows

def test_request_in_flight_at_a_crash_is_kept_as_aborted(tmp_path):
    path = tmp_path / "p.db"
    store = SQLiteStore(path)
    cap = Capture(store)
    done = cap.begin("s", "main", [{"role": "user", "content": "q0"}], False, prompt_ids=[5, 6, 7])
    cap.finish(done, [Turn("s", 0, messages=[{"role": "user", "content": "q0"}], prompt_ids=[5, 6, 7],
                           response_ids=[1], response_logprobs=[-0.1], response_text="a0")])
    cap.begin("s", "main", [{"role": "user", "content": "q1"}], False, prompt_ids=[8, 9], tenant="alice")
    store.flush()
    (_, running) = store.session_turns("s")
    assert running.finish_reason == "pending" and not running.trainable
    store.close()  # the process dies here: the second answer never finished
    store = SQLiteStore(path)
    cap = Capture(store)
    assert cap.aborted_at_start == 1
    store.flush()
    t0, t1 = store.session_turns("s")
    assert (t1.finish_reason, t1.trainable, t1.prompt_ids, t1.tenant) == ("abort", False, [8, 9], "alice")
    assert t1.messages[-1]["content"] == "q1" and t0.finish_reason == "stop" and t0.trainable
    assert cap.begin("s", "main", [{"role": "user", "content": "q2"}], False).index == 2
    store.close()


def test_kill_9_during_traffic_keeps_every_answered_request(random_model_dir, tmp_path):
    data = tmp_path / "data"
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--model-path", str(random_model_dir),
                             "--data-dir", str(data), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, open(log.name).read()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "serve did not start"
            time.sleep(0.2)
        answered = {f"k{i}": 0 for i in range(4)}
        sent = dict.fromkeys(answered, 0)
        stop = threading.Event()

        def user(sid):
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    sent[sid] += 1
                    try:
                        r = c.post(url + "/v1/chat/completions", headers={"X-Session-Id": sid}, json={
                            "model": "m", "max_tokens": 16,
                            "messages": [{"role": "user", "content": f"question {sent[sid]}"}]})
                    except httpx.HTTPError:
                        return  # the server died mid-request
                    if r.status_code == 200:
                        answered[sid] += 1

        threads = [threading.Thread(target=user, args=(sid,)) for sid in answered]
        for t in threads:
            t.start()
        while sum(answered.values()) < 24:
            assert proc.poll() is None, open(log.name).read()[-3000:]
            time.sleep(0.01)
        # and one long answer (greedy: the random model does not stop within 1000 tokens) under way
        long_q = [{"role": "user", "content": "Tell me a long story."}]
        with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json={
                "model": "m", "max_tokens": 1000, "temperature": 0, "stream": True, "messages": long_q},
                headers={"X-Session-Id": "long"}) as r:
            for line in r.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break  # its first tokens are out
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = SQLiteStore(data / "clawloop.db")
    Capture(store)  # the next start: pending rows become aborted
    store.flush()
    for sid, n in answered.items():
        rows = store.session_turns(sid)
        done = [t for t in rows if t.finish_reason != "abort"]
        assert all(t.finish_reason != "pending" for t in rows)
        # every answered request has its row; an answer whose end was not committed yet is kept aborted
        assert n <= len(rows) <= sent[sid], (sid, n, len(rows), sent[sid])
        assert len(done) >= n - 1, (sid, n, len(done))
        assert all(t.messages and t.trainable == (t.finish_reason != "abort") for t in rows)
    (long,) = store.session_turns("long")  # its request is kept, its answer lost: aborted, untrainable
    assert long.finish_reason == "abort" and not long.trainable and long.messages == long_q and long.prompt_ids
    store.close()


def test_a_fresh_start_continues_the_stores_version_numbers(engine, random_model_dir, tmp_path):
    """Without a resume, the base weights are not v0 again on a store that already served v0..v3."""
    from conftest import make_cfg

    from clawloop.engines.hf import HFEngine
    from clawloop.records import Turn
    from clawloop.apps.serve import continue_versions
    from clawloop.naming import open_store

    cfg = make_cfg(random_model_dir, tmp_path)
    store = open_store(cfg)
    try:
        store.add_turn(Turn(session_id="old", index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                            policy_version=3))
        store.flush()
        eng = HFEngine(random_model_dir, device="cpu", dtype="float32")
        assert eng.policy_version == 0
        continue_versions(cfg, eng, store)
        assert eng.policy_version == 4
        resumed = make_cfg(random_model_dir, tmp_path, train__resume_from_checkpoint="latest")
        eng2 = HFEngine(random_model_dir, device="cpu", dtype="float32")
        continue_versions(resumed, eng2, store)
        assert eng2.policy_version == 0  # a resume publishes the checkpoint's own version
    finally:
        store.close()
