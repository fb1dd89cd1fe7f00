"""`clawloop up --ray`: the loops as Ray actors (issue #14), on a private local cluster.

One module-wide cluster (2 CPUs, loopback only, no dashboard, a small object store, its own session
folder), a tiny random model, 1 hf engine actor and 2 data-parallel trainer actors:

(a) one data-parallel step equals the single-process step on the same batch (the all-reduce, not
    two independent half-batch steps);
(b) under feedback through the real gateway the served policy version advances, and /health lists
    every actor with its state and node;
(c) killing the engine actor mid-traffic: Ray restarts it, it comes back on the current weights,
    every request succeeds and every one is captured;
(d) killing a trainer actor: the group restarts from the latest checkpoint, training goes on and the
    served version never goes backwards.

Without `--ray` clawloop never imports ray (checked in a subprocess, without ray marks).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

from conftest import ServerThread, make_cfg, needs_part, require_or_skip

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = [pytest.mark.ray, needs_part("ray", not HAVE_RAY and "ray is not installed (pip install clawloop[ray])")]


def _mark(*marks):
    def deco(fn):
        for m in marks:
            fn = m(fn)
        return fn
    return deco


# -- without --ray ---------------------------------------------------------------------------------------
def test_without_ray_flag_ray_is_never_imported(random_model_dir, tmp_path):
    code = f"""
import sys
from clawloop.config import load_config
from clawloop.apps.serve import build_app
import clawloop.cli
cfg = load_config({{"model__path": {str(random_model_dir)!r}, "data_dir": {str(tmp_path / 'data')!r}}}, env={{}})
app, parts = build_app(cfg, judge=True, train=True)
parts.store.close()
print("RAY_IMPORTED" if "ray" in sys.modules else "NO_RAY")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "NO_RAY"


def test_ray_config_is_validated_with_the_key_named(random_model_dir, tmp_path):
    from clawloop.config import ConfigError, load_config

    base = {"model__path": str(random_model_dir), "data_dir": str(tmp_path)}
    cfg = load_config({**base, "ray__mode": "local", "ray__trainer_workers": "2"}, env={})
    assert cfg.ray.mode == "local" and cfg.ray.trainer_workers == 2 and cfg.ray.env_resource == "env"
    assert load_config(base, env={"CLAWLOOP_RAY_MODE": "auto"}).ray.mode == "auto"
    for flags, key in ([{"ray__mode": "cluster"}, "ray.mode"], [{"ray__trainer_workers": "-1"}, "ray.trainer_workers"],
                       [{"ray__judge_workers": "2"}, "ray.judge_workers"], [{"ray__env_resource": "a b"},
                                                                           "ray.env_resource"],
                       [{"ray__mode": "local", "model__backend": "vllm", "model__engine_urls": ["http://127.0.0.1:9"]},
                        "ray.mode"], [{"ray__mode": "local", "train__rollout_gpus": "0,1"}, "train.rollout_gpus"],
                       [{"ray__mode": "local", "ray__judge_workers": "1"}, "ray.judge_workers"],
                       [{"ray__env_workers": "1"}, "ray.env_workers"], [{"ray__name": "a b"}, "ray.name"],
                       [{"ray__engine_num_cpus": "-2"}, "ray.engine_num_cpus"],
                       [{"ray__mode": "local", "ray__num_cpus": "1", "ray__trainer_num_cpus": "4"},
                        "ray.trainer_num_cpus"], [{"ray__token_timeout_s": "0"}, "ray.token_timeout_s"]):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config({**base, **flags}, env={})


