"""Env pools on a Ray cluster (issue #14): the buffer's environments as actors on the env resource.

(a) SpreadPool (no Ray): allocations spread over two real pool servers by fewest open leases, lease
    ids route every call back, 429 only when every server is full, an unreachable server is passed
    over, task ids come from the first that answers;
(b) `clawloop buffer --ray local --env-workers 2` as a user runs it: the pools start, the generator
    it starts at once leases from both through `env_pool_url`, and Ctrl-C stops them;
(c) on one module-wide local cluster (2 CPUs, loopback, no dashboard): two env actors hold {env: 1}
    on a node that offers it; toolcall episodes (the task's reference solution as the agent) run
    through a SpreadPool over both; killing an actor: Ray restarts it on the same URL, its old
    leases are gone, new allocations succeed on it; a cluster without the resource is a
    ConfigError naming ray.env_workers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from conftest import ServerThread, free_port, needs_part, require_or_skip

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = [pytest.mark.ray, needs_part("ray", not HAVE_RAY and "ray is not installed (pip install clawloop[ray])")]

CALC_TOOLS = {"tools": [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]}


def _mark(*marks):
    def deco(fn):
        for m in marks:
            fn = m(fn)
        return fn
    return deco


def _tools(folder) -> str:
    path = folder / "tools.json"
    path.write_text(json.dumps(CALC_TOOLS))
    return str(path)


def _play(pool, lease_id: str) -> dict:
    """One toolcall episode on a lease, the task's reference solution acting: reset, step, evaluate."""
    first = pool.reset(lease_id)
    assert first["tools"][0]["function"]["name"] == "calculator"
    pool.heartbeat(lease_id)
    out = None
    for message in pool.oracle(lease_id)["messages"]:
        out = pool.step(lease_id, message)
    assert out is not None and out["done"]
    return pool.evaluate(lease_id)


# -- (a) SpreadPool, no Ray ------------------------------------------------------------------------------
def test_spread_pool_over_two_servers(tmp_path):
    from clawloop.envs.base import EnvOptions
    from clawloop.envs.pool import EnvPool, HTTPPool, PoolError, SpreadPool, connect_pool, create_pool_app

    opts = EnvOptions(tools_config=_tools(tmp_path))
    pools = [EnvPool("toolcall", opts, capacity=2) for _ in range(2)]
    servers = [ServerThread(create_pool_app(p)).start() for p in pools]
    sp = None
    try:
        assert isinstance(connect_pool(servers[0].url, "toolcall", opts, 1), HTTPPool)
        sp = connect_pool(f"{servers[0].url}, {servers[1].url}", "toolcall", opts, 1)
        assert isinstance(sp, SpreadPool) and sp.urls == [s.url for s in servers]
        ids = sp.task_ids()
        assert ids == pools[0].task_ids()

        # fewest open leases first: 2 + 2, then full everywhere -> 429
        leases = [sp.allocate(ids[i])["lease_id"] for i in range(4)]
        assert sorted(lid.split(":")[0] for lid in leases) == ["0", "0", "1", "1"]
        assert [p.status()["active"] for p in pools] == [2, 2]
        with pytest.raises(PoolError) as full:
            sp.allocate(ids[4])
        assert full.value.status == 429

        # every call routes back to the server that handed the lease out
        for lid in leases[:2]:
            ev = _play(sp, lid)
            assert ev["success"] and ev["reward"] == 1.0
        assert {leases[0][0], leases[1][0]} == {"0", "1"}
        assert [p.counts["allocated"] for p in pools] == [2, 2]
        sp.close(leases[0])
        assert pools[int(leases[0][0])].status()["active"] == 1
        again = sp.allocate(ids[5])["lease_id"]  # the only pool with room, and the one with fewer leases
        assert again[0] == leases[0][0]
        for bad in ("no-index", "7:abc", ":abc"):
            with pytest.raises(PoolError) as nope:
                sp.reset(bad)
            assert nope.value.status == 404
        for lid in [again] + leases[1:]:
            sp.close(lid)
        assert sp.status()["active"] == 0 and sp.status()["reachable"] == 2

        # server 0 goes away: allocations and task ids come from server 1; a lease on 0 is lost (503)
        two = sorted(sp.allocate(ids[0])["lease_id"] for _ in range(2))
        assert [lid[0] for lid in two] == ["0", "1"]
        held = two[0]
        sp.close(two[1])
        servers[0].stop()
        with pytest.raises(PoolError) as lost:
            sp.step(held, {"role": "assistant", "content": "\\boxed{1}"})
        assert lost.value.status == 503
        assert sp.task_ids() == ids
        moved = [sp.allocate(ids[i])["lease_id"] for i in range(2)]
        assert [lid[0] for lid in moved] == ["1", "1"]
        with pytest.raises(PoolError) as still_full:  # one full, one unreachable: retry later, not "down"
            sp.allocate(ids[2])
        assert still_full.value.status == 429
        assert sp.status()["reachable"] == 1
        servers[1].stop()
        with pytest.raises(PoolError) as down:
            sp.allocate(ids[3])
        assert down.value.status == 503
    finally:
        if sp is not None:
            sp.shutdown()
        for s in servers:
            s.stop()
        for p in pools:
            p.shutdown()


