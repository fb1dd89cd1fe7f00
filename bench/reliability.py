"""Reliability under load and faults: does the gateway stay correct and bounded?

Starts `clawloop serve` in a child process (127.0.0.1) on a model folder and runs,
in one process:

1. load     -- `--sessions` (64) concurrent streaming sessions, each a loop of
               requests in its own session (X-Session-Id), for `--load-s` (120) s:
               errors, latency p50/p99, server RSS at start and end (memory flat?).
2. overload -- the server restarted with `--max-concurrent-generations 4
               --max-queued-requests 8`, then 200 simultaneous requests: how many 200s,
               how many 429s (with Retry-After), how many timeouts (goal 0).
3. kill -9  -- traffic through the official `openai` client, `kill -9` of the
               server mid-traffic, restart on the same data dir: answers the clients
               received vs turns in the store (goal: every answered turn stored).

    .venv/bin/python bench/reliability.py [--model DIR] [--sessions 64] [--load-s 120]

Without --model, a randomly initialised model of the tiny model's shape (4 layers,
128 wide) is built in seconds. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def rss_mb(pid: int) -> float:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, model: str, data_dir: str, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "clawloop.cli", "serve", "--model-path", model, "--data-dir", data_dir,
               "--host", "127.0.0.1", "--port", str(self.port), *extra]
        self.log = open(Path(data_dir).parent / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("server did not become healthy")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        self.log.close()


async def load_phase(url: str, sessions: int, seconds: float, max_tokens: int, pid: int) -> dict:
    lat: list[float] = []
    errors: dict[str, int] = {}
    done = 0
    stop_at = time.monotonic() + seconds

    async def session(k: int, client: httpx.AsyncClient) -> None:
        nonlocal done
        msgs = [{"role": "user", "content": f"What is {k}+{k}?"}]
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            text = []
            try:
                async with client.stream("POST", url + "/v1/chat/completions", headers={"X-Session-Id": f"load-{k}"},
                                         json={"model": "m", "messages": msgs, "stream": True,
                                               "max_tokens": max_tokens}) as r:
                    if r.status_code != 200:
                        errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
                        await r.aread()
                        await asyncio.sleep(0.5)
                        continue
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            d = json.loads(line[6:])
                            if "error" in d:
                                errors["stream_error"] = errors.get("stream_error", 0) + 1
                            for ch in d.get("choices") or []:
                                text.append((ch.get("delta") or {}).get("content") or "")
            except httpx.HTTPError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            lat.append(time.perf_counter() - t0)
            done += 1
            msgs = msgs + [{"role": "assistant", "content": "".join(text)},
                           {"role": "user", "content": "Thanks! And what is 3+4?"}]
            if len(msgs) > 9:  # keep prompts short: a new conversation in the same session
                msgs = msgs[-1:]

    rss: list[float] = []

    async def sample_rss() -> None:  # a series, not two points: warm-up growth vs a steady climb
        while time.monotonic() < stop_at:
            rss.append(round(rss_mb(pid), 1))
            await asyncio.sleep(seconds / 8)

    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        await asyncio.gather(sample_rss(), *(session(k, client) for k in range(sessions)))
    return {"requests": done, "errors": errors, "p50_s": statistics.median(lat) if lat else float("nan"),
            "p99_s": pct(lat, 0.99), "rps": done / seconds, "rss_series_mb": rss}


async def overload_phase(url: str, n: int, max_tokens: int) -> dict:
    codes: dict[str, int] = {}
    retry_after = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal retry_after
        try:
            r = await client.post(url + "/v1/chat/completions", json={
                "model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]})
            codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
            if r.status_code == 429 and r.headers.get("retry-after"):
                retry_after += 1
        except httpx.TimeoutException:
            codes["timeout"] = codes.get("timeout", 0) + 1
        except httpx.HTTPError as e:
            codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1

    limits = httpx.Limits(max_connections=n + 8)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(n)))
    return {"codes": codes, "with_retry_after": retry_after, "seconds": time.perf_counter() - t0}


def kill9_phase(model: str, data_dir: str, seconds: float, workers: int = 8) -> dict:
    """Answers received vs turns stored across a kill -9 and a restart."""
    import threading

    import openai

    srv = Server(model, data_dir)
    answered: list[str] = []
    stop = threading.Event()

    def worker(w: int) -> None:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        i = 0
        while not stop.is_set():
            i += 1
            rid = f"k9-{w}-{i}"
            try:
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Question {rid}"}],
                                          max_tokens=16, extra_headers={"X-Session-Id": rid})
                answered.append(rid)
            except Exception:  # noqa: BLE001  (the kill cuts requests in flight: expected)
                pass

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    srv.proc.kill()  # SIGKILL mid-traffic
    stop.set()
    for t in threads:
        t.join(timeout=60)
    srv.proc.wait()
    srv.log.close()
    n_answered = len(answered)
    srv2 = Server(model, data_dir)  # the restart: recovers what was pending / spilled
    time.sleep(1.0)
    srv2.stop()
    db = sqlite3.connect(str(Path(data_dir) / "clawloop.db"))
    stored = {r[0] for r in db.execute("SELECT DISTINCT session_id FROM turns WHERE response_ids != '[]'")}
    db.close()
    missing = [a for a in answered if a not in stored]
    return {"answered": n_answered, "stored_answered": n_answered - len(missing), "missing": len(missing)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--load-s", type=float, default=120.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--overload-n", type=int, default=200)
    ap.add_argument("--kill-after-s", type=float, default=15.0)
    ap.add_argument("--only", choices=("load", "overload", "kill9"), default=None)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="clawloop-reliability-"))
    model = a.model
    if not model:
        from clawloop.tinymodel.build import build_random_model

        model = str(build_random_model(work / "model", layers=4, hidden=128, seed=0))
    out: dict = {"bench": "reliability", "model": model if a.model else "random 4x128 (tiny model shape)"}

    if a.only in (None, "load"):
        srv = Server(model, str(work / "data-load"))
        rss0 = rss_mb(srv.proc.pid)
        load = asyncio.run(load_phase(srv.url, a.sessions, a.load_s, a.max_tokens, srv.proc.pid))
        rss1 = rss_mb(srv.proc.pid)
        srv.stop()
        out["load"] = L = {**load, "sessions": a.sessions, "seconds": a.load_s, "rss_start_mb": round(rss0, 1),
                           "rss_end_mb": round(rss1, 1)}
        print(f"load     {L['sessions']} streaming sessions x {L['seconds']:.0f} s: {L['requests']} requests "
              f"({L['rps']:.1f}/s), errors {L['errors'] or 0}, p50 {L['p50_s'] * 1000:.0f} ms, "
              f"p99 {L['p99_s'] * 1000:.0f} ms, RSS {L['rss_start_mb']:.0f} -> {L['rss_end_mb']:.0f} MB "
              f"(series {L['rss_series_mb']})")
    if a.only in (None, "overload"):
        srv = Server(model, str(work / "data-overload"), "--max-concurrent-generations", "4",
                     "--max-queued-requests", "8")
        out["overload"] = O = asyncio.run(overload_phase(srv.url, a.overload_n, a.max_tokens))
        srv.stop()
        print(f"overload {a.overload_n} at once (max 4 running, 8 queued): {O['codes']}, "
              f"429s with Retry-After {O['with_retry_after']}, {O['seconds']:.1f} s")
    if a.only in (None, "kill9"):
        out["kill9"] = K = kill9_phase(model, str(work / "data-kill9"), a.kill_after_s)
        print(f"kill -9  answered {K['answered']}, stored {K['stored_answered']}, missing {K['missing']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
