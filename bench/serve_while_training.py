"""Serving while training: does the trainer (and its weight publishes) hurt chat latency?

Starts `clawloop up` in a child process and sends *probes* (streaming side
turns, so they never train: `max_tokens` 16, temperature 0, a fixed set of
questions) at concurrency 4 through three phases of one run:

1. quiet — probes only; the trainer has nothing to do.
2. idle  — probes plus simulated users sending the same conversations as in
   `busy`, but as side turns: the engine carries the same traffic, no user
   feedback arrives, the trainer stays idle. This is the baseline the goal is
   measured against, so the only difference to `busy` is training.
3. busy  — the users' sessions are main turns: every answer is followed by a
   correction ("just the number, please") or thanks plus the next question,
   the offline judge scores them, the trainer steps and publishes. Runs until
   `--publishes` weight publishes (default 20) and at least `--busy-min-s`,
   at most `--busy-max-s`. Its probes are also split into those that
   overlapped a publish (the window from the engine's stall before the last
   /health answer with the old version to the first with the new one) and
   the rest.

Per phase: end-to-end latency p50/p99, time to first token (first chunk after
the role chunk), and the longest gap between two consecutive SSE chunks of one
request. Publish stall is the engine's own "weights ready -> served" time
(`clawloop_engine_last_publish_s` on /metrics, sampled after every version
change seen on /health). With `--backend vllm` (vLLM servers started by
`clawloop up` from .venv-vllm) that time includes writing the weights as
safetensors; the part in which the replica is paused and requests are frozen
(`/pause` -> reload -> `/resume`, `clawloop_engine_last_pause_s`) is reported
beside it, and the vLLM server's cores (its whole process group) are counted
apart from clawloop's. Non-2xx responses are counted over every request the
bench makes (probes, users, polls) and checked against the server's own
`clawloop_requests_total`. Goals (issue 5): 0 non-2xx; p99 busy <= 1.5x idle.

The bench's own client shares the machine's cores with the server, and on a
shared machine other work does too: per phase, the cores used by the server,
by this bench and by everything else (from /proc) are printed beside the
figures.

    .venv/bin/python bench/serve_while_training.py [--model DIR] [--publishes 20] [--busy-max-s 480]
    .venv/bin/python bench/serve_while_training.py --backend vllm --model DIR [--pin 0/1] [--up-arg=--FLAG=V ...]

`--pin 0/1` (vLLM only) puts every thread of vLLM's process group on CPU 0 and
`clawloop up`'s (gateway and trainer) and this bench's on CPU 1, as
`bench/vllm_engine.py --pin` does: on a GPU machine vLLM's engine runs on the
GPU and the gateway has its cores, while vLLM's CPU engine here keeps both
cores busy and a publish's copies and calls wait for CPU between its threads.

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clawloop.tinymodel.corpus import correction_for, fits_style, heldout_questions, sample_question  # noqa: E402

PREFERENCE = "bare"
THANKS = ("Thanks!", "Great, thank you.", "Perfect, thanks!", "Thank you!", "Nice, thanks.")
PROBE_QUESTIONS = [q["question"] for q in heldout_questions(8, seed=7)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Tally:
    """Every response the bench sees, by kind and status (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: dict[str, dict[int, int]] = {}
        self.transport_errors: dict[str, int] = {}
        self.stream_errors = 0
        self.examples: list[str] = []

    def code(self, kind: str, status: int, detail: str = "") -> None:
        with self.lock:
            by = self.codes.setdefault(kind, {})
            by[status] = by.get(status, 0) + 1
            if not 200 <= status < 300 and len(self.examples) < 5:
                self.examples.append(f"{kind} {status} {detail[:200]}")

    def transport(self, kind: str, e: BaseException) -> None:
        with self.lock:
            self.transport_errors[kind] = self.transport_errors.get(kind, 0) + 1
            if len(self.examples) < 5:
                self.examples.append(f"{kind} {type(e).__name__}: {e}")

    def stream_error(self, data: str) -> None:
        with self.lock:
            self.stream_errors += 1
            if len(self.examples) < 5:
                self.examples.append(f"probe stream error {data[:200]}")

    def non_2xx(self) -> int:
        with self.lock:
            return sum(n for by in self.codes.values() for c, n in by.items() if not 200 <= c < 300)

    def total(self) -> int:
        with self.lock:
            return sum(n for by in self.codes.values() for n in by.values())


def group_pids(pgid: int) -> list[int]:
    """PIDs in process group `pgid` (a vLLM server: launcher, API server, engine core, worker)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rpartition(")")[2].split()[2]) == pgid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


class CpuMeter:
    """Cores used over an interval by the server, this bench, and everything else (Linux /proc);
    with `vllm_pgid`, the vLLM server's process group as well (apart from the server)."""

    def __init__(self, pid: int, vllm_pgid: int | None = None):
        self.pid, self.vllm_pgid, self.tick = pid, vllm_pgid, os.sysconf("SC_CLK_TCK")

    def _cpu(self, pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime, all threads

    def snapshot(self) -> tuple[float, float, float, float, float] | None:
        try:
            cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
            machine = (sum(cpu) - cpu[3] - cpu[4]) / self.tick  # all but idle and iowait
            server = self._cpu(self.pid)
        except (OSError, ValueError, IndexError):
            return None
        vllm = 0.0
        if self.vllm_pgid is not None:
            for pid in group_pids(self.vllm_pgid):
                try:
                    vllm += self._cpu(pid)
                except (OSError, ValueError, IndexError):
                    pass
        t = os.times()
        return time.perf_counter(), machine, server, t.user + t.system, vllm

    def cores(self, a, b) -> dict[str, float]:
        if a is None or b is None:
            return {}
        dt = b[0] - a[0]
        server, bench, vllm = (b[2] - a[2]) / dt, (b[3] - a[3]) / dt, (b[4] - a[4]) / dt
        out = {"cpu_server": server, "cpu_bench": bench}
        if self.vllm_pgid is not None:
            out["cpu_vllm"] = vllm
        out["cpu_other"] = max(0.0, (b[1] - a[1]) / dt - server - bench - vllm)
        return out


# ---------------------------------------------------------------- the server


class Up:
    """`clawloop up` in a child process (its PID kept); stopped with SIGINT."""

    def __init__(self, model: str, data_dir: str, port: int, backend: str = "hf", extra: list[str] | None = None):
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "clawloop.cli", "up", "--model-path", model, "--data-dir", data_dir,
               "--port", str(port), "--rollout-batch-size", "4", "--method", "combine", "--lr", "1e-4",
               "--no-serve-status", "--judge-poll-interval-s", "0.1"]
        if backend != "hf":
            cmd += ["--backend", backend]
        cmd += extra or []
        self.log_path = Path(data_dir) / "up.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout_s: float = 300.0) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"clawloop up exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.time() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"clawloop up not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 120.0) -> tuple[int | None, float, bool]:
        """SIGINT, wait; kill this PID only if it does not exit. Returns (rc, seconds, killed)."""
        t0 = time.time()
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode, time.time() - t0, killed

    def log_tail(self, n: int = 30) -> str:
        if not self.log.closed:
            self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def read_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name or name{labels}: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


@dataclass
class PublishSample:
    t_before: float  # perf_counter when /health last answered with the old version
    t: float  # perf_counter when the new version was first seen on /health
    version: int
    stall_s: float  # clawloop_engine_last_publish_s right after
    engine_publishes: int
    train_step_s: float
    pause_s: float = float("nan")  # clawloop_engine_last_pause_s (vLLM: paused -> resumed), NaN where absent
    parts: dict = field(default_factory=dict)  # vLLM from a shared-memory image: clawloop_engine_publish_* (s, bytes)


class PublishWatcher(threading.Thread):
    """Polls /health; on every version change reads /metrics for the engine's publish stall."""

    def __init__(self, url: str, tally: Tally, interval_s: float = 0.1):
        super().__init__(name="publish-watcher", daemon=True)
        self.url, self.tally, self.interval_s = url, tally, interval_s
        self.stop_event = threading.Event()
        self.samples: list[PublishSample] = []
        self.version = -1
        self.engine_publishes = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            t_before = time.perf_counter()
            while not self.stop_event.is_set():
                try:
                    r = c.get("/health")
                    t = time.perf_counter()
                    self.tally.code("poll", r.status_code, r.text)
                    v = int(r.json()["policy_version"]) if r.status_code == 200 else self.version
                    if self.version >= 0 and v != self.version:
                        m = c.get("/metrics")
                        self.tally.code("poll", m.status_code, m.text)
                        mx = read_metrics(m.text)
                        self.engine_publishes = int(mx.get("clawloop_engine_publishes", self.engine_publishes))
                        self.samples.append(PublishSample(
                            t_before, t, v, mx.get("clawloop_engine_last_publish_s", float("nan")),
                            self.engine_publishes, mx.get("clawloop_train_step_s", float("nan")),
                            mx.get("clawloop_engine_last_pause_s", float("nan")),
                            {k.removeprefix("clawloop_engine_publish_"): v for k, v in mx.items()
                             if k.startswith("clawloop_engine_publish_")}))
                    self.version = v
                    t_before = t
                except httpx.HTTPError as e:
                    self.tally.transport("poll", e)
                self.stop_event.wait(self.interval_s)



# ---------------------------------------------------------------- probes


@dataclass
class Probe:
    t0: float
    t1: float
    ok: bool
    ttft_s: float = float("nan")
    max_gap_s: float = 0.0
    tokens: int = 0
    version_first: int = -1
    version_last: int = -1

    @property
    def latency_s(self) -> float:
        return self.t1 - self.t0


def _version_of(chunk: dict) -> int:
    fp = chunk.get("system_fingerprint") or ""
    return int(fp.rsplit("-v", 1)[1]) if "-v" in fp else -1


async def probe_once(client: httpx.AsyncClient, question: str, tally: Tally) -> Probe:
    body = {"model": "clawloop", "messages": [{"role": "user", "content": question}], "max_tokens": 16,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"X-Turn-Type": "side", "X-Session-Id": f"probe-{random.getrandbits(48):x}"}
    t0 = time.perf_counter()
    p = Probe(t0, t0, ok=False)
    last = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                tally.code("probe", r.status_code, r.text)
                p.t1 = time.perf_counter()
                return p
            done = errored = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                if last is not None:
                    p.max_gap_s = max(p.max_gap_s, now - last)
                last = now
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    errored = True
                    tally.stream_error(data)
                    continue
                v = _version_of(chunk)
                if p.version_first < 0:
                    p.version_first = v
                p.version_last = v
                if chunk.get("usage"):
                    p.tokens = chunk["usage"]["completion_tokens"]
                for ch in chunk.get("choices", []):
                    if "role" not in ch["delta"] and p.ttft_s != p.ttft_s:  # first chunk after the role chunk
                        p.ttft_s = now - t0
            tally.code("probe", 200)
            if not done and not errored:
                tally.stream_error("stream ended without [DONE]")
            p.ok = done and not errored
    except httpx.HTTPError as e:
        tally.transport("probe", e)
    p.t1 = time.perf_counter()
    return p


async def run_probes(url: str, conc: int, until, tally: Tally) -> list[Probe]:
    """`conc` workers send probes back to back until `until()` is true."""
    probes: list[Probe] = []
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=conc + 2)) as client:
        async def worker(w: int) -> None:
            k = w
            while not until():
                probes.append(await probe_once(client, PROBE_QUESTIONS[k % len(PROBE_QUESTIONS)], tally))
                k += conc

        await asyncio.gather(*(worker(w) for w in range(conc)))
    return probes