# -- (b) the buffer as a user runs it ---------------------------------------------------------------------
@_mark(*needs_ray)
def test_buffer_with_ray_env_workers_leases_from_both_pools(tmp_path):
    """`clawloop buffer --ray local --env-workers 2 --env-type toolcall`: the pools start on the env
    resource, the rollout started at once leases from both of them (its episodes fail at the gateway,
    which is not running: only the environments are under test), Ctrl-C stops pools and cluster."""
    temp = tempfile.mkdtemp(prefix="clray-", dir="/tmp")  # short: Ray's socket paths live here
    port = free_port()
    cmd = [sys.executable, "-m", "clawloop.cli", "buffer", "--ray", "local", "--env-workers", "2", "--env-type",
           "toolcall", "--tools-config", _tools(tmp_path), "--port", str(port), "--serve.port", str(free_port()),
           "--data-dir", str(tmp_path / "data"), "--ray-num-cpus", "2", "--ray-object-store-mb", "128",
           "--ray-temp-dir", temp, "--env-num-cpus", "0.5", "--parallel-envs", "2", "--num-tasks", "2",
           "--n-samples-per-task", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    lines: list[str] = []
    try:
        urls: list[str] = []
        deadline = time.time() + 60
        while not urls and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "env pool(s) on the ray local cluster" in line:
                urls = [w.rstrip(",") for w in line.split() if w.startswith("http://127.0.0.1:")]
        assert len(urls) == 2, "".join(lines)[-3000:]
        allocated: list[int] = []
        while time.time() < deadline:
            allocated = [httpx.get(u + "/status").json()["allocated"] for u in urls]
            if all(allocated):
                break
            time.sleep(0.3)
        assert all(allocated), allocated
        h = httpx.get(f"http://127.0.0.1:{port}/health").json()
        rows = {a["name"]: a for a in h["actors"]}  # the buffer's /health lists its env-pool actors
        assert set(rows) == {"env-0", "env-1"} and {a["url"] for a in rows.values()} == set(urls)
        assert all(a["state"] == "up" and a["role"] == "env" and a["node_ip"] == "127.0.0.1" for a in rows.values())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, ("".join(lines) + out)[-3000:]
    for u in urls:  # the actors went with the buffer
        with pytest.raises(httpx.HTTPError):
            httpx.get(u + "/health", timeout=2)


# -- (c) one local cluster ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env_pools(tmp_path_factory):
    require_or_skip("ray", not HAVE_RAY and "ray is not installed")
    import ray

    from clawloop.config import load_config
    from clawloop.distributed import env_actor
    from clawloop.distributed.env_actor import start_env_pools
    from clawloop.distributed.ray_runtime import connect

    folder = tmp_path_factory.mktemp("ray-env")
    temp = tempfile.mkdtemp(prefix="clray-", dir="/tmp")
    # env-0 is asked for a port this test holds (bound, not listening: connections are refused), so
    # each of its incarnations falls back to a free port and its URL changes when it restarts
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    real_ports = env_actor._free_ports
    cfg = load_config({"data_dir": str(folder / "data"), "ray__mode": "local", "ray__num_cpus": "2",
                       "ray__object_store_mb": "128", "ray__temp_dir": temp, "ray__env_workers": "2",
                       "ray__env_num_cpus": "0.5", "env__track": "toolcall", "env__tools_config": _tools(folder),
                       "env__parallel_envs": "4"}, env={})
    info = connect(cfg)
    assert info["started"] and info["address"].startswith("127.0.0.1:")
    pools = None
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(env_actor, "_free_ports", lambda n: [taken.getsockname()[1]] + real_ports(n - 1))
            pools = start_env_pools(cfg)
        yield cfg, pools
    finally:
        if pools is not None:
            pools.close()
        ray.shutdown()
        taken.close()
        shutil.rmtree(temp, ignore_errors=True)


@_mark(*needs_ray)
def test_env_actors_hold_the_env_resource(env_pools):
    import ray

    cfg, pools = env_pools
    rows = pools.health()
    assert [r["name"] for r in rows] == ["env-0", "env-1"] and {r["role"] for r in rows} == {"env"}
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    for r in rows:
        assert r["state"] == "up" and r["restarts"] == 0 and r["leases"] == 0 and r["capacity"] == 2
        assert r["resources"]["env"] == 1.0 and r["resources"]["CPU"] == 0.5  # what Ray gave the actor
        assert nodes[r["node_id"]]["Resources"].get("env", 0) >= 1  # a node offering the resource
        assert r["node_ip"] == "127.0.0.1" and r["url"].startswith("http://127.0.0.1:") and r["pid"]
    assert pools.urls == [r["url"] for r in rows] and len(set(pools.urls)) == 2
    assert ray.available_resources().get("env", 0) == ray.cluster_resources()["env"] - 2


@_mark(*needs_ray)
def test_toolcall_episodes_through_both_pools(env_pools):
    from clawloop.envs.pool import SpreadPool, connect_pool
    from clawloop.envs.rollout import env_options

    cfg, pools = env_pools
    sp = connect_pool(",".join(pools.urls), "toolcall", env_options(cfg.env.payload()), 4)
    assert isinstance(sp, SpreadPool)
    try:
        ids = sp.task_ids()
        leases = [sp.allocate(ids[i])["lease_id"] for i in range(2)]
        assert sorted(lid[0] for lid in leases) == ["0", "1"]  # one on each actor
        assert [r["leases"] for r in pools.health()] == [1, 1]
        for lid in leases:
            ev = _play(sp, lid)
            assert ev["success"] and ev["reward"] == 1.0 and ev["details"]["n_calls"] == 1
            sp.close(lid)
        assert [r["leases"] for r in pools.health()] == [0, 0]
        assert [s["allocated"] for s in sp.status()["pools"]] == [1, 1]
    finally:
        sp.shutdown()


def _wait_restarted(pools, i: int, restarts: int) -> dict:
    deadline = time.time() + 30
    while time.time() < deadline:
        row = pools.health()[i]
        if row["state"] == "up" and row["restarts"] == restarts:
            return row
        time.sleep(0.3)
    raise AssertionError(f"env-{i} did not come back: {row}")


@_mark(*needs_ray)
def test_killed_env_actors_come_back(env_pools):
    """env-1 comes back on its port (the URLs generators hold stay valid); env-0's port is taken, so
    it comes back on another: the new URLs are announced, a SpreadPool on the old ones passes over it.
    Leases held on a killed pool are lost."""
    import ray

    from clawloop.envs.pool import PoolError, SpreadPool

    cfg, pools = env_pools
    urls = list(pools.urls)
    changes: list[list[str]] = []
    pools.on_change = changes.append
    sp = SpreadPool(urls)
    sp2 = None
    try:
        ids = sp.task_ids()
        held0, held1 = sorted(sp.allocate(ids[i])["lease_id"] for i in range(2))
        assert (held0[0], held1[0]) == ("0", "1")
        before = pools.health()

        ray.kill(pools.handles[1], no_restart=False)
        row = _wait_restarted(pools, 1, 1)
        assert row["pid"] != before[1]["pid"] and row["leases"] == 0
        assert pools.urls == urls and not changes  # the same port
        with pytest.raises(PoolError) as lost:  # its leases died with it
            sp.reset(held1)
        assert lost.value.status in (404, 410)
        with pytest.raises(PoolError):  # what a generator's `finally: close` meets (and ignores)
            sp.close(held1)
        lid = sp.allocate(ids[3])["lease_id"]  # env-1 holds fewer of this client's leases: it gets it
        assert lid[0] == "1" and _play(sp, lid)["success"]
        sp.close(lid)

        ray.kill(pools.handles[0], no_restart=False)
        _wait_restarted(pools, 0, 1)
        new = pools.urls
        assert new[0] != urls[0] and new[1] == urls[1] and changes == [new]
        with pytest.raises(PoolError) as gone:
            sp.reset(held0)
        assert gone.value.status == 503
        with pytest.raises(PoolError):
            sp.close(held0)
        assert [sp.allocate(ids[i])["lease_id"][0] for i in range(2)] == ["1", "1"]  # passed over env-0's old URL

        sp2 = SpreadPool(new)  # what the next rollout's generator gets
        lid = sorted(sp2.allocate(ids[4])["lease_id"] for _ in range(2))[0]
        assert lid[0] == "0" and _play(sp2, lid)["success"]
        assert [r["restarts"] for r in pools.health()] == [1, 1]
    finally:
        sp.shutdown()
        if sp2 is not None:
            sp2.shutdown()


@_mark(*needs_ray)
def test_a_cluster_without_the_resource_is_a_config_error(env_pools, tmp_path):
    import ray

    from clawloop.config import ConfigError, load_config
    from clawloop.distributed.env_actor import start_env_pools

    base = {"data_dir": str(tmp_path), "ray__mode": "local", "ray__env_workers": "2", "env__track": "toolcall"}
    cfg = load_config({**base, "ray__env_resource": "cpu_node"}, env={})
    with pytest.raises(ConfigError, match=r"ray\.env_workers.*'cpu_node'"):
        start_env_pools(cfg)
    with pytest.raises(ConfigError, match=r"env\.track"):
        start_env_pools(load_config({**base, "env__track": ""}, env={}))
    assert "cpu_node" not in ray.cluster_resources()