# -- the cluster ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(random_model_dir, tmp_path_factory):
    require_or_skip("ray", not HAVE_RAY and "ray is not installed")
    import ray

    from clawloop.distributed.ray_runtime import connect

    temp = tempfile.mkdtemp(prefix="clawloop-ray-test-", dir="/tmp")  # short: Ray's socket paths live here
    cfg = make_cfg(random_model_dir, tmp_path_factory.mktemp("ray-cluster"), ray__mode="local", ray__num_cpus="2",
                   ray__object_store_mb="128", ray__temp_dir=temp)
    info = connect(cfg)
    assert info["started"] and info["address"].startswith("127.0.0.1:")
    try:
        yield info
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _samples(tok, n):
    from clawloop.gateway.render import render_prompt
    from clawloop.records import Sample

    out = []
    for i in range(n):
        prompt = render_prompt(tok, [{"role": "user", "content": f"What is {i}+{i + 3}?"}], None)
        resp = tok.encode(["19", "The answer is 19.", "It is nineteen, I think"][i % 3],
                          add_special_tokens=False) + [tok.eos_token_id]
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-2.0 - 0.1 * i] * len(resp),
                          prompt_len=len(prompt), reward=1.0 if i % 2 == 0 else -1.0,
                          group_id=f"g{i // 4}"))
    return out


@_mark(*needs_ray)
def test_a_data_parallel_step_equals_the_single_process_step(cluster, random_model_dir, tmp_path):
    import ray
    import torch

    from clawloop.distributed.trainer_group import TrainerGroup
    from clawloop.distributed.weights import unpack
    from clawloop.trainer.core import Trainer

    # two updates per batch (old logprobs before the first, the PPO clip acting in the second), groups
    # that span both ranks' shards, micro-batches under a token budget, and a frozen teacher (KL)
    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-3",
                   train__num_steps_per_rollout="2", train__micro_batch_tokens="64", train__kl_coef="0.05")
    single = Trainer(cfg, str(random_model_dir), device="cpu")
    samples = _samples(single.tokenizer, 8)
    s1 = single.step(list(samples))
    want = single.served_state_dict()

    group = TrainerGroup(cfg, str(random_model_dir), workers=2, num_cpus=0.5, start_timeout_s=120, step_timeout_s=120)
    try:
        s2 = group.step(list(samples))
        got = unpack(ray.get(group.served_weights_ref()))
        prints = group.fingerprints()
    finally:
        group.shutdown()
    assert s2["train/world_size"] == 2.0 and s2["train/policy_version"] == 1
    assert s2["train/samples"] == s1["train/samples"] == 8 and s2["train/tokens"] == s1["train/tokens"]
    assert s2["train/grad_norm"] == pytest.approx(s1["train/grad_norm"], rel=1e-4)
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], rel=1e-4, abs=1e-6)
    assert prints[0] == pytest.approx(prints[1], rel=0, abs=1e-9), "the ranks' replicas drifted apart"
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 2e-6, f"data-parallel weights differ from the single-process step by {worst}"
    print(f"data-parallel vs single-process: max |dw| {worst:.2e}, grad_norm {s2['train/grad_norm']:.6f} vs "
          f"{s1['train/grad_norm']:.6f}")

    # and it is not two independent half-batch steps: those land somewhere else
    half = Trainer(cfg, str(random_model_dir), device="cpu")
    sh = half.step(list(samples[:2]) + list(samples[4:6]))
    other = half.served_state_dict()
    assert abs(sh["train/grad_norm"] - s1["train/grad_norm"]) > 1e-3 * s1["train/grad_norm"]
    assert max(float((other[k] - want[k]).abs().max()) for k in want) > 1e-4
    del torch