# ---------------------------------------------------------------- simulated users


@dataclass
class UserStats:
    requests: int = 0
    fit: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_user(url: str, uid: str, seed: int, turn_type: str, turns: int, stop: threading.Event, tally: Tally,
             stats: UserStats) -> None:
    """Sessions of `turns` questions; each answer is followed by thanks or a correction."""
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=120) as c:
        n_session = 0
        while not stop.is_set():
            sid, msgs = f"{uid}-s{n_session}", []
            n_session += 1
            pending = sample_question(rng)["question"]
            for k in range(turns):
                if stop.is_set():
                    return
                msgs.append({"role": "user", "content": pending})
                headers = {"X-Session-Id": sid, "X-Turn-Type": turn_type}
                if k == turns - 1:
                    headers["X-Session-Done"] = "1"
                body = {"model": "clawloop", "messages": msgs, "max_tokens": 24, "temperature": 1.0}
                try:
                    r = c.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError as e:
                    tally.transport("user", e)
                    stop.wait(1.0)
                    break
                tally.code("user", r.status_code, r.text)
                if r.status_code != 200:
                    stop.wait(1.0)
                    break
                answer = r.json()["choices"][0]["message"]["content"] or ""
                msgs.append({"role": "assistant", "content": answer})
                ok = fits_style(answer, PREFERENCE)
                with stats.lock:
                    stats.requests += 1
                    stats.fit += ok
                pending = (f"{rng.choice(THANKS)} {sample_question(rng)['question']}" if ok
                           else correction_for(PREFERENCE, rng))


