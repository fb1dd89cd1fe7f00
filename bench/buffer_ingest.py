"""Rollout buffer ingest benchmark: writes/s from concurrent writers, and read
latency with 10k items pending, against a real `clawloop buffer` server on
127.0.0.1 (a child process; this script is the client).

    .venv/bin/python bench/buffer_ingest.py                 # defaults below
    .venv/bin/python bench/buffer_ingest.py --items 20000 --writers 32

Writers are keep-alive HTTP/1.1 connections driven by one asyncio loop with
pre-encoded requests, so the client spends as little CPU as possible (on a
small machine it shares the cores with the server; the table says how many,
and the load average, since other work on the machine moves wall-clock
numbers). Items per server CPU-second is the load-independent figure: what
one core running only the buffer would sustain. Every write is answered only
after its SQLite commit, as in production.

Phases:
  write      POST /buffer/write, one item per request (slime's endpoint)
  batch      POST /buffer/write_batch, --batch items per request (extension)
  read       10k items pending (complete groups): /buffer/stats and
             /get_rollout_data {"batch_size": 64} latency, then one full drain

Prints a table and, last, one JSON line with every number.
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


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def item(instance_id: str, k: int, pad: int) -> dict:
    return {"instance_id": instance_id, "reward": float(k % 2), "uid": f"{instance_id}-{k}",
            "messages": [{"role": "user", "content": "What is 12+7?"},
                         {"role": "assistant", "content": "19" + " " * pad}],
            "extra_info": {"k": k}}


def request_bytes(port: int, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return status, body


async def drive(port: int, requests: list[bytes], conns: int) -> tuple[float, int]:
    """Send every request over `conns` keep-alive connections; (seconds, failures)."""
    queue_ = iter(requests)
    failures = 0

    async def worker() -> None:
        nonlocal failures
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for req in queue_:
                writer.write(req)
                status, _ = await _read_response(reader)
                if status != 200:
                    failures += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return time.perf_counter() - t0, failures


def start_server(port: int, data_dir: Path, group_size: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "clawloop.cli", "buffer", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(data_dir), "--num-rollouts-per-prompt", str(group_size), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"buffer exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("buffer did not start within 60 s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=20000, help="items per write phase")
    ap.add_argument("--writers", type=int, default=32, help="concurrent keep-alive connections")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=100, help="items per /buffer/write_batch request")
    ap.add_argument("--pending", type=int, default=10000, help="items pending for the read phase")
    ap.add_argument("--pad", type=int, default=200, help="extra bytes of answer text per item")
    ap.add_argument("--data-dir", default="", help="default: a temp dir, removed afterwards")
    args = ap.parse_args()

    tmp = Path(args.data_dir or tempfile.mkdtemp(prefix="clawloop-bench-buffer-"))
    port = free_port()
    proc = start_server(port, tmp, args.group_size)
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=300)
    res: dict = {"bench": "buffer_ingest", "items": args.items, "writers": args.writers,
                 "group_size": args.group_size, "batch": args.batch, "cpus": os.cpu_count()}
    try:
        g = args.group_size
        # -- write: one item per request ------------------------------------------------
        reqs = [request_bytes(port, "/buffer/write",
                              json.dumps(item(f"w{i // g}", i % g, args.pad)).encode()) for i in range(args.items)]
        res["item_bytes"] = len(reqs[0])
        asyncio.run(drive(port, reqs[:500], args.writers))  # warm-up (connections, caches)
        cpu0 = cpu_seconds(proc.pid)
        secs, fails = asyncio.run(drive(port, reqs[500:], args.writers))
        res["write_items_per_s"] = (len(reqs) - 500) / secs
        res["write_server_cpu_s"] = cpu_seconds(proc.pid) - cpu0
        res["write_items_per_server_cpu_s"] = (len(reqs) - 500) / max(res["write_server_cpu_s"], 1e-9)
        res["write_failures"] = fails
        # -- batch: many items per request ----------------------------------------------
        items = [item(f"b{i // g}", i % g, args.pad) for i in range(args.items)]
        breqs = [request_bytes(port, "/buffer/write_batch", json.dumps(items[i:i + args.batch]).encode())
                 for i in range(0, len(items), args.batch)]
        cpu0 = cpu_seconds(proc.pid)
        secs, fails = asyncio.run(drive(port, breqs, min(args.writers, 8)))
        res["batch_items_per_s"] = len(items) / secs
        res["batch_items_per_server_cpu_s"] = len(items) / max(cpu_seconds(proc.pid) - cpu0, 1e-9)
        res["batch_failures"] = fails
        # -- read: 10k pending -----------------------------------------------------------
        t0 = time.perf_counter()
        drained = client.post("/get_rollout_data", json={}).json()
        res["drain_ms_after_writes"] = (time.perf_counter() - t0) * 1000
        res["drained_after_writes"] = len(drained["data"]["data"])
        items = [item(f"r{i // g}", i % g, args.pad) for i in range(args.pending)]
        for i in range(0, len(items), 500):
            client.post("/buffer/write_batch", json=items[i:i + 500]).raise_for_status()
        stats = client.get("/buffer/stats").json()["data"]["data"][0]
        res["pending_before_read"] = stats["current_size"]
        stat_ms = timed(lambda: client.get("/buffer/stats").raise_for_status(), 20)
        got = []
        read_ms = timed(lambda: got.append(len(client.post("/get_rollout_data", json={"batch_size": 64})
                                               .json()["data"]["data"])), 20)
        res["stats_ms_p50"], res["stats_ms_p95"] = statistics.median(stat_ms), pct(stat_ms, 0.95)
        res["read64_ms_p50"], res["read64_ms_p95"] = statistics.median(read_ms), pct(read_ms, 0.95)
        res["read64_items"] = sum(got)
        remaining = client.get("/buffer/stats").json()["data"]["data"][0]["current_size"]
        t0 = time.perf_counter()
        full = client.post("/get_rollout_data", json={}).json()
        res["drain_ms"] = (time.perf_counter() - t0) * 1000
        res["drain_items"] = len(full["data"]["data"])
        res["drain_expected"] = remaining
        final = client.get("/buffer/stats").json()["data"]["data"][0]
        res["total_written"], res["total_read"] = final["total_written"], final["total_read"]
    finally:
        client.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not args.data_dir:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = [
        ("write   (1 item/request)", f"{res['write_items_per_s']:,.0f} items/s",
         f"{args.writers} writers; {res['write_items_per_server_cpu_s']:,.0f} items per server CPU-second"),
        ("batch   (write_batch)", f"{res['batch_items_per_s']:,.0f} items/s",
         f"{args.batch} items/request; {res['batch_items_per_server_cpu_s']:,.0f} per server CPU-second"),
        ("stats   (10k pending)", f"p50 {res['stats_ms_p50']:.1f} ms", f"p95 {res['stats_ms_p95']:.1f} ms"),
        ("read 64 (10k pending)", f"p50 {res['read64_ms_p50']:.1f} ms", f"p95 {res['read64_ms_p95']:.1f} ms"),
        ("drain   (all pending)", f"{res['drain_ms']:.0f} ms", f"{res['drain_items']} items"),
    ]
    res["loadavg_1m"] = os.getloadavg()[0]
    print(f"rollout buffer ingest — {res['cpus']} CPUs shared by server and client (load avg "
          f"{res['loadavg_1m']:.1f}), item ~{res['item_bytes']} B")
    for name, a, b in rows:
        print(f"  {name:<26} {a:>18}   {b}")
    res["goal_writes_per_s"] = 5000
    res["goal_met_single"] = res["write_items_per_s"] >= 5000
    res["goal_met_batch"] = res["batch_items_per_s"] >= 5000
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
