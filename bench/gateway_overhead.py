"""What the gateway and capture add on top of the engine.

Same model, same prompt, greedy decoding (so both paths produce the same
tokens): the hf engine called in-process vs `clawloop serve` (capture on, a
real SQLite store) over loopback HTTP, at concurrency 1 and 32, streaming and
not. The server runs in its own process; the engine for the direct path lives
in this one and is idle while the server is measured, and the other way round.
Rounds alternate direct/gateway so drift on a shared machine hits both.

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


async def run_gateway(url: str, n: int, conc: int, max_tokens: int, stream: bool) -> tuple[list[float], float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
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


def start_server(model: str, data_dir: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--model-path", model,
                             "--data-dir", data_dir, "--port", str(port), "--model-max-batch-size", "32"],
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
    proc = start_server(model, data, a.port)
    url = f"http://127.0.0.1:{a.port}"
    engine = HFEngine(model, device="cpu", max_batch_size=32)
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
                        r = results.setdefault(key, {"direct": [], "gateway": [], "direct_rps": [],
                                                     "gateway_rps": []})
                        lat, rps = await run_direct(engine, prompt_ids, n, conc, a.max_tokens)
                        r["direct"] += lat
                        r["direct_rps"].append(rps)
                        lat, rps = await run_gateway(url, n, conc, a.max_tokens, stream)
                        r["gateway"] += lat
                        r["gateway_rps"].append(rps)
        finally:
            await engine.stop()

    try:
        asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    rows = []
    print(f"{'case':<14} {'direct p50':>11} {'gw p50':>9} {'+p50 ms':>8} {'direct p99':>11} {'gw p99':>9} "
          f"{'direct r/s':>10} {'gw r/s':>8} {'e2e ratio':>9}")
    for key, r in results.items():
        d50, g50 = statistics.median(r["direct"]), statistics.median(r["gateway"])
        d99, g99 = pct(r["direct"], 99), pct(r["gateway"], 99)
        drps, grps = statistics.median(r["direct_rps"]), statistics.median(r["gateway_rps"])
        row = {"case": key, "direct_p50_ms": d50 * 1e3, "gateway_p50_ms": g50 * 1e3,
               "added_p50_ms": (g50 - d50) * 1e3, "direct_p99_ms": d99 * 1e3, "gateway_p99_ms": g99 * 1e3,
               "direct_rps": drps, "gateway_rps": grps, "p50_ratio": g50 / d50}
        rows.append(row)
        print(f"{key:<14} {d50 * 1e3:>9.1f}ms {g50 * 1e3:>7.1f}ms {row['added_p50_ms']:>8.2f} {d99 * 1e3:>9.1f}ms "
              f"{g99 * 1e3:>7.1f}ms {drps:>10.1f} {grps:>8.1f} {row['p50_ratio']:>9.3f}")
    print(json.dumps({"bench": "gateway_overhead", "model": model, "rounds": a.rounds, "max_tokens": a.max_tokens,
                      "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
