"""`clawloop up --ray local --backend vllm`: vLLM servers started on Ray actors' nodes (`make test-vllm`).

A private 2-CPU loopback cluster; one vLLM replica on a `VLLMHost` actor and two data-parallel
trainer actors. Under feedback the trainer group publishes through the vLLM engine (weights written
for the server, pause → reload → resume) and the served version advances; `ray.kill` of the host
actor: Ray restarts it, the engine restarts the server there and brings it back to the current
weights and version; /health lists the actors all along.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import ServerThread, make_cfg, needs_part, require_or_skip

pytestmark = [pytest.mark.vllm, needs_part("ray", importlib.util.find_spec("ray") is None and "ray is not installed")]


@pytest.fixture(scope="module")
def up(random_model_dir, tmp_path_factory):
    import ray

    from clawloop.engines.vllm import VLLMNotInstalled, find_vllm_python
    from clawloop.apps.serve import build_app

    try:
        find_vllm_python(os.environ.get("VLLM_PYTHON", ""))
    except VLLMNotInstalled as e:
        require_or_skip("vllm", f"no vLLM environment: {e}")
    temp = tempfile.mkdtemp(prefix="clawloop-rayvllm-", dir="/tmp")
    data = tmp_path_factory.mktemp("ray-vllm") / "data"
    cfg = make_cfg(random_model_dir, data, model__backend="vllm", model__max_model_len="512",
                   ray__mode="local", ray__num_cpus="2", ray__object_store_mb="128", ray__temp_dir=temp,
                   ray__engine_num_cpus="1", ray__trainer_num_cpus="0.5", ray__trainer_workers="2",
                   model__engine_replicas="1", model__health_interval_s="1", train__rollout_batch_size="2",
                   train__lr="1e-3", train__method="binary", train__negative_weight="1", judge__poll_interval_s="0.1",
                   ray__health_interval_s="0.5", ray__start_timeout_s="300")
    app, parts = build_app(cfg, judge=True, train=True)
    assert type(parts.engine).__name__ == "RayVLLMEngine"
    server = ServerThread(app).start(timeout=900)
    deadline = time.time() + 300
    while parts.trainer is None:
        assert time.time() < deadline, "the trainer group did not come up"
        time.sleep(0.2)
    try:
        yield server, parts
    finally:
        server.stop()
        parts.store.close()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def _wait(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.5)


def _converse(c, sid):
    msgs = [{"role": "user", "content": "What is 12+7?"}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, extra_headers={"X-Session-Id": sid})
    msgs += [{"role": "assistant", "content": r.choices[0].message.content},
             {"role": "user", "content": "just the number, please"}]
    c.chat.completions.create(model="m", messages=msgs, max_tokens=8,
                              extra_headers={"X-Session-Id": sid, "X-Session-Done": "1"})


def _group_members(pgid: int) -> list[str]:
    """Live processes (zombies hold nothing) of a process group, as 'pid name'."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                raw = (d / "stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2:].split()
            if fields[0] not in "ZX" and int(fields[2]) == pgid:
                out.append(f"{d.name} {raw[raw.index('(') + 1:raw.rindex(')')]}")
    return out


def test_vllm_replica_on_a_ray_actor_trains_publishes_and_survives_its_actor_killed(up):
    import ray

    server, parts = up
    eng = parts.engine
    h = httpx.get(server.url + "/health", timeout=10).json()
    assert h["backend"] == "vllm" and h["status"] == "ok"
    actors = {a["name"]: a for a in h["actors"]}
    assert set(actors) == {"engine-0", "trainer-0", "trainer-1"}
    e0 = actors["engine-0"]
    assert e0["state"] == "up" and e0["node_ip"] == "127.0.0.1" and e0["url"].startswith("http://127.0.0.1:")
    assert e0["ray_name"].endswith("-engine-0") and h["ray"]["mode"] == "local"
    # the server is not a child of this process: its host actor (a Ray worker process) started it
    ppid = int(open(f"/proc/{e0['pid']}/stat").read().rsplit(")", 1)[1].split()[1])
    host = ray.get(eng.hosts[0].info.remote())
    assert ppid != os.getpid() and ppid == host["pid"] and host["server_pid"] == e0["pid"]

    c = _client(server.url)
    for i in range(3):
        _converse(c, f"fb{i}")
    _wait(lambda: eng.policy_version >= 1, 300, "no publish reached the vLLM replica")
    tl = parts.trainer
    assert tl.counts["publishes"] >= 1 and tl.stats()["train/world_size"] == 2
    assert eng.replicas[0].version == eng.policy_version
    assert (eng.weights_dir / f"v{eng.policy_version}").exists() or any(eng.weights_dir.glob("v*"))

    # kill the host actor: Ray restarts it, the engine restarts vLLM on it at the current version
    old_pid, old_url = eng.replicas[0].process.pid, eng.replicas[0].url
    served = eng.policy_version
    ray.kill(eng.hosts[0], no_restart=False)
    _wait(lambda: eng.replicas[0].state != "up", 60, "the engine did not notice its host died")
    _wait(lambda: eng.replicas[0].state == "up", 600, f"the vLLM replica did not come back: {eng.health()}")
    assert eng.replicas[0].restarts >= 1 and eng.replicas[0].process.pid != old_pid
    # nothing of the killed host's server outlives it (the launcher's pid is its process group's id)
    _wait(lambda: not _group_members(old_pid), 60, f"vLLM processes of the killed host outlived it: "
          f"{_group_members(old_pid)}")
    assert eng.replicas[0].version == eng.policy_version >= served
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                  extra_headers={"X-Session-Id": "after", "X-Session-Done": "1"})
    assert r.choices[0].message.content is not None
    parts.store.flush()
    assert parts.store.session_turns("after")[0].policy_version == eng.policy_version
    h = httpx.get(server.url + "/health", timeout=10).json()
    assert h["status"] == "ok" and {a["name"]: a for a in h["actors"]}["engine-0"]["restarts"] >= 1
    print(f"vLLM on Ray: v{eng.policy_version}, host killed and back ({old_url} -> {eng.replicas[0].url})")