# -- clawloop up --ray, served for real ------------------------------------------------------------------
@pytest.fixture(scope="module")
def up(cluster, random_model_dir, tmp_path_factory):
    """`build_app` as `clawloop up --ray local --engine-replicas 1 --trainer-workers 2` builds it (on the
    module's cluster, which it finds already connected), served by uvicorn on 127.0.0.1."""
    from types import SimpleNamespace

    from clawloop.apps.serve import build_app

    data = tmp_path_factory.mktemp("ray-up") / "data"
    cfg = make_cfg(random_model_dir, data, ray__mode="local", ray__engine_num_cpus="0.5",
                   ray__trainer_num_cpus="0.5", ray__trainer_workers="2", model__engine_replicas="1",
                   train__rollout_batch_size="2", train__lr="1e-3", train__method="combine", train__save_interval="1",
                   judge__poll_interval_s="0.1", ray__health_interval_s="0.5", ray__token_timeout_s="30",
                   ray__replica_wait_s="90", ray__start_timeout_s="120",
                   # the module's feedback is a few conversations of one correction each: their answers after the
                   # correction (untrained by default) make the second step and checkpoint that test d resumes from
                   train__retry_weight="1")
    app, parts = build_app(cfg, judge=True, train=True)
    assert parts.ray is not None and type(parts.engine).__name__ == "RayEngine"
    server = ServerThread(app).start(timeout=60)
    deadline = time.time() + 180
    while parts.trainer is None:  # the trainer group is built in the background
        assert time.time() < deadline, "the trainer group did not come up"
        time.sleep(0.2)
    try:
        yield SimpleNamespace(url=server.url, parts=parts, cfg=cfg, engine=parts.engine, store=parts.store)
    finally:
        server.stop()
        parts.store.close()


def _client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=180)


def _converse(client, sid, replies):
    msgs = [{"role": "user", "content": "What is 12+7?"}]
    for k, reply in enumerate(replies + [None]):
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8,
                                           extra_headers={"X-Session-Id": sid,
                                                          **({"X-Session-Done": "1"} if reply is None else {})})
        if reply is not None:
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": reply}]


def _health(url):
    return httpx.get(url + "/health", timeout=10).json()


def _wait(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.2)


def _quiet(up, timeout=180):
    """Wait until everything judged is trained and published (no step for 2 s): the served version holds."""
    tl = up.parts.trainer
    gw = up.parts.gateway
    deadline = time.time() + timeout
    while True:
        s = gw.all_stats()
        if (s.get("judge/pending", 0) == 0 and len(tl.pending) < tl.tc.rollout_batch_size
                and time.time() - tl.last_step_at > 2.0 and up.engine.policy_version == tl.group.version):
            return up.engine.policy_version
        assert time.time() < deadline, f"training did not settle: {s.get('judge/pending')} {len(tl.pending)}"
        time.sleep(0.3)


@_mark(*needs_ray)
def test_b_feedback_advances_the_served_version_and_health_lists_every_actor(up, capsys):
    from clawloop.cli import main as cli

    h = _health(up.url)
    assert h["backend"] == "ray" and h["status"] == "ok" and h["policy_version"] == 0
    names = {a["name"]: a for a in h["actors"]}
    assert set(names) == {"engine-0", "trainer-0", "trainer-1"}
    for a in names.values():
        assert a["state"] == "up" and a["node_ip"] == "127.0.0.1" and a["node_id"] and a["pid"]
    port = up.cfg.serve.port
    assert names["engine-0"]["ray_name"] == f"clawloop-{port}-engine-0"  # what `ray kill-actor --name` takes
    assert names["trainer-1"]["ray_name"] == f"clawloop-{port}-trainer-1"
    assert names["engine-0"]["resources"] == {"CPU": 0.5} == names["trainer-1"]["resources"]
    assert h["ray"]["mode"] == "local" and h["ray"]["resources"]["CPU"] == 2.0 and len(h["ray"]["nodes"]) == 1
    # `clawloop status --ray` prints the same: every actor, its node, the cluster's resources
    capsys.readouterr()
    assert cli(["status", "--url", up.url, "--ray"]) == 0
    out = capsys.readouterr().out
    assert "policy v0" in out and "backend ray" in out and "CPU 2" in out
    for name in ("engine-0", "trainer-0", "trainer-1"):
        line = next(x for x in out.splitlines() if x.strip().startswith(name + " "))
        assert " up " in line and "127.0.0.1" in line and "CPU:0.5" in line, line
    c = _client(up.url)
    for i in range(3):
        _converse(c, f"fb{i}", ["just the number, please", "Thanks! What is 3+4?"])
    _wait(lambda: _health(up.url)["policy_version"] >= 1, 180, "no publish reached the engine actors")
    h = _health(up.url)
    assert h["replicas"][0]["policy_version"] == h["policy_version"]
    tl = up.parts.trainer
    assert tl.stats()["train/world_size"] == 2 and tl.counts["steps"] >= 1 and tl.counts["publishes"] >= 1
    assert tl.trainer.last["train/world_size"] == 2.0
    metrics = httpx.get(up.url + "/metrics").text
    assert 'code="5' not in metrics and 'code="4' not in metrics
    # what is captured after a publish carries the new version
    _quiet(up)
    _converse(c, "after", [])
    up.store.flush()
    assert up.store.session_turns("after")[0].policy_version == up.engine.policy_version >= 1


