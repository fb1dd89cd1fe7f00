"""Requests/s and tokens/s of 1, 2, 4 gateway processes on one PostgreSQL store (`clawloop serve --workers N`).

    .venv/bin/python bench/multi_gateway.py [--workers 1,2,4] [--requests 96] [--concurrency 8] [--max-tokens 16]

Each run starts a throwaway PostgreSQL server (clawloop.store.pg_local, Debian's binaries) and, per N, one
`clawloop serve --workers N --store postgresql://...` on a fresh database. `--sessions` conversations run at
once, `--concurrency` requests in flight in all; each request continues its conversation (its history holds the
answers served before), so every request is linked through the store, whichever worker serves it. A new HTTP
connection per request lets the kernel spread them over the workers (SO_REUSEPORT). Printed per N: wall time,
requests/s, completion tokens/s, p50/p95 latency, and the links found in the store afterwards (turns with a
next state / turns that should have one), so a fast run that lost its linking shows.

`--backend bench` (a token generator with no model cost) is used when this clawloop has it; otherwise the
embedded tiny model on the hf engine, one torch thread per worker: then the figures measure the model on this
machine's cores as much as the gateways, and say so in their header.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from clawloop.store import open_store  # noqa: E402
from clawloop.store.pg_local import LocalPostgres, _free_port  # noqa: E402


def has_bench_backend() -> bool:
    from clawloop.config import ModelConfig

    return "bench" in (ModelConfig.__dataclass_fields__["backend"].metadata.get("choices") or ())


def start(n: int, url: str, data: Path, port: int, backend: list[str]) -> subprocess.Popen:
    store = ["--store", url] if url else []  # none: the SQLite file in the data dir (the baseline)
    cmd = [sys.executable, "-m", "clawloop.cli", "serve", "--workers", str(n), *store, "--data-dir", str(data),
           "--port", str(port), "--log-level", "warning", *backend]
    return subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_up(proc: subprocess.Popen, port: int, n: int, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    ok = 0
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read()[-3000:])
        try:  # every worker answers: as many /health answers in a row as workers, from distinct connections
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                ok += 1
        except httpx.HTTPError:
            ok = 0
        if ok >= 4 * n and len(children(proc.pid)) == (n if n > 1 else 0):  # --workers 1 serves in-process
            return
        time.sleep(0.25)
    raise RuntimeError("workers did not come up")


def load(port: int, sessions: int, requests: int, concurrency: int, max_tokens: int) -> dict:
    per = requests // sessions
    lat: list[float] = []
    tokens = 0
    errors = 0
    lock = threading.Lock()
    sem = threading.Semaphore(concurrency)

    def conversation(s: int) -> None:
        nonlocal tokens, errors
        messages = [{"role": "system", "content": "You are brief."}]
        for k in range(per):
            messages.append({"role": "user", "content": f"session {s} question {k}: what is {s} plus {k}?"})
            with sem:
                t0 = time.perf_counter()
                try:
                    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600,
                                   headers={"X-Session-Id": f"bench-{s}", "Connection": "close"},
                                   json={"model": "m", "messages": messages, "max_tokens": max_tokens,
                                         "temperature": 1.0, "seed": k})
                    r.raise_for_status()
                    body = r.json()
                except httpx.HTTPError:
                    with lock:
                        errors += 1
                    return
                dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                tokens += body["usage"]["completion_tokens"]
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"] or ""})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(s,)) for s in range(sessions)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {"wall": wall, "done": len(lat), "errors": errors, "rps": len(lat) / wall, "tps": tokens / wall,
            "p50": statistics.median(lat) if lat else float("nan"),
            "p95": lat[int(0.95 * (len(lat) - 1))] if lat else float("nan")}


def links(url: str, spill: Path) -> tuple[int, int]:
    st = open_store(url, spill_path=spill) if url.startswith("postgresql://") else open_store(url)
    try:
        have = want = 0
        for _, turns in st.iter_sessions():
            want += len(turns) - 1
            have += sum(t.next_state is not None for t in turns[:-1])
        return have, want
    finally:
        st.close()


def store_round_trips(url: str, spill: Path, requests: int = 300, sessions: int = 30) -> dict:
    """What a request's two synchronous store calls cost (capture's begin and end over a shared store): the
    time a gateway's event loop waits per request, without HTTP or engine. Conversations of 10 requests,
    each linking the previous answer (rule 1), a 600-id prompt growing by 40 ids a turn (chunks shared)."""
    import hashlib

    from clawloop.records import Turn

    st = open_store(url, spill_path=spill)
    begin, end = [], []
    try:
        for r in range(requests):
            sid, k = f"rt-{r % sessions}", r // sessions
            prompt = list(range(600 + 40 * k))
            t = Turn(session_id=sid, index=0, type="main", messages=[{"role": "user", "content": f"q{k}"}] * (k + 1),
                     prompt_ids=prompt, finish_reason="pending", policy_version=-1, trainable=False,
                     request_id=f"key{r}", created_at=time.time())
            prev = hashlib.blake2b(f"{sid}/{k - 1}".encode(), digest_size=16).digest()
            t0 = time.perf_counter()
            claim = st.claim_turn(t, new_session_id=None, answer_keys=[prev] if k else [],
                                  request_hash=hashlib.blake2b(f"req{r}".encode(), digest_size=16).digest(),
                                  next_state={"role": "user", "content": f"q{k}"} if k else None, echoed=None)
            begin.append(time.perf_counter() - t0)
            done = Turn(session_id=sid, index=claim.index, type="main", messages=t.messages, prompt_ids=prompt,
                        response_ids=list(range(16)), response_logprobs=[-1.0] * 16, response_text=f"a{k}",
                        finish_reason="stop", policy_version=0, request_id=f"r{r}", created_at=time.time())
            t0 = time.perf_counter()
            st.finish_claimed([done], f"key{r}", True,
                              [(hashlib.blake2b(f"{sid}/{k}".encode(), digest_size=16).digest(), f"a{k}")])
            end.append(time.perf_counter() - t0)
        linked = sum(t.next_state is not None for s_ in range(sessions) for t in st.session_turns(f"rt-{s_}"))
    finally:
        st.close()
    ms = lambda xs, q: 1000 * sorted(xs)[int(q * (len(xs) - 1))]  # noqa: E731
    return {"begin_p50": ms(begin, 0.5), "begin_p95": ms(begin, 0.95), "end_p50": ms(end, 0.5),
            "end_p95": ms(end, 0.95), "linked": linked, "want": requests - sessions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--round-trips", action="store_true",
                    help="Only time capture's two synchronous store calls per request (no HTTP, no engine).")
    ap.add_argument("--sqlite-baseline", action="store_true",
                    help="First the same load on one gateway over the SQLite store (no --store), side by side.")
    a = ap.parse_args()
    if a.round_trips:
        with LocalPostgres() as pg, tempfile.TemporaryDirectory(prefix="clawloop-bench-") as tmp:
            r = store_round_trips(pg.create_database("rt"), Path(tmp) / "spill.jsonl")
        print(f"claim_turn (begin) p50 {r['begin_p50']:.2f} ms, p95 {r['begin_p95']:.2f} ms; finish_claimed (end) "
              f"p50 {r['end_p50']:.2f} ms, p95 {r['end_p95']:.2f} ms; linked {r['linked']}/{r['want']}")
        return 0
    backend = ["--backend", "bench"] if has_bench_backend() else ["--model-threads", "1"]
    print(f"engine: {'bench (no model cost)' if backend else 'hf, embedded tiny model, 1 torch thread per worker'}; "
          f"{a.requests} requests in {a.sessions} sessions, {a.concurrency} in flight, max_tokens {a.max_tokens}; "
          f"{os.cpu_count()} CPUs", flush=True)
    print("| workers | wall s | req/s | completion tok/s | p50 s | p95 s | errors | linked |")
    print("|---|---|---|---|---|---|---|---|")
    with LocalPostgres() as pg, tempfile.TemporaryDirectory(prefix="clawloop-bench-") as tmp:
        runs = ([0] if a.sqlite_baseline else []) + [int(x) for x in a.workers.split(",")]
        for n in runs:
            url = pg.create_database(f"bench{n}") if n else ""
            n = n or 1
            port = _free_port()
            data = Path(tmp) / (f"d{n}" if url else "sqlite")
            proc = start(n, url, data, port, backend)
            try:
                wait_up(proc, port, n)
                r = load(port, a.sessions, a.requests, a.concurrency, a.max_tokens)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            have, want = links(url or str(data / "clawloop.db"), Path(tmp) / "spill.jsonl")
            print(f"| {n}{'' if url else ' (SQLite)'} | {r['wall']:.1f} | {r['rps']:.2f} | {r['tps']:.1f} | {r['p50']:.2f} | {r['p95']:.2f} | "
                  f"{r['errors']} | {have}/{want} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
