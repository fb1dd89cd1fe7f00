"""Several gateway processes, one PostgreSQL store: the requests of one session spread over them link as
one gateway links them (tests marked `postgres`, `make test-postgres`).

Real processes (`clawloop serve` on a random 2-layer model), a real server (`pg_server`), the official
OpenAI client; every request of a conversation goes to the next gateway in turn, so no gateway sees two
consecutive requests of it, and two conversations run at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from clawloop.store import open_store

from conftest import free_port

pytestmark = pytest.mark.postgres


def start_gateway(model_dir: Path, store: str, data_dir: Path, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "clawloop.cli", "serve", "--model-path", str(model_dir), "--store", store,
           "--data-dir", str(data_dir), "--port", str(port), "--max-model-len", "1024",
           "--log-level", "warning", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway on {port} exited: {proc.stdout.read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"gateway on {port} did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def converse(ports: list[int], turns: int, session: str | None, first: str, offset: int = 0) -> list[str]:
    """One conversation, request k to gateway (k + offset) % len(ports); the user's messages, in order."""
    import openai

    messages: list[dict] = [{"role": "system", "content": "be brief"}]
    said = []
    for k in range(turns):
        said.append(f"{first} message {k}")
        messages.append({"role": "user", "content": said[-1]})
        port = ports[(k + offset) % len(ports)]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        headers = {"X-Session-Id": session} if session else {}
        if k == turns - 1 and session:
            headers["X-Session-Done"] = "1"
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=1.0, seed=k,
                                           extra_headers=headers)
        messages.append({"role": "assistant", "content": r.choices[0].message.content or "x"})
    return said


def linked_as_one_gateway_would(turns, said: list[str]) -> None:
    assert [t.index for t in turns] == list(range(len(said)))
    assert all(t.trainable and t.finish_reason in ("stop", "length") for t in turns)
    for k, t in enumerate(turns[:-1]):  # each turn's next state is the user's next message
        assert t.next_state == {"role": "user", "content": said[k + 1]}, k
    assert turns[-1].next_state is None


