"""The vLLM engine: what clawloop's gateway adds in front of vLLM, and hf vs vLLM behind the gateway.

One run, four paths (five with --with-httpx) over loopback HTTP, same model,
same prompt, greedy, the same `max_tokens` on every request:

- direct:   vLLM's own OpenAI server (`/v1/chat/completions`, model
            "clawloop-base") on the replica the gateway uses;
- generate: the same server's token-in/token-out endpoint
            (`/inference/v1/generate`), called exactly as clawloop's engine
            calls it (prompt ids in, a token stream with logprobs out, always
            streamed): what vLLM itself spends on the gateway's behalf, so
            gateway - generate is clawloop's own share;
- httpx:    (with --with-httpx) the same generate requests sent from this
            process by one shared httpx AsyncClient with the limits and
            timeouts the engine gave it before it moved to aiohttp: the
            client that left vLLM's batches under-filled, on its own;
- gateway:  `clawloop serve --backend vllm` (capture on, a real SQLite store)
            in front of that same vLLM server (its URL is read from the
            gateway's GET /health, `replicas[0].url`);
- hf:       `clawloop serve --backend hf` on the same model (its own process).

At concurrency 1 and 32, plain and streaming (generate streams in both).
Every round runs each case on each path in turn, the order rotated from round
to round, so drift on a shared machine hits all paths; figures are medians
over rounds (p99 over all of a path's requests), ratios are medians of the
per-round ratios. The client is a
minimal keep-alive HTTP/1.1 client on asyncio streams (`RawConnection` from
gateway_overhead.py), the same for every path, so differences are the
servers'. The client, the gateway and vLLM share the machine's cores: per path
the cores used by the vLLM server (its whole process group: API server,
engine core, worker), the gateway, the hf server, this bench and everything
else (from /proc) are printed beside the figures, and for the vLLM paths how
full vLLM's batches were: tokens per engine step (prompt and generated, from
vLLM's own `vllm:iteration_tokens_total`; 32 requests decoding together make
32 per step, their prefills 16 each). A pause of `--settle-s` before each
measurement keeps one path's leftover work (vLLM winding down) off the next.

Goals (vLLM engine issue): the gateway adds <= 10 % to vLLM's p50, and
reaches >= 0.9x vLLM's requests/s at concurrency 32.

Without a vLLM environment (`make vllm` -> .venv-vllm) the bench prints one
JSON line with "skipped" and exits 0. Without --model it builds a randomly
initialised model of the tiny model's shape (4 layers x 128, seed 0) in a
temp dir: a random model rarely stops early, so `max_tokens` fixes the
generation length (mean completion tokens per request are reported).

    .venv/bin/python bench/vllm_engine.py [--model DIR] [--rounds 5] [--max-tokens 32] [--no-hf]
                                          [--hf-threads 1] [--with-httpx] [--pin 0/1]

`--pin 0/1` puts every thread of vLLM's processes on CPU 0 and the gateways' and the bench's on CPU 1
once the servers are up. vLLM's CPU engine keeps ~1.9 of 2 cores busy even at concurrency 1 (its
worker's OpenMP threads on one core, its engine core's loop on the other), so unpinned the gateway
gets CPU time only between them; pinned, vLLM has one core for every path alike and the gateway one
of its own, as on a GPU machine.

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from gateway_overhead import RawConnection, pct  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 12+7?"}]
PATHS = ("direct", "generate", "gateway", "hf")
CASES = [(1, False), (1, True), (32, False), (32, True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_key(conc: int, stream: bool) -> str:
    return f"c{conc}-{'stream' if stream else 'plain'}"


# ---------------------------------------------------------------- servers


class Server:
    """`clawloop serve` in a child process (its PID kept), stopped with SIGINT."""

    def __init__(self, name: str, args: list[str], data_dir: str, port: int):
        self.name, self.url, self.data_dir = name, f"http://127.0.0.1:{port}", data_dir
        self.log_path = Path(data_dir) / "serve.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "serve", "--data-dir", data_dir,
                                      "--port", str(port), "--host", "127.0.0.1", "--no-serve-status", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.health: dict = {}

    def wait_healthy(self, timeout_s: float) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    self.health = r.json()
                    if all(rep.get("state") == "up" for rep in self.health.get("replicas", [])):
                        return time.time() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # this PID only
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def log_tail(self, n: int = 30) -> str:
        if not self.log.closed:
            self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def group_alive(pgid: int) -> list[int]:
    """PIDs still in process group `pgid` (the vLLM server the gateway started)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rpartition(")")[2].split()[2]) == pgid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def stop_group(pgid: int, grace_s: float = 20.0) -> str:
    """The gateway stops its vLLM group itself; if any of that group is left after the
    gateway exited, SIGTERM then SIGKILL to exactly that group. Returns what happened."""
    t0 = time.time()
    while group_alive(pgid) and time.time() - t0 < grace_s:
        time.sleep(0.2)
    if not group_alive(pgid):
        return "exited with the gateway"
    os.killpg(pgid, signal.SIGTERM)
    time.sleep(5)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        return "left behind by the gateway: SIGKILLed"
    return "left behind by the gateway: SIGTERMed"