class Users:
    def __init__(self, url: str, n: int, turn_type: str, turns: int, seed: int, tally: Tally):
        self.stop_event = threading.Event()
        self.stats = UserStats()
        self.threads = [threading.Thread(target=run_user, name=f"user-{i}", daemon=True,
                                         args=(url, f"{turn_type}-u{i}", seed * 1000 + i, turn_type, turns,
                                               self.stop_event, tally, self.stats)) for i in range(n)]

    def __enter__(self) -> "Users":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=120)


# ---------------------------------------------------------------- report


def summarize(probes: list[Probe], seconds: float | None = None) -> dict:
    ok = [p for p in probes if p.ok]
    lat = [p.latency_s for p in ok] or [float("nan")]
    ttft = [p.ttft_s for p in ok if p.ttft_s == p.ttft_s] or [float("nan")]
    gaps = [p.max_gap_s for p in ok] or [float("nan")]
    return {
        "probes": len(probes), "failed": len(probes) - len(ok),
        "seconds": None if seconds is None else round(seconds, 1),
        "p50_ms": statistics.median(lat) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "max_ms": max(lat) * 1e3,
        "ttft_p50_ms": statistics.median(ttft) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
        "gap_p99_ms": pct(gaps, 99) * 1e3, "gap_max_ms": max(gaps) * 1e3,
        "mean_tokens": statistics.mean(p.tokens for p in ok) if ok else 0.0,
    }