def test_one_session_spread_over_three_gateway_processes_links_every_turn(random_model_dir, pg_url, tmp_path):
    ports = [free_port() for _ in range(3)]
    procs = [start_gateway(random_model_dir, pg_url, tmp_path / f"gw{i}", p) for i, p in enumerate(ports)]
    try:
        for p, proc in zip(ports, procs):
            wait_healthy(p, proc)
        results: dict[str, list[str]] = {}
        errors: list[BaseException] = []

        def run(name: str, session: str | None, offset: int) -> None:
            try:
                results[name] = converse(ports, 6, session, name, offset)
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=("alpha", "s-alpha", 0)),
                   threading.Thread(target=run, args=("beta", None, 1))]  # header-less: found by its history
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not errors, errors
    finally:
        for proc in procs:
            stop(proc)
    store = open_store(pg_url, spill_path=tmp_path / "spill.jsonl")
    try:
        alpha = store.session_turns("s-alpha")
        linked_as_one_gateway_would(alpha, results["alpha"])
        assert alpha[-1].final  # X-Session-Done on the last request, served by another gateway
        inferred = [(sid, turns) for sid, turns in store.iter_sessions() if sid.startswith("conv-")]
        assert len(inferred) == 1, [sid for sid, _ in inferred]  # one session, whichever gateway served it
        linked_as_one_gateway_would(inferred[0][1], results["beta"])
        assert store.stats()["turns"] == 12
    finally:
        store.close()
    # export from the server, import into a SQLite store, export again: the same lines (export/import unchanged)
    from clawloop.trajectories import export_sessions, import_sessions
    from conftest import make_cfg

    assert export_sessions(tmp_path, str(tmp_path / "pg.jsonl"), store_url=pg_url) == 2
    lite = make_cfg(random_model_dir, tmp_path / "lite")
    assert import_sessions(lite, tmp_path / "pg.jsonl") == (2, 12)
    assert export_sessions(lite.data_dir, str(tmp_path / "lite.jsonl")) == 2

    def lines(path: Path) -> list[dict]:
        out = [json.loads(x) for x in path.read_text().splitlines()]
        for s in out:
            for t in s["turns"]:  # what import itself decides, whatever the store: it closes each session
                t.pop("final", None)  # (its last main turn final) and does not read finish reasons back
                t.pop("finish_reason", None)
        return out

    pg_lines, lite_lines = lines(tmp_path / "pg.jsonl"), lines(tmp_path / "lite.jsonl")
    diff = [(s["session_id"], k) for s, s2 in zip(pg_lines, lite_lines) for t, t2 in zip(s["turns"], s2["turns"])
            for k in set(t) | set(t2) if t.get(k) != t2.get(k)]
    assert pg_lines == lite_lines, diff


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on `port` (a worker binds once its app is built)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":
                inodes.add(f"socket:[{f[9]}]")
    try:
        return any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def test_serve_workers_share_the_port_and_die_with_their_parent(random_model_dir, pg_url, tmp_path):
    port = free_port()
    parent = start_gateway(random_model_dir, pg_url, tmp_path / "gw", port, "--workers", "3")
    workers: list[int] = []
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # every worker listening on the shared port: each its own PID
            workers = _children(parent.pid)
            if len(workers) == 3 and all(_listening(w, port) for w in workers):
                break
            assert parent.poll() is None, parent.stdout.read()[-3000:]
            time.sleep(0.5)
        assert len(workers) == 3 and len(set(workers)) == 3 and parent.pid not in workers
        assert all(_listening(w, port) for w in workers) and not _listening(parent.pid, port)
        said = converse([port], 6, "s-workers", "gamma")  # a new connection per request: spread by the kernel
        store = open_store(pg_url, spill_path=tmp_path / "spill.jsonl")
        try:
            linked_as_one_gateway_would(store.session_turns("s-workers"), said)
        finally:
            store.close()
        parent.kill()  # SIGKILL: no forwarding; the workers' parent-death signal ends them
        parent.wait(10)
        deadline = time.time() + 90
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.5)
        assert not any(_alive(w) for w in workers), "a worker outlived its parent"
    finally:
        stop(parent)
        for w in workers:  # only if the assertion above failed: never leave one running
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def test_a_store_server_that_goes_away_is_a_503_never_a_hang(engine, random_model_dir, tmp_path):
    """A request that begins while the server is unreachable cannot get its index: a 503 `store_unavailable`
    with Retry-After, at once; the turn finished before it is in the store."""
    import openai

    from clawloop.store.pg_local import LocalPostgres, missing
    from conftest import Gateway, require_or_skip

    require_or_skip("postgres", missing())
    pg = LocalPostgres().start()
    g = None
    try:
        g = Gateway(engine, random_model_dir, tmp_path / "data", store=pg.url)
        c = g.client()
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                  extra_headers={"X-Session-Id": "s"})
        assert [t.index for t in g.store.session_turns("s")] == [0]
        pg.stop()
        t0 = time.time()
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], max_tokens=4,
                                      extra_headers={"X-Session-Id": "s"})
        assert e.value.status_code == 503 and "store_unavailable" in str(e.value.body)
        assert e.value.response.headers.get("retry-after") == "2" and time.time() - t0 < 15
        assert httpx.get(g.url + "/health", timeout=10).status_code in (200, 503)  # the gateway still answers
    finally:
        if g is not None:
            g.stop()
        pg.stop()


def test_a_claim_waiting_on_a_session_lock_does_not_stall_other_sessions(engine, random_model_dir, pg_url, tmp_path):
    """A request's claim takes its session's row lock, which another gateway may hold for a while; the
    claim runs off the event loop (`Capture.begin_async`), so this gateway goes on serving the other
    sessions meanwhile. Here another connection holds session "busy"'s lock: a request of "busy" waits,
    one of "free" is answered, and once the lock is let go "busy"'s request completes, both stored."""
    from clawloop.store.postgres import PgConnection
    from conftest import Gateway

    g = Gateway(engine, random_model_dir, tmp_path / "data", store=pg_url)
    holder = PgConnection(pg_url)
    try:
        c = g.client()

        def ask(session: str, text: str) -> str:
            r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=4,
                                          extra_headers={"X-Session-Id": session}, timeout=120)
            return r.choices[0].message.content

        ask("busy", "first")
        holder.execute("BEGIN")
        holder.execute("SELECT next_index FROM sessions WHERE session_id=? FOR UPDATE", ("busy",)).fetchall()
        waiting = {}
        t = threading.Thread(target=lambda: waiting.setdefault("answer", ask("busy", "second")))
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "the request of the locked session did not wait for the lock"
        t0 = time.time()
        ask("free", "hello")  # answered while "busy"'s claim waits on the lock
        assert time.time() - t0 < 60 and t.is_alive()
        holder.execute("COMMIT")
        t.join(120)
        assert not t.is_alive() and "answer" in waiting
        assert [x.index for x in g.store.session_turns("busy")] == [0, 1]
        assert [x.index for x in g.store.session_turns("free")] == [0]
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        g.stop()
