"""The gateway in front of a stand-in vLLM that takes time per token: direct vs gateway, side by side.

Issue #30 item 2's goal (gateway >= 0.9x vLLM-direct requests/s at c32, p50 <= 1.1x) measured with the
model's cost replaced by a pace: `bench/vllm_stub.py --step-ms S` answers `/inference/v1/generate`
with one token every S ms per request, all requests at once (a batching engine whose step costs
nothing), in its own process. In front of it `clawloop serve --backend vllm --engine-url STUB`
(capture on, a real SQLite store, judge and trainer off). Paths, the same raw keep-alive HTTP/1.1
client (`gateway_overhead.RawConnection`), one connection per concurrent client:

- direct:  the stub's `/inference/v1/generate`, the body clawloop's engine sends (prompt ids in,
           ids and logprobs out; `stream` as the case says);
- gateway: `/v1/chat/completions` through the gateway.

Cases c1 and c32, plain and stream; each round runs every case on both paths in turn (order
alternating), figures are medians over rounds, ratios medians of per-round ratios. What it shows:
what the gateway adds when the engine's time is a fixed pace and the gateway has the rest of the
machine; what it cannot show: vLLM's own API server, which competes for the same cores on CPU
(bench/vllm_engine.py measures that, `--pin` to separate them).

    .venv/bin/python bench/vllm_paced.py [--step-ms 10] [--max-tokens 32] [--rounds 3] [--n32 256]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from gateway_ceiling import stop, wait_http  # noqa: E402
from gateway_overhead import RawConnection, pct  # noqa: E402
from vllm_engine import MESSAGES, free_port, generate_body, prompt_and_eos  # noqa: E402

CASES = ((1, False), (1, True), (32, False), (32, True))


async def run(port: int, route: str, payload: bytes, n: int, conc: int) -> tuple[list[float], float]:
    """`n` requests, `conc` at a time, one keep-alive connection per client: latencies, requests/s."""
    pool = [RawConnection(port) for _ in range(conc)]
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            conn = pool.pop()
            t = time.perf_counter()
            data = await conn.post(route, payload, {"X-Session-Id": f"paced-{i}"})
            lat.append(time.perf_counter() - t)
            pool.append(conn)
            if not data:
                raise RuntimeError(f"{route}: empty reply")

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for c in pool:
            c.close()
    return lat, n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF folder for the tokenizer (default: a random model built here)")
    ap.add_argument("--step-ms", type=float, default=10.0, help="the stub's time per token (ms)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n1", type=int, default=16)
    ap.add_argument("--n32", type=int, default=256)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more flag for the gateway's `clawloop serve`, e.g. --serve-arg=--no-gc-freeze")
    a = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="clawloop-bench-paced-")
    model = a.model
    if not model:
        from clawloop.tinymodel.build import build_random_model

        model = str(build_random_model(Path(tmp) / "model", layers=2, hidden=64, seed=0))
    prompt_ids, eos = prompt_and_eos(model)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
    stub_port, gw_port = free_port(), free_port()
    stub = subprocess.Popen([sys.executable, str(ROOT / "bench/vllm_stub.py"), "--model", model, "--port",
                             str(stub_port), "--step-ms", str(a.step_ms)], env=env, stdout=subprocess.DEVNULL)
    gw = None
    results = {f"c{c}-{'stream' if s else 'plain'}": {p: {"p50": [], "p99": [], "rps": [], "lat": []}
                                                    for p in ("direct", "gateway")} for c, s in CASES}
    try:
        wait_http(f"http://127.0.0.1:{stub_port}/health", stub)
        gw = subprocess.Popen([str(Path(sys.executable).parent / "clawloop"), "serve", "--backend", "vllm",
                               "--engine-url", f"http://127.0.0.1:{stub_port}", "--model-path", model,
                               "--port", str(gw_port), "--data-dir", str(Path(tmp) / "data"), *a.serve_arg],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{gw_port}/health", gw)
        print(f"stub pid {stub.pid} ({a.step_ms:g} ms/token), gateway pid {gw.pid}", flush=True)

        def bodies(stream: bool) -> dict[str, tuple[int, str, bytes]]:
            gen = dict(generate_body(prompt_ids, a.max_tokens, eos), stream=stream)
            chat = {"model": "m", "messages": MESSAGES, "max_tokens": a.max_tokens, "temperature": 0,
                    "stream": stream}
            return {"direct": (stub_port, "/inference/v1/generate", json.dumps(gen).encode()),
                    "gateway": (gw_port, "/v1/chat/completions", json.dumps(chat).encode())}

        for stream in (False, True):  # warm both paths
            for port, route, payload in bodies(stream).values():
                asyncio.run(run(port, route, payload, 8, 4))
        for rnd in range(a.rounds):
            for conc, stream in CASES:
                order = ("direct", "gateway") if rnd % 2 == 0 else ("gateway", "direct")
                b = bodies(stream)
                for p in order:
                    time.sleep(0.5)
                    lat, rps = asyncio.run(run(*b[p], a.n1 if conc == 1 else a.n32, conc))
                    r = results[f"c{conc}-{'stream' if stream else 'plain'}"][p]
                    r["p50"].append(statistics.median(lat))
                    r["p99"].append(pct(lat, 99))
                    r["rps"].append(rps)
                    r["lat"] += lat
            print(f"round {rnd + 1}/{a.rounds} done", flush=True)
        gc_stats = {k.removeprefix("clawloop_gateway_"): float(v) for k, v in (
            ln.split()[:2] for ln in httpx.get(f"http://127.0.0.1:{gw_port}/metrics", timeout=10).text.splitlines()
            if ln.startswith("clawloop_gateway_gc_"))}
    finally:
        if gw is not None:
            stop(gw)
        stop(stub)
        shutil.rmtree(tmp, ignore_errors=True)  # the random model, the gateway's store

    rows = []
    print(f"\nstub {a.step_ms:g} ms per token, max_tokens {a.max_tokens} (ideal latency "
          f"{a.step_ms * a.max_tokens:.0f} ms); {a.rounds} rounds")
    print(f"{'case':<10} {'direct p50':>10} {'req/s':>7} {'gw p50':>8} {'p99':>7} {'req/s':>7} "
          f"{'gw/direct p50':>14} {'req/s':>6}")
    for key, case in results.items():
        d, g = case["direct"], case["gateway"]
        rp50 = statistics.median(x / y for x, y in zip(g["p50"], d["p50"]))
        rrps = statistics.median(x / y for x, y in zip(g["rps"], d["rps"]))
        print(f"{key:<10} {statistics.median(d['p50']) * 1e3:>10.1f} {statistics.median(d['rps']):>7.1f} "
              f"{statistics.median(g['p50']) * 1e3:>8.1f} {pct(g['lat'], 99) * 1e3:>7.1f} "
              f"{statistics.median(g['rps']):>7.1f} {rp50:>14.3f} {rrps:>6.3f}")
        rows.append({"case": key, "direct": {"p50_ms": round(statistics.median(d["p50"]) * 1e3, 1),
                                             "rps": round(statistics.median(d["rps"]), 1)},
                     "gateway": {"p50_ms": round(statistics.median(g["p50"]) * 1e3, 1),
                                 "p99_ms": round(pct(g["lat"], 99) * 1e3, 1),
                                 "rps": round(statistics.median(g["rps"]), 1)},
                     "gateway_over_direct_p50": round(rp50, 3), "gateway_over_direct_rps": round(rrps, 3)})
    by = {r["case"]: r for r in rows}
    ok = all(by[k]["gateway_over_direct_rps"] >= 0.9 and by[k]["gateway_over_direct_p50"] <= 1.1
             for k in ("c32-plain", "c32-stream"))
    print(f"\ngateway's garbage collector: {gc_stats}")
    print(f"goal at c32 (req/s >= 0.9x, p50 <= 1.1x, plain and stream): {'met' if ok else 'NOT met'}")
    print(json.dumps({"bench": "vllm_paced", "step_ms": a.step_ms, "max_tokens": a.max_tokens,
                      "rounds": a.rounds, "serve_args": a.serve_arg, "gc": gc_stats, "goal_met": ok, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