def overlaps_publish(p: Probe, samples: list[PublishSample]) -> bool:
    """Whether the probe overlapped a publish. The swap happened between the two
    /health answers around the version change, and the engine's stall ends at
    the swap, so the publish lies within [t_before - stall, t]."""
    return any(p.t0 <= s.t and p.t1 >= s.t_before - s.stall_s for s in samples)


def finite(x):
    """NaN (no data) as JSON null."""
    return None if isinstance(x, float) and x != x else x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF model dir (default: the tiny model, built if missing)")
    ap.add_argument("--backend", default="hf", choices=("hf", "vllm"),
                    help="inference engine of `clawloop up` (vllm: servers from .venv-vllm)")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--concurrency", type=int, default=4, help="probes in flight")
    ap.add_argument("--users", type=int, default=4, help="simulated users (threads) in idle and busy")
    ap.add_argument("--turns", type=int, default=4, help="turns per user session")
    ap.add_argument("--quiet-s", type=float, default=25.0, help="probes-only phase length")
    ap.add_argument("--idle-s", type=float, default=40.0, help="probes + side-turn users phase length")
    ap.add_argument("--publishes", type=int, default=20, help="busy phase runs until this many publishes")
    ap.add_argument("--busy-min-s", type=float, default=40.0,
                    help="... and at least this long, so its percentiles rest on as many probes as idle's")
    ap.add_argument("--busy-max-s", type=float, default=480.0, help="time limit of the busy phase")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pin", default="",
                    help="VLLM/REST CPU lists, e.g. 0/1: vLLM's process group on VLLM, clawloop up and the bench on "
                         "REST (--backend vllm)")
    ap.add_argument("--up-arg", action="append", default=[],
                    help="one more flag for `clawloop up`, e.g. --up-arg=--train-publish-interval=8 (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (store, checkpoint, up.log)")
    a = ap.parse_args(argv)

    model = a.model
    if not model:
        from clawloop.tinymodel.build import build_tiny_model, default_model_dir

        model = str(default_model_dir())
        if not (Path(model) / "config.json").exists():
            print(f"building the tiny model into {model} (once) ...", flush=True)
            build_tiny_model()
    data = tempfile.mkdtemp(prefix="clawloop-bench-swt-")
    port = a.port or free_port()
    tally = Tally()
    t_start = time.time()
    up = Up(model, data, port, a.backend, a.up_arg)
    print(f"clawloop up pid {up.proc.pid} on {up.url} (data {data}, backend {a.backend})", flush=True)
    watcher = PublishWatcher(up.url, tally)
    phases: dict[str, dict] = {}
    busy_probes: list[Probe] = []
    rc, stop_s, killed = None, 0.0, False
    server_codes: dict[str, float] = {}
    user_stats: dict[str, dict] = {}
    engine_publishes = train_steps = busy_publishes = 0
    busy_t0 = 0.0
    vllm_pgid: int | None = None
    vllm_note = ""
    try:
        startup_s = up.wait_healthy(900.0 if a.backend == "vllm" else 300.0)
        if a.backend == "vllm":
            h = httpx.get(up.url + "/health", timeout=10).json()
            vllm_pgid = h["replicas"][0]["pid"]  # started in its own session: its pid is the group id
            print(f"vLLM replica {h['replicas'][0]['url']} (process group {vllm_pgid})", flush=True)
            if a.pin:
                from vllm_engine import pin

                print(f"pinned: {pin(a.pin, vllm_pgid, [up.proc.pid])}", flush=True)
        watcher.start()

        meter = CpuMeter(up.proc.pid, vllm_pgid)

        def timed(seconds: float):
            end = time.perf_counter() + seconds
            return lambda: time.perf_counter() >= end

        def measure(until) -> tuple[list[Probe], dict]:
            c0, t0 = meter.snapshot(), time.perf_counter()
            probes = asyncio.run(run_probes(up.url, a.concurrency, until, tally))
            return probes, {**summarize(probes, time.perf_counter() - t0), **meter.cores(c0, meter.snapshot())}

        measure(timed(3.0))  # warm-up, not reported

        print(f"up healthy after {startup_s:.1f} s; phase quiet ({a.quiet_s:.0f} s) ...", flush=True)
        _, phases["quiet"] = measure(timed(a.quiet_s))

        print(f"phase idle ({a.idle_s:.0f} s, {a.users} side-turn users) ...", flush=True)
        v_before = watcher.version
        with Users(up.url, a.users, "side", a.turns, a.seed, tally) as users:
            _, phases["idle"] = measure(timed(a.idle_s))
        user_stats["idle"] = {"requests": users.stats.requests, "fit": users.stats.fit}
        if watcher.version != v_before:
            print("warning: the policy version changed during the idle phase", flush=True)

        print(f"phase busy (until {a.publishes} publishes and >= {a.busy_min_s:.0f} s, at most "
              f"{a.busy_max_s:.0f} s) ...", flush=True)
        base = watcher.engine_publishes
        with Users(up.url, a.users, "main", a.turns, a.seed + 1, tally) as users:
            busy_t0 = time.perf_counter()

            def busy_done() -> bool:
                elapsed = time.perf_counter() - busy_t0
                return elapsed >= a.busy_max_s or (watcher.engine_publishes - base >= a.publishes
                                                   and elapsed >= a.busy_min_s)

            busy_probes, phases["busy"] = measure(busy_done)
            busy_publishes = watcher.engine_publishes - base
        user_stats["busy"] = {"requests": users.stats.requests, "fit": users.stats.fit}
        mx = read_metrics(httpx.get(up.url + "/metrics", timeout=30).text)
        server_codes = {k.split('code="')[1].rstrip('"}'): v for k, v in mx.items()
                        if k.startswith("clawloop_requests_total{")}
        engine_publishes = int(mx.get("clawloop_engine_publishes", 0))
        train_steps = int(mx.get("clawloop_train_step", 0))
    finally:
        watcher.stop_event.set()
        if watcher.is_alive():
            watcher.join(timeout=30)
        rc, stop_s, killed = up.stop()
        if vllm_pgid is not None:  # clawloop stops its vLLM group itself; check, and stop exactly that group if not
            t_wait = time.time()
            while group_pids(vllm_pgid) and time.time() - t_wait < 20:
                time.sleep(0.2)
            if group_pids(vllm_pgid):
                os.killpg(vllm_pgid, signal.SIGKILL)
                vllm_note = "left behind by clawloop up: SIGKILLed"
            else:
                vllm_note = "exited with clawloop up"
        log_tail = up.log_tail(15) if rc != 0 else ""
        if a.keep or rc != 0:
            print(f"data dir kept: {data}", flush=True)
        else:
            shutil.rmtree(data, ignore_errors=True)

    # ---- report
    busy_end = max((p.t1 for p in busy_probes), default=busy_t0)
    samples = [s for s in watcher.samples if busy_t0 <= s.t <= busy_end]
    t_first_publish = samples[0].t - busy_t0 if samples else float("nan")
    stalls = [s.stall_s for s in samples]
    pauses = [s.pause_s for s in samples if s.pause_s == s.pause_s]
    during = [p for p in busy_probes if overlaps_publish(p, samples)]
    outside = [p for p in busy_probes if not overlaps_publish(p, samples)]
    busy_s = phases["busy"]["seconds"]
    phases["busy/during-publish"] = summarize(during)
    phases["busy/between"] = summarize(outside)
    spanning = sum(1 for p in busy_probes if p.ok and p.version_first != p.version_last)
    step_s = [s.train_step_s for s in samples if s.train_step_s == s.train_step_s]

    print()
    print(f"{'phase':<20} {'probes':>6} {'fail':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'ttft p50':>8} "
          f"{'ttft p99':>8} {'gap p99':>8} {'gap max':>8} {'tok':>5}   cores: server "
          + ("vllm " if vllm_pgid is not None else "") + "bench other")
    for name, s in phases.items():
        cores = (f"{s['cpu_server']:>14.2f} " + (f"{s['cpu_vllm']:>4.2f} " if "cpu_vllm" in s else "")
                 + f"{s['cpu_bench']:>5.2f} {s['cpu_other']:>5.2f}" if "cpu_server" in s else "")
        print(f"{name:<20} {s['probes']:>6} {s['failed']:>4} {s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f} "
              f"{s['max_ms']:>8.1f} {s['ttft_p50_ms']:>8.1f} {s['ttft_p99_ms']:>8.1f} {s['gap_p99_ms']:>8.1f} "
              f"{s['gap_max_ms']:>8.1f} {s['mean_tokens']:>5.1f} {cores}")
    idle, quiet, busy = phases["idle"], phases["quiet"], phases["busy"]
    ratio = busy["p99_ms"] / idle["p99_ms"]
    ratio_quiet = busy["p99_ms"] / quiet["p99_ms"]
    non2xx = tally.non_2xx()
    failures = non2xx + sum(tally.transport_errors.values()) + tally.stream_errors
    server_non2xx = sum(v for k, v in server_codes.items() if not k.startswith("2"))
    print()
    print(f"p99 busy / idle      {ratio:.2f}   (goal <= 1.5; vs quiet {ratio_quiet:.2f})")
    print(f"p50 busy / idle      {busy['p50_ms'] / idle['p50_ms']:.2f}")
    print(f"publishes            {busy_publishes} in {busy_s:.0f} s of busy ({len(samples)} version changes seen on "
          f"/health; first after {t_first_publish:.1f} s); at the end: engine {engine_publishes}, "
          f"train steps {train_steps}")
    if stalls:
        print(f"publish stall        median {statistics.median(stalls) * 1e3:.1f} ms, "
              f"p90 {pct(stalls, 90) * 1e3:.1f} ms, max {max(stalls) * 1e3:.1f} ms  "
              f"(engine: weights ready -> served; n={len(stalls)}); all: "
              + " ".join(f"{x * 1e3:.0f}" for x in stalls))
    if pauses:
        print(f"publish pause        median {statistics.median(pauses) * 1e3:.1f} ms, "
              f"max {max(pauses) * 1e3:.1f} ms  (vLLM: /pause -> reload -> /resume, requests frozen; "
              f"n={len(pauses)})")
    parts = {k: statistics.median(s.parts[k] for s in samples if k in s.parts)
             for k in sorted({k for s in samples for k in s.parts})}
    if parts:
        print("publish parts        medians: " + ", ".join(
            f"{k} {v / 1e6:.2f} MB" if k.startswith("bytes") else f"{k} {v * 1e3:.1f} ms" if k.endswith("_s")
            else f"{k} {v:g}" for k, v in parts.items()))
    if samples and samples[0].parts:
        worst = max(samples, key=lambda s: s.stall_s)
        print(f"slowest publish      stall {worst.stall_s * 1e3:.1f} ms, pause {worst.pause_s * 1e3:.1f} ms; parts: "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(worst.parts.items()) if k.endswith("_s")))
    if step_s:
        print(f"train step           median {statistics.median(step_s) * 1e3:.0f} ms")
    print(f"longest chunk gap    busy {busy['gap_max_ms']:.1f} ms vs idle {idle['gap_max_ms']:.1f} ms "
          f"(quiet {quiet['gap_max_ms']:.1f} ms)")
    print(f"probes across a swap {spanning}")
    print(f"requests             {tally.total()} responses: non-2xx {non2xx}, transport errors "
          f"{sum(tally.transport_errors.values())}, stream errors {tally.stream_errors} (goal 0); "
          f"server counts {server_codes}")
    print(f"users                {user_stats}")
    for ex in tally.examples:
        print(f"  e.g. {ex}")
    print(f"clawloop up stop     rc={rc} in {stop_s:.1f} s{' (killed after SIGINT timeout)' if killed else ''}")
    if vllm_note:
        print(f"vLLM process group   {vllm_note}")
    if rc != 0:
        print(f"clawloop up did not exit 0; log tail:\n{log_tail}")
    minutes = (time.time() - t_start) / 60

    r = lambda x: round(x, 2)  # noqa: E731
    print(json.dumps({
        "bench": "serve_while_training", "model": model, "concurrency": a.concurrency, "users": a.users,
        **({"backend": a.backend, "vllm_group_after_stop": vllm_note} if a.backend != "hf" else {}),
        "phases": {k: {kk: finite(r(vv) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                   for k, v in phases.items()},
        "p99_ratio_busy_idle": r(ratio), "p99_ratio_busy_quiet": r(ratio_quiet), "goal_p99_ratio": 1.5,
        "non_2xx": non2xx, "failures": failures, "server_non_2xx": int(server_non2xx), "responses": tally.total(),
        **({"pin": a.pin} if a.pin else {}), **({"up_args": a.up_arg} if a.up_arg else {}),
        "publishes": busy_publishes, "versions_seen": len(samples), "engine_publishes_total": engine_publishes,
        "train_steps": train_steps,
        "first_publish_s": finite(r(t_first_publish)),
        "publish_stall_ms": {"n": len(stalls), "median": r(statistics.median(stalls) * 1e3) if stalls else None,
                             "max": r(max(stalls) * 1e3) if stalls else None},
        **({"publish_pause_ms": {"n": len(pauses), "median": r(statistics.median(pauses) * 1e3),
                                 "max": r(max(pauses) * 1e3)}} if pauses else {}),
        **({"publish_parts_median": {k: r(v) for k, v in parts.items()}} if parts else {}),
        "max_gap_ms": {"quiet": r(quiet["gap_max_ms"]), "idle": r(idle["gap_max_ms"]), "busy": r(busy["gap_max_ms"])},
        "probes_across_swap": spanning, "up_exit_code": rc, "up_killed": killed, "minutes": r(minutes),
    }))
    return 0 if rc == 0 and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