# ---------------------------------------------------------------- CPU accounting


class CpuMeter:
    """CPU seconds of the vLLM process group, the two gateways, this bench and the whole machine."""

    def __init__(self, vllm_pgid: int | None, pids: dict[str, int]):
        self.vllm_pgid, self.pids, self.tick = vllm_pgid, pids, os.sysconf("SC_CLK_TCK")

    def _proc_cpu(self) -> dict[str, float]:
        out = {k: 0.0 for k in ("vllm", *self.pids)}
        by_pid = {pid: name for name, pid in self.pids.items()}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                f = (d / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            t = (int(f[11]) + int(f[12])) / self.tick  # utime + stime, all threads
            if int(d.name) in by_pid:
                out[by_pid[int(d.name)]] += t
            elif self.vllm_pgid is not None and int(f[2]) == self.vllm_pgid:
                out["vllm"] += t
        return out

    def snapshot(self) -> tuple[float, float, float, dict[str, float]]:
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
        machine = (sum(cpu) - cpu[3] - cpu[4]) / self.tick  # all but idle and iowait
        t = os.times()
        return time.perf_counter(), machine, t.user + t.system, self._proc_cpu()

    @staticmethod
    def cores(a, b) -> dict[str, float]:
        dt = b[0] - a[0]
        out = {f"cpu_{k}": (b[3][k] - a[3][k]) / dt for k in b[3]}
        out["cpu_bench"] = (b[2] - a[2]) / dt
        out["cpu_other"] = max(0.0, (b[1] - a[1]) / dt - sum(out.values()))
        return out


# ---------------------------------------------------------------- load


def completion_tokens(data: bytes, stream: bool) -> int:
    if not stream:
        return int(json.loads(data)["usage"]["completion_tokens"])
    if not data.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError("stream did not end with [DONE]")
    for line in reversed(data.split(b"\n")):
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                return int(chunk["usage"]["completion_tokens"])
    raise RuntimeError("stream without a usage chunk")


def vllm_steps(url: str) -> tuple[float, float]:
    """(engine steps, tokens scheduled) so far, from vLLM's own /metrics (vllm:iteration_tokens_total)."""
    count = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count{"):
            count = float(line.rpartition(" ")[2])
        elif line.startswith("vllm:iteration_tokens_total_sum{"):
            total = float(line.rpartition(" ")[2])
    return count, total


def generated_tokens(data: bytes) -> int:
    """Tokens in a `/inference/v1/generate` stream (each event carries `token_ids`)."""
    if not data.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError("generate stream did not end with [DONE]")
    n, finished = 0, False
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            for ch in json.loads(line[6:]).get("choices") or []:
                n += len(ch.get("token_ids") or [])
                finished = finished or ch.get("finish_reason") is not None
    if not finished:
        raise RuntimeError("generate stream without a finish_reason")
    return n


def generate_body(prompt_ids: list[int], max_tokens: int, eos: list[int]) -> dict:
    """The body clawloop's vLLM engine sends for a greedy request without top logprobs
    (VLLMEngine._stream)."""
    return {"token_ids": prompt_ids, "stream": True,
            "sampling_params": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "stop_token_ids": eos,
                                "logprobs": 0, "detokenize": False, "skip_special_tokens": False}}


def engine_client() -> httpx.AsyncClient:
    """An httpx client configured as VLLMEngine.start configures its own."""
    return httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0),
                             limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512))


