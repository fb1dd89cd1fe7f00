"""The gateway's ceiling: streamed tokens/s and requests/s one gateway process carries, capture on,
with an engine that costs nothing (issue #30 item 1).

Two engine paths, each behind a real `clawloop` gateway in its own process (capture on, a real
SQLite store and its writer thread, judge off):

- **bench**: the in-process bench engine (`--backend bench`, engines/bench.py), the path the hf
  engine takes (events handed to the gateway's event loop in-process);
- **vllm**: the vLLM engine (`VLLMEngine`, `HTTPReplica`, its httpx client and SSE parsing) attached
  with `--engine-url` to `bench/vllm_stub.py`, a stand-in vLLM server in its own process that speaks
  `/inference/v1/generate` as vLLM 0.32 does, emitting the same ids.

Clients: the raw keep-alive HTTP/1.1 client of `bench/gateway_overhead.py` (tens of µs per request),
in this process, concurrency c1 … c256, plain and streamed chat completions of `--max-tokens` tokens.
Per case: tokens/s (completion tokens the replies report), requests/s, p50 latency, and the gateway
process's CPU time per token (utime + stime from /proc, so its ceiling on one core is 1e6 / µs per
token, whatever the client and stub took from the shared cores).

Before/after in one run: `--rev REV` runs the same cases on a past revision's `src/clawloop`
(bench/revision.py), alternating with this tree's; the bench engine and the stub always come from
this tree (so both sides get the same ids). `--profile CASE` (e.g. `bench-stream-c64`) records the
gateway with py-spy for that case and prints where its samples go.

    .venv/bin/python bench/gateway_ceiling.py [--rev e70f448] [--rounds 2] [--max-tokens 128]
        [--levels 1,4,16,64,256] [--paths bench,vllm] [--profile bench-stream-c64]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gateway_overhead import RawConnection  # noqa: E402

# gateway_overhead puts this tree's src first; the gateway process must import the build it was given
sys.path[:] = [p for p in sys.path if p != str(ROOT / "src")]

MESSAGES = [{"role": "user", "content": "Tell me about the gateway."}]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the gateway process (`--serve`) -----------------------------------------------------------------
def serve(a: argparse.Namespace) -> int:
    """One gateway: this tree's or a past revision's clawloop (whichever PYTHONPATH names first)."""
    import uvicorn

    # the module's top took this tree's src off sys.path; the build this process was given is on PYTHONPATH
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

    from clawloop.apps.serve import build_app
    from clawloop.config import load_config

    flags = {"model__path": a.model, "data_dir": a.data_dir, "serve__port": a.port,
             "serve__max_concurrent_generations": 1024, "serve__status": False, "judge__kind": "none"}
    engine = None
    if a.path == "vllm":
        flags.update(model__backend="vllm", model__engine_urls=[a.stub_url])
    else:  # this tree's bench engine, loaded by file so a past revision's gateway can run it too
        spec = importlib.util.spec_from_file_location("bench_engine", ROOT / "src/clawloop/engines/bench.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        engine = mod.BenchEngine(a.model, tokens_per_step=a.tokens_per_step)
    if a.stream_interval_ms:
        flags["serve__stream_interval_ms"] = a.stream_interval_ms
    cfg = load_config(flags, env={})
    app, parts = build_app(cfg, judge=False, train=False, engine=engine)
    try:
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=a.port, log_level="warning",
                                      timeout_graceful_shutdown=10)).run()
    except KeyboardInterrupt:  # the bench's SIGINT after the graceful shutdown
        pass
    finally:
        parts.store.close()
    return 0


# -- the client ----------------------------------------------------------------------------------------
USAGE = re.compile(rb'"completion_tokens":(\d+)')


class Connection(RawConnection):
    """RawConnection, but a chunked (streamed) body is read in large reads up to its last chunk instead of
    chunk by chunk: the client's cost per streamed token stays far below the gateway's. The body comes
    back with its chunk framing (the bench only looks for the usage and `[DONE]` in it)."""

    async def post(self, path: str, payload: bytes, headers: dict[str, str]) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
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
        body = bytearray()
        while not body.endswith(b"\r\n0\r\n\r\n"):
            data = await r.read(1 << 20)
            if not data:
                raise RuntimeError("connection closed mid-stream")
            body += data
        return bytes(body)


async def load(port: int, n: int, conc: int, max_tokens: int, stream: bool) -> dict[str, float]:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    payload = json.dumps(body).encode()
    pool = [Connection(port) for _ in range(conc)]
    lat: list[float] = []
    tokens = 0
    nxt = 0

    async def worker() -> None:
        nonlocal tokens, nxt
        conn = pool.pop()
        try:
            while nxt < n:
                i, nxt = nxt, nxt + 1
                t = time.perf_counter()
                data = await conn.post("/v1/chat/completions", payload, {"X-Session-Id": f"ceil-{i % (4 * conc)}"})
                lat.append(time.perf_counter() - t)
                m = USAGE.findall(data[-400:] if stream else data)
                if not m or (stream and b"data: [DONE]" not in data[-64:]):
                    raise RuntimeError(f"bad reply: {data[-300:]!r}")
                tokens += int(m[-1])
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "req_s": n / wall, "p50_ms": statistics.median(lat) * 1e3,
            "tokens": tokens, "wall_s": wall}


class Gateway:
    """A gateway process (+ its vLLM stub on the vllm path) for one (build, path)."""

    def __init__(self, build: str, src: Path, path: str, model: str, port: int, stub_port: int,
                 tokens_per_step: int, interval_ms: float = 0.0):
        self.build, self.path, self.port = build, path, port
        self.data = tempfile.mkdtemp(prefix=f"ceiling-{build}-{path}-")
        # src first; what the caller's PYTHONPATH holds after it (a GPU machine's carried wheels)
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip("/").endswith("src")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src)] + rest), TOKENIZERS_PARALLELISM="false")
        self.stub = None
        if path == "vllm":
            self.stub = subprocess.Popen([sys.executable, str(ROOT / "bench/vllm_stub.py"), "--model", model,
                                          "--port", str(stub_port), "--tokens-per-step", str(tokens_per_step)],
                                         env=dict(env, PYTHONPATH=os.pathsep.join([str(ROOT / "src")] + rest)),
                                         stdout=subprocess.DEVNULL)
            try:
                wait_http(f"http://127.0.0.1:{stub_port}/health", self.stub)
            except BaseException:
                stop(self.stub)
                raise
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--path", path, "--model", model,
                                      "--data-dir", self.data, "--port", str(port),
                                      "--stub-url", f"http://127.0.0.1:{stub_port}",
                                      "--tokens-per-step", str(tokens_per_step),
                                      "--stream-interval-ms", str(interval_ms)], env=env,
                                     stdout=subprocess.DEVNULL)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", self.proc)
        except BaseException:  # nothing of ours left running when a gateway does not come up
            self.close()
            raise

    def close(self) -> None:
        stop(self.proc)
        if self.stub is not None:
            stop(self.stub)


# Where a sample's time goes: the first of these, from the innermost frame outwards, whose pattern is in
# the frame's file or function (so a tokenizer call made by the renderer counts as rendering).
CATEGORIES = [
    ("store writer thread", ("store/", "sqlite3", "writer.py")),
    ("detokenize + stop/tool text", ("Detokenizer", "TextStream", "ToolStream", "gateway/parsers/")),
    ("render prompt (chat template, tokenize)", ("render_messages", "PromptRenderer", "chat_template")),
    ("parse request", ("gateway/protocol.py",)),
    ("capture (sessions, linking)", ("gateway/capture.py",)),
    ("engine client (aiohttp, SSE parsing)", ("aiohttp/", "yarl/", "multidict/", "httpx/", "httpcore/", "anyio/",
                                              "engines/vllm.py", "engines/replicas.py")),
    ("engine (bench, in-process)", ("engines/bench.py",)),
    ("JSON (chunks, replies)", ("orjson", "json/encoder", "json/__init__", "InFlight.chunk", "_delta_chunk",
                                "render (starlette", "FastJSONResponse")),
    ("serving + endpoint (record, queue, drain)", ("gateway/serving.py", "gateway/chat.py", "gateway/app.py")),
    ("HTTP server (uvicorn, starlette, fastapi)", ("uvicorn/", "starlette/", "fastapi/", "h11")),
    ("event loop (uvloop, asyncio)", ("asyncio/", "runners.py", "uvloop")),
]


def categorize(frames: list[str]) -> str:
    for f in reversed(frames):
        for name, pats in CATEGORIES:
            if any(p in f for p in pats):
                return name
    return "other"


def profile(gw: Gateway, port: int, conc: int, stream: bool, max_tokens: int, seconds: float) -> tuple[str, dict]:
    """py-spy samples of the gateway under load: where they go by category (`CATEGORIES`), and the top
    functions by own time and by total time."""
    out = Path(gw.data) / "profile.txt"
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(gw.proc.pid), "-f", "raw",
                            "-o", str(out), "-d", str(int(seconds)), "-r", "100", "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    t_end = time.time() + seconds
    c0, tokens = cpu_s(gw.proc.pid), 0
    while time.time() < t_end:
        tokens += asyncio.run(load(port, max(conc * 2, 64), conc, max_tokens, stream))["tokens"]
    us_per_token = (cpu_s(gw.proc.pid) - c0) * 1e6 / max(1, tokens)
    try:
        spy.wait(timeout=seconds + 120)
    except subprocess.TimeoutExpired:  # py-spy stuck (a starved machine): no profile rather than no results
        spy.kill()
        spy.wait()
        return "py-spy did not finish", {}
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    cats: collections.Counter = collections.Counter()
    n = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        raw = stack.split(";")
        if raw and raw[0].startswith("thread "):
            raw = raw[1:]
        frames = [f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") if "(" in f else f for f in raw]
        c = int(count)
        n += c
        own[frames[-1]] += c
        cats[categorize(raw)] += c
        for f in set(frames):
            total[f] += c
    n = max(n, 1)
    lines = [f"py-spy: {n} samples (threads with work; idle waits left out), gateway CPU {us_per_token:.1f} µs/token "
             f"over the profile; by category (share of samples, and that share of the µs/token):"]
    lines += [f"  {100 * c / n:5.1f}%  {us_per_token * c / n:5.1f} µs  {k}" for k, c in cats.most_common()]
    lines += ["own time:"] + [f"  {100 * c / n:5.1f}%  {f}" for f, c in own.most_common(20)]
    lines += ["total time (incl. callees):"] + [f"  {100 * c / n:5.1f}%  {f}" for f, c in total.most_common(30)]
    return "\n".join(lines), {"us_per_token": us_per_token, "categories": {k: c / n for k, c in cats.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF folder for the tokenizer (default: a random model built here)")
    ap.add_argument("--rev", default="", help="also run this past revision's gateway, alternating (before/after)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,4,16,64,256")
    ap.add_argument("--paths", default="bench,vllm")
    ap.add_argument("--modes", default="plain,stream")
    ap.add_argument("--tokens-per-step", type=int, default=1, help="tokens per engine event (1: the hardest case)")
    ap.add_argument("--min-requests", type=int, default=32, help="requests per case: max(this, R x concurrency)")
    ap.add_argument("--per-client", type=int, default=2, help="R above: requests per client connection and case")
    ap.add_argument("--stream-interval-ms", type=float, default=0.0,
                    help="serve.stream_interval_ms of the 'now' gateways (not passed to --rev's)")
    ap.add_argument("--also-interval", type=float, default=0.0,
                    help="also run 'now' with this serve.stream_interval_ms, as a third build")
    ap.add_argument("--profile", default="", help="PATH-MODE-cC (e.g. bench-stream-c64): py-spy that case")
    ap.add_argument("--profile-s", type=float, default=15)
    ap.add_argument("--port", type=int, default=18900)
    ap.add_argument("--src", default=str(ROOT / "src"), help="the 'now' build's source folder (default: this tree's)")
    # --serve: the gateway process itself
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--stub-url", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve(a)

    model = a.model
    if not model:
        sys.path.insert(0, str(ROOT / "src"))
        from clawloop.tinymodel.build import build_random_model

        model = str(build_random_model(Path(tempfile.mkdtemp(prefix="ceiling-model-")) / "model", layers=2,
                                       hidden=64, seed=0))
    builds = [("now", Path(a.src))]
    if a.also_interval:
        builds.append((f"now+{a.also_interval:g}ms", Path(a.src)))
    if a.rev:
        from revision import unpack_source

        builds.append((a.rev, unpack_source(a.rev, Path(tempfile.mkdtemp(prefix="ceiling-rev-")))))
    levels = [int(x) for x in a.levels.split(",")]
    paths = a.paths.split(",")
    modes = a.modes.split(",")
    results: dict[tuple, list[dict[str, float]]] = collections.defaultdict(list)
    port = a.port
    profiles = {}
    for rnd in range(a.rounds):
        order = builds if rnd % 2 == 0 else builds[::-1]
        for path in paths:
            for build, src in order:
                port += 2
                interval = (a.also_interval if build.startswith("now+") else
                            a.stream_interval_ms if build == "now" else 0.0)
                gw = Gateway(build, src, path, model, port, port + 1, a.tokens_per_step, interval)
                try:
                    asyncio.run(load(port, 16, 4, a.max_tokens, True))  # warm up
                    for conc in levels:
                        for mode in modes:
                            n = max(a.min_requests, a.per_client * conc)
                            c0 = cpu_s(gw.proc.pid)
                            try:
                                r = asyncio.run(load(port, n, conc, a.max_tokens, mode == "stream"))
                            except RuntimeError as e:  # e.g. a 503: the stub starved past its health checks
                                print(f"round {rnd} {build} {path} {mode} c{conc}: failed: {e}", flush=True)
                                continue
                            r["cpu_us_per_token"] = (cpu_s(gw.proc.pid) - c0) * 1e6 / max(1, r["tokens"])
                            r["gw_cores"] = (cpu_s(gw.proc.pid) - c0) / r["wall_s"]
                            results[(build, path, mode, conc)].append(r)
                            print(f"round {rnd} {build:>8} {path:>5} {mode:>6} c{conc:<3} {r['tok_s']:8.0f} tok/s "
                                  f"{r['req_s']:7.1f} r/s p50 {r['p50_ms']:7.1f} ms  {r['cpu_us_per_token']:6.1f} "
                                  f"µs/token  gw {r['gw_cores']:.2f} cores", flush=True)
                    case = a.profile.split("-")
                    if a.profile and rnd == 0 and case[0] == path:
                        profiles[f"{build} {a.profile}"] = profile(gw, port, int(case[2][1:]), case[1] == "stream",
                                                                   a.max_tokens, a.profile_s)
                finally:
                    gw.close()
    rows = []
    base = builds[-1][0] if a.rev else ""
    print(f"\nmax_tokens {a.max_tokens}, tokens per engine event {a.tokens_per_step}; medians over {a.rounds} "
          f"round(s); µs/tok = the gateway process's CPU (user+sys) per completion token, ceil = 1e6 / µs/tok "
          f"(tokens/s one fully busy core would carry)" + (f"; ratios: tok/s and µs/tok vs {base}" if base else ""))
    print(f"{'path':>5} {'mode':>6} {'c':>4} " + "".join(f"| {b:>10}: tok/s  r/s  p50ms µs/tok  ceil " for b, _ in builds))
    for path in paths:
        for mode in modes:
            for conc in levels:
                row = {"path": path, "mode": mode, "conc": conc}
                line = f"{path:>5} {mode:>6} {conc:>4} "
                for build, _ in builds:
                    rs = results[(build, path, mode, conc)]
                    if not rs:
                        line += f"| {'failed':>40} "
                        continue
                    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    med["ceiling_tok_s"] = 1e6 / med["cpu_us_per_token"]
                    pairs = list(zip(rs, results[(base, path, mode, conc)])) if base and build != base else []
                    if pairs:
                        med["tok_s_ratio"] = statistics.median(n["tok_s"] / o["tok_s"] for n, o in pairs)
                        med["cpu_ratio"] = statistics.median(n["cpu_us_per_token"] / o["cpu_us_per_token"]
                                                             for n, o in pairs)
                    row[build] = med
                    line += (f"| {med['tok_s']:17.0f} {med['req_s']:5.1f} {med['p50_ms']:6.0f} "
                             f"{med['cpu_us_per_token']:5.1f} {med['ceiling_tok_s']:6.0f} ")
                    if "cpu_ratio" in med:
                        line += f"({med['tok_s_ratio']:.2f}x, {med['cpu_ratio']:.2f}x) "
                rows.append(row)
                print(line)
    for name, (text, _) in profiles.items():
        print(f"\n== profile {name}\n{text}")
    print(json.dumps({"bench": "gateway_ceiling", "max_tokens": a.max_tokens, "tokens_per_step": a.tokens_per_step,
                      "rounds": a.rounds, "rev": a.rev, "results": rows,
                      "profiles": {k: v for k, (_, v) in profiles.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