@_mark(*needs_ray)
def test_c_killed_engine_actor_comes_back_and_no_request_fails_or_goes_uncaptured(up):
    import ray

    eng = up.engine
    served = _quiet(up)  # no publish during this test: every turn is served by one set of weights
    done: list[tuple[str, int]] = []
    errors: list[tuple[str, str]] = []
    stop = threading.Event()

    def traffic(k):
        c = _client(up.url)
        i = 0
        while not stop.is_set():
            sid = f"kill{k}-{i}"
            i += 1
            kw = dict(model="m", messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=48,
                      extra_headers={"X-Session-Id": sid, "X-Session-Done": "1"})
            try:
                if i % 2:
                    n = sum(1 for ch in c.chat.completions.create(stream=True, **kw) if ch.choices)
                else:
                    n = c.chat.completions.create(**kw).usage.completion_tokens
                done.append((sid, n))
            except Exception as e:  # noqa: BLE001 (every failure is the test's business)
                errors.append((sid, repr(e)))

    threads = [threading.Thread(target=traffic, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    _wait(lambda: len(done) >= 3, 120, "no traffic")
    old_pid = eng.replicas[0].pid
    before = len(done)
    time.sleep(0.05)  # requests are in flight now: three clients, one replica, 48 tokens each
    ray.kill(eng.replicas[0].handle, no_restart=False)  # Ray restarts it (max_restarts)
    _wait(lambda: eng.replicas[0].restarts == 1 and eng.replicas[0].state == "up", 120,
          f"the engine actor did not come back: {eng.health()}")
    _wait(lambda: len(done) >= before + 9, 120, "traffic did not resume")
    stop.set()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors[:3]
    r = eng.health()["replicas"][0]
    assert r["state"] == "up" and r["pid"] != old_pid and r["policy_version"] == served == eng.policy_version
    assert eng.stats_.retries >= 1, "the kill hit no request in flight"
    print(f"engine kill: {len(done)} requests, {eng.stats_.retries} moved to the restarted replica, "
          f"{eng.stats_.resumed} of them continued mid-response")
    up.store.flush()
    turns = []
    for sid, _ in done:
        got = up.store.session_turns(sid)
        assert len(got) == 1, (sid, got)
        t = got[0]
        assert t.finish_reason in ("stop", "length") and t.response_ids, (sid, t.finish_reason)
        assert len(t.response_logprobs) == len(t.response_ids)
        assert set(t.response_versions or [t.policy_version]) == {served}
        turns.append(t)
    # token-exact: every captured logprob (those continued on the restarted replica too) is what the
    # served weights give that token in that context
    worst = _logprob_error(up, turns)
    assert worst < 1e-3, f"captured logprobs differ from the served weights' by {worst}"
    h = _health(up.url)
    assert h["status"] == "ok" and h["replicas"][0]["restarts"] == 1


def _logprob_error(up, turns):
    """Largest |captured - recomputed| logprob of `turns` under the weights served now."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from clawloop.distributed.weights import unpack
    from clawloop.trainer.core import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(up.cfg.model.path), dtype=torch.float32).eval()
    if up.engine.weights_ref is not None:
        model.load_state_dict(unpack(ray.get(up.engine.weights_ref)), strict=False)
    worst = 0.0
    with torch.no_grad():
        for t in turns:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
            want = lp[0, len(t.prompt_ids) - 1:]
            worst = max(worst, float((want - torch.tensor(t.response_logprobs)).abs().max()))
    return worst


@_mark(*needs_ray)
def test_c2_an_engine_killed_mid_response_the_stream_continues_on_the_restarted_one_token_exact(up):
    """The kill lands after tokens were streamed: the client's stream pauses, then goes on from the
    prompt plus what it already got (on the restarted replica, same weights), to the full length."""
    import ray

    eng = up.engine
    served = _quiet(up)
    resumed, restarts = eng.stats_.resumed, eng.replicas[0].restarts
    c = _client(up.url)
    ban = {str(t): -100 for t in eng.eos_token_ids}  # no early end: the response runs to max_tokens
    stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell me a long story."}],
                                       max_tokens=160, stream=True, logit_bias=ban,
                                       extra_body={"return_token_ids": True},
                                       extra_headers={"X-Session-Id": "midkill", "X-Session-Done": "1"})
    ids, chunks, killed, finish = [], 0, False, None
    for ch in stream:
        if not ch.choices:
            continue
        ids += (ch.choices[0].model_extra or {}).get("token_ids") or []
        chunks += 1
        finish = ch.choices[0].finish_reason or finish
        if chunks == 8 and not killed:
            ray.kill(eng.replicas[0].handle, no_restart=False)
            killed = True
    assert killed and finish == "length"
    assert eng.stats_.resumed == resumed + 1, "the response was not continued mid-way"
    _wait(lambda: eng.replicas[0].restarts == restarts + 1 and eng.replicas[0].state == "up", 60, eng.health())
    up.store.flush()
    (t,) = up.store.session_turns("midkill")
    assert len(t.response_ids) == 160 == len(t.response_logprobs) and t.finish_reason == "length"
    assert set(t.response_versions or [t.policy_version]) == {served}
    assert ids == t.response_ids, "the client's stream lost or repeated tokens across the kill"
    worst = _logprob_error(up, [t])
    assert worst < 1e-3, f"the continued response's logprobs differ from the served weights' by {worst}"


@_mark(*needs_ray)
def test_d_killed_trainer_actor_group_resumes_from_checkpoint_and_versions_never_go_back(up):
    import ray

    tl = up.parts.trainer
    group = tl.group
    eng = up.engine
    v0 = _quiet(up)
    assert v0 >= 1 and (tl.save_dir / "latest").exists(), "test (b) trains and checkpoints first"
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(int(_health(up.url)["policy_version"]))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    old_pids = {i["pid"] for i in group.infos}
    # the latest checkpoint is older than what is served (as with --save-interval N): the resumed
    # trainer's own version is behind the served one, and its next publish must still be newer
    steps = sorted(p.name for p in tl.save_dir.glob("step_*"))
    assert len(steps) >= 2, steps
    (tl.save_dir / "latest").write_text(steps[0])
    cursor_before = tl.cursor
    ray.kill(group.workers[1], no_restart=True)
    try:
        c = _client(up.url)
        for i in range(3):
            _converse(c, f"fb-after-kill{i}", ["just the number, please", "Thanks! What is 5+6?"])
        _wait(lambda: tl.recoveries and eng.policy_version > v0, 240,
              f"no recovery and publish: {tl.recoveries} v{eng.policy_version} {group.last_error}")
    finally:
        stop.set()
        watcher.join(timeout=10)
    rec = tl.recoveries[0]
    print(f"trainer kill: {rec}; served versions seen {sorted(set(seen))}")
    assert rec["source"].endswith(steps[0]) and rec["checkpoint_version"] < rec["served_version"] == v0, rec
    assert rec["version"] == v0 and rec["cursor"] < cursor_before, rec  # the steps after it train again
    assert group.restarts == 1 and group.state == "up"
    assert not old_pids & {i["pid"] for i in group.infos}
    assert seen == sorted(seen), f"the served version went backwards: {seen}"
    trainers = [a for a in _health(up.url)["actors"] if a["role"] == "trainer"]
    assert [a["state"] for a in trainers] == ["up", "up"] and all(a["restarts"] == 1 for a in trainers)


@_mark(*needs_ray)
def test_e_judge_actors_serve_a_frozen_judge_and_are_listed(cluster, up, random_model_dir, tmp_path):
    """`--judge frozen --judge-workers 1`: the judge's calls go to a judge actor, which nothing publishes
    to; /health lists it beside the engine actor. (Runs beside `up` on the same 2-CPU cluster.)"""
    from clawloop.apps.serve import build_app

    cfg = make_cfg(random_model_dir, tmp_path / "data", ray__mode="local", ray__name="judgetest",
                   ray__engine_num_cpus="0.2",
                   ray__judge_num_cpus="0.2", ray__judge_workers="1", ray__trainer_workers="0",
                   judge__kind="frozen", judge__poll_interval_s="0.1", judge__majority_vote_n="1",
                   judge__max_tokens="8", ray__start_timeout_s="120")
    app, parts = build_app(cfg, judge=True, train=False)
    server = ServerThread(app).start(timeout=60)
    try:
        c = _client(server.url)
        _converse(c, "judged", ["just the number, please"])
        backend = parts.judge.judge.backend
        _wait(lambda: backend.replies >= 1, 120, f"the judge actor answered nothing: {parts.judge.stats()}")
        h = _health(server.url)
        roles = {a["name"]: a for a in h["actors"]}
        assert set(roles) == {"engine-0", "judge-0"} and roles["judge-0"]["role"] == "judge"
        assert roles["judge-0"]["state"] == "up" and roles["judge-0"]["pid"] != roles["engine-0"]["pid"]
        assert backend.engine is not parts.engine and backend.engine.policy_version == 0
        assert backend.engine.replicas[0].requests >= 1 and backend.engine.stats_.publishes == 0
    finally:
        server.stop()
        parts.store.close()


@_mark(*needs_ray)
def test_f_train_service_runs_its_steps_on_a_data_parallel_group(cluster, random_model_dir, tmp_path, capsys):
    """`clawloop train --ray ... --trainer-workers 2` on a store: the steps run on the actors, the run
    ends with a checkpoint, and the group is gone afterwards (the cluster stays: it is not ours)."""
    import signal

    import ray

    from clawloop.naming import open_store
    from clawloop.naming import judge_name
    from clawloop.apps.train import run_train
    from clawloop.trajectories import import_sessions
    from test_train_standalone import _judge_all, _write_sessions

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__rollout_batch_size="8",
                   train__negative_weight="1", ray__mode="local", ray__name="trainsvc", ray__trainer_workers="2",
                   ray__trainer_num_cpus="0.25")
    data = tmp_path / "turns.jsonl"
    _write_sessions(data, 20)
    import_sessions(cfg, data)
    store = open_store(cfg)
    _judge_all(store, judge_name(cfg))
    store.close()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert run_train(cfg, exit_when_idle=True) == 0
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    out = capsys.readouterr().out
    assert "2 trainer actor(s) x 0.25 CPU" in out and "trained 2 step(s) this run" in out, out
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert ray.is_initialized()  # the module's cluster is still connected
    named = ray.util.list_named_actors(all_namespaces=True)  # [{"name", "namespace"}] of live actors
    assert all(isinstance(a, dict) and "name" in a for a in named), named
    assert not [a["name"] for a in named if a["name"].startswith("trainsvc-")], named