async def run_load_httpx(client: httpx.AsyncClient, url: str, n: int, conc: int,
                         body: dict) -> tuple[list[float], float, list[int]]:
    """Generate requests as VLLMEngine._stream sends and reads them (lines, json per event, leave at [DONE])."""
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    tokens: list[int] = []

    async def one() -> None:
        async with sem:
            t = time.perf_counter()
            k, finished = 0, False
            async with client.stream("POST", url + "/inference/v1/generate", json=body) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"generate: HTTP {resp.status_code}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line[6:] == "[DONE]":
                        break
                    for ch in json.loads(line[6:]).get("choices") or []:
                        k += len(ch.get("token_ids") or [])
                        finished = finished or ch.get("finish_reason") is not None
            lat.append(time.perf_counter() - t)
            if not finished:
                raise RuntimeError("generate stream without a finish_reason")
            tokens.append(k)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return lat, n / (time.perf_counter() - t0), tokens


async def run_load(url: str, model: str, n: int, conc: int, max_tokens: int,
                   stream: bool, generate: dict | None = None) -> tuple[list[float], float, list[int]]:
    """`n` requests, `conc` at a time, one keep-alive connection per slot: latencies, requests/s, tokens.
    With `generate` (a body): that body to vLLM's `/inference/v1/generate` instead of a chat completion."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    payload = json.dumps(generate if generate is not None else body).encode()
    route = "/inference/v1/generate" if generate is not None else "/v1/chat/completions"
    port = int(url.rsplit(":", 1)[1])
    pool = [RawConnection(port) for _ in range(conc)]
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    tokens: list[int] = []

    async def one(i: int) -> None:
        async with sem:
            conn = pool.pop()
            t = time.perf_counter()
            data = await conn.post(route, payload, {"X-Session-Id": f"bench-{i}"})
            lat.append(time.perf_counter() - t)
            pool.append(conn)
            tokens.append(generated_tokens(data) if generate is not None else completion_tokens(data, stream))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for conn in pool:
            conn.close()
    return lat, n / (time.perf_counter() - t0), tokens


# ---------------------------------------------------------------- main


def prompt_and_eos(model: str) -> tuple[list[int], list[int]]:
    """The gateway's prompt ids for MESSAGES and the stop ids the engine adds (eos of tokenizer and
    generation_config)."""
    from transformers import AutoTokenizer

    from clawloop.gateway.render import render_prompt

    tok = AutoTokenizer.from_pretrained(model)
    eos = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
    gc = Path(model) / "generation_config.json"
    if gc.exists():
        e = json.loads(gc.read_text()).get("eos_token_id")
        eos.update([int(e)] if isinstance(e, int) else [int(x) for x in (e or [])])
    return render_prompt(tok, MESSAGES, None), sorted(eos)


def parse_cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def pin(spec: str, vllm_pgid: int | None, gateway_pids: list[int]) -> str:
    """--pin VLLM/REST: every thread of vLLM's group on VLLM, the gateways' and this process's on REST
    (threads started later inherit their creator's set)."""
    first, _, second = spec.partition("/")
    vllm_cpus, rest = parse_cpus(first), parse_cpus(second)

    def tasks(pid: int) -> list[int]:
        try:
            return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return []

    vllm_pids = [] if vllm_pgid is None else [int(d) for d in os.listdir("/proc") if d.isdigit()
                                               and _pgid(int(d)) == vllm_pgid]
    n = {"vllm": 0, "rest": 0}
    for pids, cpus, key in ((vllm_pids, vllm_cpus, "vllm"), (gateway_pids + [os.getpid()], rest, "rest")):
        for pid in pids:
            for tid in tasks(pid):
                try:
                    os.sched_setaffinity(tid, cpus)
                    n[key] += 1
                except OSError:
                    pass
    return (f"{n['vllm']} vLLM threads ({len(vllm_pids)} processes) on CPUs {sorted(vllm_cpus)}, "
            f"{n['rest']} gateway and bench threads on {sorted(rest)}")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def skip(reason: str) -> int:
    print(f"skipped: {reason}")
    print(json.dumps({"bench": "vllm_engine", "skipped": reason}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF model dir (default: a random 4x128 model of the tiny "
                                                "model's shape, built in a temp dir)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--n1", type=int, default=16, help="requests per round and path at concurrency 1")
    ap.add_argument("--n32", type=int, default=96, help="requests per round and path at concurrency 32")
    ap.add_argument("--no-hf", action="store_true", help="leave out the hf engine")
    ap.add_argument("--with-httpx", action="store_true",
                    help="add the httpx path: the engine's HTTP client alone against vLLM's generate endpoint")
    ap.add_argument("--settle-s", type=float, default=1.0,
                    help="pause before each measurement, so one path's leftover work does not land on the next")
    ap.add_argument("--hf-threads", type=int, default=0, help="torch threads of the hf server (0: torch's default)")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON", ""),
                    help="the vLLM environment's Python (default: $VLLM_PYTHON, else .venv-vllm)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for the vLLM gateway's `clawloop serve` (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs (logs, stores)")
    ap.add_argument("--pin", default="",
                    help="VLLM_CPUS/REST_CPUS, e.g. 0/1: once up, every thread of vLLM's process group on the "
                         "first CPU set, the gateways' and this process's on the second, so the gateway does "
                         "not wait for CPU time behind vLLM's busy engine loop (as on a GPU machine, where "
                         "vLLM's own processes leave the other cores free)")
    a = ap.parse_args(argv)

    from clawloop.engines.vllm import VLLMNotInstalled, find_vllm_python

    try:
        vllm_python = find_vllm_python(a.vllm_python)
    except VLLMNotInstalled as e:
        return skip(str(e))

    tmp = tempfile.mkdtemp(prefix="clawloop-bench-vllm-")
    model = a.model
    model_desc = model
    if not model:
        from clawloop.tinymodel.build import build_random_model

        model = str(build_random_model(Path(tmp) / "model", layers=4, hidden=128, seed=0))
        model_desc = "random 4x128 (tiny model's shape, seed 0)"
    paths = tuple(p for p in PATHS if not (p == "hf" and a.no_hf))
    if a.with_httpx:
        paths = paths[:2] + ("httpx",) + paths[2:]
    prompt_ids, eos = prompt_and_eos(model)
    gen_body = generate_body(prompt_ids, a.max_tokens, eos)
    servers: dict[str, Server] = {}
    vllm_pgid: int | None = None
    group_note = ""
    results = {case_key(c, s): {p: {"p50": [], "p99": [], "rps": [], "lat": [], "tokens": [], "cpu": [],
                                    "steps": [0.0, 0.0]}
                                for p in paths} for c, s in CASES}
    t_start = time.time()
    try:
        servers["gateway"] = Server("vllm gateway", ["--backend", "vllm", "--model-path", model,
                                                     "--vllm-python", str(vllm_python), *a.serve_arg],
                                    tempfile.mkdtemp(prefix="gw-vllm-", dir=tmp), free_port())
        if "hf" in paths:
            servers["hf"] = Server("hf gateway", ["--backend", "hf", "--model-path", model,
                                                  "--model-max-batch-size", "32",
                                                  "--model-threads", str(a.hf_threads)],
                                   tempfile.mkdtemp(prefix="gw-hf-", dir=tmp), free_port())
        print(f"vllm gateway pid {servers['gateway'].proc.pid}"
              + (f", hf gateway pid {servers['hf'].proc.pid}" if "hf" in servers else "")
              + f" (data under {tmp}); starting ...", flush=True)
        startup = {k: s.wait_healthy(900 if k == "gateway" else 300) for k, s in servers.items()}
        replica = servers["gateway"].health["replicas"][0]
        vllm_pgid = replica.get("pid")  # the launcher: its own session, so its pid is the group id
        urls = {"direct": replica["url"], "generate": replica["url"], "httpx": replica["url"],
                "gateway": servers["gateway"].url}
        if "hf" in servers:
            urls["hf"] = servers["hf"].url
        models = {"direct": "clawloop-base", "generate": "clawloop-base", "httpx": "", "gateway": "clawloop",
                  "hf": "clawloop"}
        print(f"ready: vllm gateway {startup['gateway']:.0f} s (vLLM replica {urls['direct']}, pgid {vllm_pgid})"
              + (f", hf gateway {startup['hf']:.0f} s" if "hf" in startup else ""), flush=True)
        if a.pin:
            pinned = pin(a.pin, vllm_pgid, [s.proc.pid for s in servers.values()])
            print(f"pinned: {pinned}", flush=True)
        meter = CpuMeter(vllm_pgid, {"gateway": servers["gateway"].proc.pid,
                                     **({"hf": servers["hf"].proc.pid} if "hf" in servers else {})})

        async def load(p: str, n: int, conc: int, stream: bool, client: httpx.AsyncClient):
            if p == "httpx":
                return await run_load_httpx(client, urls[p], n, conc, gen_body)
            return await run_load(urls[p], models[p], n, conc, a.max_tokens, stream,
                                  gen_body if p == "generate" else None)

        async def go() -> None:
            async with engine_client() as client:
                await rounds(client)

        async def rounds(client: httpx.AsyncClient) -> None:
            for p in paths:  # warm every path, both kinds
                for stream in (False, True):
                    await load(p, 8, 4, stream, client)
            for rnd in range(a.rounds):
                order = list(paths[rnd % len(paths):] + paths[:rnd % len(paths)])
                for conc, stream in CASES:
                    n = a.n1 if conc == 1 else a.n32
                    for p in order:
                        await asyncio.sleep(a.settle_s)
                        v0 = vllm_steps(urls["direct"]) if p != "hf" else None
                        c0 = meter.snapshot()
                        lat, rps, toks = await load(p, n, conc, stream, client)
                        cpu = CpuMeter.cores(c0, meter.snapshot())
                        r = results[case_key(conc, stream)][p]
                        if v0 is not None:
                            v1 = vllm_steps(urls["direct"])
                            r["steps"][0] += v1[0] - v0[0]
                            r["steps"][1] += v1[1] - v0[1]
                        r["p50"].append(statistics.median(lat))
                        r["p99"].append(pct(lat, 99))
                        r["rps"].append(rps)
                        r["lat"] += lat
                        r["tokens"] += toks
                        r["cpu"].append(cpu)
                print(f"round {rnd + 1}/{a.rounds} done ({time.time() - t_start:.0f} s)", flush=True)

        asyncio.run(go())
    finally:
        for k, s in servers.items():
            rc = s.stop()
            if rc not in (0, None):
                print(f"{s.name} exited with {rc}; log tail:\n{s.log_tail(15)}", flush=True)
        if vllm_pgid is not None:
            group_note = stop_group(vllm_pgid)
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"data kept under {tmp}")

    # ---- report
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    def ratio(case: dict, num: str, den: str, key: str) -> float:
        return med([x / y for x, y in zip(case[num][key], case[den][key])])

    rows = []
    print()
    print(f"model {model_desc}; max_tokens {a.max_tokens}; {a.rounds} rounds; greedy; raw HTTP/1.1 client")
    print(f"{'case':<10} {'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} {'tok/req':>7} {'tok/step':>8}   "
          f"cores: vllm  gw(vllm)  gw(hf)  bench  other")
    for key, case in results.items():
        for p in paths:
            r = case[p]
            cores = {k: med([c[k] for c in r["cpu"]]) for k in r["cpu"][0]}
            tps = r["steps"][1] / r["steps"][0] if r["steps"][0] else float("nan")
            print(f"{key:<10} {p:<8} {med(r['p50']) * 1e3:>8.1f} {pct(r['lat'], 99) * 1e3:>8.1f} "
                  f"{med(r['rps']):>7.1f} {statistics.mean(r['tokens']):>7.1f} {tps:>8.1f}   "
                  f"{cores['cpu_vllm']:>11.2f} {cores['cpu_gateway']:>9.2f} {cores.get('cpu_hf', 0.0):>7.2f} "
                  f"{cores['cpu_bench']:>6.2f} {cores['cpu_other']:>6.2f}")
        row = {"case": key}
        for p in paths:
            r = case[p]
            row[p] = {"p50_ms": round(med(r["p50"]) * 1e3, 2), "p99_ms": round(pct(r["lat"], 99) * 1e3, 2),
                      "rps": round(med(r["rps"]), 1), "requests": len(r["lat"]),
                      "mean_completion_tokens": round(statistics.mean(r["tokens"]), 2),
                      "vllm_tokens_per_step": (round(r["steps"][1] / r["steps"][0], 1) if r["steps"][0]
                                               else None),
                      "cores": {k[4:]: round(med([c[k] for c in r["cpu"]]), 2) for k in r["cpu"][0]}}
        for num, den in (("gateway", "direct"), ("generate", "direct"), ("gateway", "generate")):
            for k in ("p50", "rps"):
                row[f"{num}_over_{den}_{k}"] = round(ratio(case, num, den, k), 3)
        if "httpx" in paths:
            row["httpx_over_generate_rps"] = round(ratio(case, "httpx", "generate", "rps"), 3)
        if "hf" in paths:
            row["vllm_gateway_over_hf_rps"] = round(ratio(case, "gateway", "hf", "rps"), 3)
        rows.append(row)
    print()
    print("ratios (medians of per-round ratios):")
    print(f"{'case':<10} {'gw/direct':>10} {'gw/direct':>10} {'gen/direct':>10} {'gen/direct':>10} "
          f"{'gw/gen':>8} {'gw/gen':>8}" + ("  vllm-gw/hf" if "hf" in paths else ""))
    print(f"{'':<10} {'p50':>10} {'req/s':>10} {'p50':>10} {'req/s':>10} {'p50':>8} {'req/s':>8}"
          + ("  req/s" if "hf" in paths else ""))
    for row in rows:
        print(f"{row['case']:<10} {row['gateway_over_direct_p50']:>10.3f} {row['gateway_over_direct_rps']:>10.3f} "
              f"{row['generate_over_direct_p50']:>10.3f} {row['generate_over_direct_rps']:>10.3f} "
              f"{row['gateway_over_generate_p50']:>8.3f} {row['gateway_over_generate_rps']:>8.3f}"
              + (f"  {row['vllm_gateway_over_hf_rps']:>11.3f}" if "hf" in paths else "")
              + (f"  httpx/gen req/s {row['httpx_over_generate_rps']:.3f}" if "httpx" in paths else ""))
    by = {row["case"]: row for row in rows}
    p50_ok = all(row["gateway_over_direct_p50"] <= 1.10 for row in rows)
    rps_ok = all(by[k]["gateway_over_direct_rps"] >= 0.9 for k in ("c32-plain", "c32-stream"))
    print()
    print(f"goal p50 gateway/direct <= 1.10 in every case: {'met' if p50_ok else 'NOT met'}; "
          f"req/s gateway/direct >= 0.9 at c32: {'met' if rps_ok else 'NOT met'}")
    print(f"vLLM process group after the gateway stopped: {group_note}")
    print(json.dumps({"bench": "vllm_engine", "model": model_desc, "max_tokens": a.max_tokens, "rounds": a.rounds,
                      "n1": a.n1, "n32": a.n32, "serve_args": a.serve_arg, "pin": a.pin, "hf_threads": a.hf_threads,
                      "startup_s": {k: round(v, 1) for k, v in startup.items()},
                      "goal_p50_ratio": 1.10, "goal_rps_ratio_c32": 0.9, "p50_goal_met": p50_ok,
                      "rps_goal_met": rps_ok, "vllm_group_after_stop": group_note,
                      "minutes": round((time.time() - t_start) / 60, 2), "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
