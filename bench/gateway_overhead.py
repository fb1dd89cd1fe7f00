"""What the gateway and capture add on top of the engine.

Same model, same prompt, greedy decoding (so both paths produce the same
tokens): the hf engine called in-process vs `clawloop serve` (capture on, a
real SQLite store) over loopback HTTP, at concurrency 1 and 32, streaming and
not. The server runs in its own process; the engine for the direct path lives
in this one and is idle while the server is measured, and the other way round.
Rounds alternate direct/gateway so drift on a shared machine hits both.

The gateway is measured with two clients: a minimal keep-alive HTTP/1.1
client on asyncio streams (its own cost is a few tens of microseconds, so the
difference to direct is the server's: HTTP, JSON, rendering, capture) and
httpx, the client the openai SDK is built on (what an SDK user sees).

    .venv/bin/python bench/gateway_overhead.py [--model DIR] [--rounds 3]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MESSAGES = [{"role": "user", "content": "What is 12+7?"}]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


async def run_direct(engine, prompt_ids, n: int, conc: int, max_tokens: int) -> tuple[list[float], float]:
    from clawloop.engines.base import GenerationRequest, SamplingParams

    lat: list[float] = []
    sem = asyncio.Semaphore(conc)

    async def one():
        async with sem:
            t = time.perf_counter()
            async for _ in engine.generate(GenerationRequest(prompt_ids, SamplingParams(temperature=0.0,
                                                                                        max_tokens=max_tokens))):
                pass
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return lat, n / (time.perf_counter() - t0)


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: the least client-side
    cost a loopback request can have, so what remains is the server's."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: bytes, headers: dict[str, str]) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n{head}\r\n".encode() + payload)
        r = self.reader
        status, *lines = (await r.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        if " 200 " not in status + " ":
            raise RuntimeError(f"HTTP error: {status}")
        fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
        if "content-length" in fields:
            return await r.readexactly(int(fields["content-length"]))
        body = []  # chunked (the SSE stream)
        while True:
            size = int((await r.readuntil(b"\r\n")).strip(), 16)
            chunk = await r.readexactly(size + 2)
            if size == 0:
                return b"".join(body)
            body.append(chunk[:-2])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_gateway(url: str, n: int, conc: int, max_tokens: int, stream: bool,
                      client_kind: str = "httpx") -> tuple[list[float], float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if client_kind == "raw":
        payload = json.dumps(body).encode()
        pool = [RawConnection(int(url.rsplit(":", 1)[1])) for _ in range(conc)]

        async def one_raw(i: int):
            async with sem:
                conn = pool.pop()
                t = time.perf_counter()
                data = await conn.post("/v1/chat/completions", payload, {"X-Session-Id": f"bench-{i}"})
                lat.append(time.perf_counter() - t)
                pool.append(conn)
                if stream and not data.rstrip().endswith(b"data: [DONE]"):
                    raise RuntimeError("stream did not end with [DONE]")

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(one_raw(i) for i in range(n)))
        finally:
            for conn in pool:
                conn.close()
        return lat, n / (time.perf_counter() - t0)

    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=conc + 4)) as client:
        async def one(i: int):
            async with sem:
                t = time.perf_counter()
                headers = {"X-Session-Id": f"bench-{i}"}
                if stream:
                    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                        r.raise_for_status()
                        async for _ in r.aiter_lines():
                            pass
                else:
                    r = await client.post("/v1/chat/completions", json=body, headers=headers)
                    r.raise_for_status()
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return lat, n / (time.perf_counter() - t0)


def start_server(model: str, data_dir: str, port: int, threads: int, admit_wait_ms: float) -> subprocess.Popen:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--model-path", model,
                             "--data-dir", data_dir, "--port", str(port), "--model-max-batch-size", "32",
                             "--model-threads", str(threads), "--model-admit-wait-ms", str(admit_wait_ms)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("server did not come up")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF model dir (default: the tiny model, built if missing)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n1", type=int, default=24, help="requests per round at concurrency 1")
    ap.add_argument("--n32", type=int, default=96, help="requests per round at concurrency 32")
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--threads", type=int, default=0, help="torch threads of both engines (0: torch's default)")
    ap.add_argument("--admit-wait-ms", type=float, default=0.0, help="model.admit_wait_ms of both engines")
    a = ap.parse_args(argv)

    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt

    model = a.model
    if not model:
        from clawloop.tinymodel.build import build_tiny_model, default_model_dir

        model = str(default_model_dir())
        if not Path(model).exists():
            build_tiny_model()
    data = tempfile.mkdtemp(prefix="clawloop-bench-")
    proc = start_server(model, data, a.port, a.threads, a.admit_wait_ms)
    url = f"http://127.0.0.1:{a.port}"
    engine = HFEngine(model, device="cpu", max_batch_size=32, threads=a.threads, admit_wait_ms=a.admit_wait_ms)
    prompt_ids = render_prompt(engine.tokenizer, MESSAGES, None)
    results: dict[str, dict[str, list[float]]] = {}

    async def go():
        await engine.start()
        try:
            # warm both paths
            await run_direct(engine, prompt_ids, 4, 4, a.max_tokens)
            await run_gateway(url, 4, 4, a.max_tokens, False)
            for _ in range(a.rounds):
                for conc, n in ((1, a.n1), (32, a.n32)):
                    for stream in (False, True):
                        key = f"c{conc}-{'stream' if stream else 'plain'}"
                        r = results.setdefault(key, {k: [] for k in ("direct", "raw", "httpx", "direct_rps",
                                                                         "raw_rps", "httpx_rps")})
                        lat, rps = await run_direct(engine, prompt_ids, n, conc, a.max_tokens)
                        r["direct"] += lat
                        r["direct_rps"].append(rps)
                        for kind in ("raw", "httpx"):
                            lat, rps = await run_gateway(url, n, conc, a.max_tokens, stream, kind)
                            r[kind] += lat
                            r[f"{kind}_rps"].append(rps)
        finally:
            await engine.stop()

    try:
        asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    rows = []
    print("gateway = raw HTTP/1.1 client (server cost only); httpx = the client the openai SDK uses")
    print(f"{'case':<12} {'direct p50':>10} {'gw p50':>8} {'+p50':>7} {'ratio':>6} {'httpx p50':>9} {'+p50':>7} "
          f"{'direct p99':>10} {'gw p99':>8} {'direct r/s':>10} {'gw r/s':>7} {'httpx r/s':>9}")
    for key, r in results.items():
        d50, g50, h50 = (statistics.median(r[k]) for k in ("direct", "raw", "httpx"))
        d99, g99 = pct(r["direct"], 99), pct(r["raw"], 99)
        drps, grps, hrps = (statistics.median(r[k]) for k in ("direct_rps", "raw_rps", "httpx_rps"))
        row = {"case": key, "direct_p50_ms": d50 * 1e3, "gateway_p50_ms": g50 * 1e3,
               "added_p50_ms": (g50 - d50) * 1e3, "p50_ratio": g50 / d50, "httpx_p50_ms": h50 * 1e3,
               "httpx_added_p50_ms": (h50 - d50) * 1e3, "direct_p99_ms": d99 * 1e3, "gateway_p99_ms": g99 * 1e3,
               "direct_rps": drps, "gateway_rps": grps, "httpx_rps": hrps}
        rows.append(row)
        print(f"{key:<12} {d50 * 1e3:>8.2f}ms {g50 * 1e3:>6.2f}ms {row['added_p50_ms']:>7.2f} {g50 / d50:>6.3f} "
              f"{h50 * 1e3:>7.2f}ms {row['httpx_added_p50_ms']:>7.2f} {d99 * 1e3:>8.1f}ms {g99 * 1e3:>6.1f}ms "
              f"{drps:>10.1f} {grps:>7.1f} {hrps:>9.1f}")
    print(json.dumps({"bench": "gateway_overhead", "model": model, "rounds": a.rounds, "max_tokens": a.max_tokens, "threads": a.threads,
                      "admit_wait_ms": a.admit_wait_ms,
                      "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
