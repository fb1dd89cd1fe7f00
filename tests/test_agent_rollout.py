"""Agent tracks end to end: buffer -> generator process -> env pool (sandboxed) -> the real gateway
(token ids on) -> multi-step items -> BufferSource (grpo and step_wise) -> one training step."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from conftest import Gateway, make_cfg, needs_part

from clawloop.envs.sandbox import probe

pytestmark = needs_part("sandbox", probe("bwrap") and probe("unshare")
                        and f"no sandbox level runs here: {probe('bwrap')}; {probe('unshare')}")

CALC_TOOLS = {"tools": [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]}


def _rollout(buf_url: str, gw_url: str, **payload) -> list[dict]:
    """Start a rollout, wait for it to finish, take every finished group's items."""
    r = httpx.post(buf_url + "/start_rollout", json={"remote_engine_url": gw_url + "/v1", "remote_buffer_url": buf_url,
                                                     **payload})
    assert r.status_code == 200, r.text
    deadline = time.time() + 180
    items: list[dict] = []
    while time.time() < deadline:
        got = httpx.post(buf_url + "/get_rollout_data", json={"task_type": payload["task_type"]}).json()
        items += got["data"]["data"] if got["success"] else []
        rollouts = httpx.get(buf_url + "/buffer/stats").json()["data"]["data"][0]["rollouts"]
        running = any(r["state"] == "running" for r in rollouts)
        if not running and len(items) >= payload["num_tasks"] * payload["num_repeat_per_sample"]:
            return items
        time.sleep(0.3)
    raise AssertionError(f"rollout did not finish: {httpx.get(buf_url + '/buffer/stats').text}")


@pytest.fixture
def rig(engine, random_model_dir, tmp_path):
    from clawloop.buffer import BufferThread

    gw = Gateway(engine, random_model_dir, tmp_path / "gw")
    cfg = make_cfg(random_model_dir, tmp_path / "buf", train__method="binary", train__source="buffer",
                   train__buffer_url="http://placeholder", train__lr="1e-3")
    buf = BufferThread(cfg).start()
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(CALC_TOOLS))
    yield gw, buf, cfg, tools
    buf.stop()
    gw.stop()


def test_toolcall_oracle_and_noop_through_gateway_then_train(rig, engine, random_model_dir, tmp_path):
    from clawloop.buffer import BufferSource
    from clawloop.trainer import Trainer, TrainerLoop

    gw, buf, cfg, tools = rig
    common = {"task_type": "toolcall", "tools_config": str(tools), "num_tasks": 2, "max_steps": 4,
              "max_tokens": 16, "num_process": 2, "prm": "offline"}
    # groups of 4: the reference solution replayed through the gateway beside a do-nothing agent
    items = _rollout(buf.url, gw.url, agent=["oracle", "noop"], num_repeat_per_sample=4, **common)
    assert len(items) == 8
    oracle = [it for it in items if it["extra_info"]["behaviour"] == "oracle"]
    noop = [it for it in items if it["extra_info"]["behaviour"] == "noop"]
    assert len(oracle) == len(noop) == 4
    for it in oracle:
        x = it["extra_info"]
        assert x["success"] and x["outcome"] == 1.0
        assert x["env"]["sandbox"]["level"] in ("bwrap", "unshare")
        assert x["n_steps"] == 2 and x["n_tool_calls"] == 1 and x["token_exact"]
        s0, s1 = it["steps"]
        # step 0 called the calculator, the sandbox answered, the offline PRM saw a clean run
        assert s0["info"]["calls"][0]["returncode"] == 0 and s0["prm_score"] == 1
        assert s1["prm_score"] == 0  # the final answer has no observation
        # token-exact per step: the prompt is the conversation so far as the server rendered it
        assert s1["prompt_ids"][: len(s0["prompt_ids"]) + len(s0["response_ids"])] == \
            s0["prompt_ids"] + s0["response_ids"]
        assert it["messages"][s1["prompt_messages"]]["role"] == "assistant"
        assert it["raw_reward"] == pytest.approx(1.0 + 0.5)  # outcome + coef * mean(step PRM)
        assert it["prompt_ids"] == s1["prompt_ids"]
    for it in noop:
        assert it["extra_info"]["outcome"] < 0 and it["extra_info"]["n_steps"] == 1
        assert it["extra_info"]["shaping"] == {"mode": "outcome"}

    # reward: shaped (the generator's RewardShaping): the oracle's correct call and copied result are paid
    shaped = _rollout(buf.url, gw.url, agent=["oracle", "noop"], num_repeat_per_sample=2, reward="shaped",
                      reward_call_coef=2.0, **{**common, "num_tasks": 1, "task_offset": 9})
    for it in shaped:
        x = it["extra_info"]
        if x["behaviour"] == "oracle":
            assert x["shaping"] == {"mode": "shaped", "call_coef": 2.0, "use_coef": 0.5, "partial": 1.0,
                                    "credit": "outcome", "call_score": 1.0, "answer_from_tool": True}
            assert x["outcome"] == 1.0 and it["raw_reward"] == pytest.approx(1 + 2.0 + 0.5 + 0.5)  # + PRM mean
            assert [s["step_reward"] for s in it["steps"]] == pytest.approx([1 + 2.0 + 1, 1 + 0.5 + 0])
        else:
            assert it["raw_reward"] == x["outcome"] == pytest.approx(-1.1) and x["shaping"]["call_score"] == 0.0

    # the model itself (random weights) beside the oracle: real sampled steps with the engine's logprobs
    mixed = _rollout(buf.url, gw.url, agent=["model", "oracle"], num_repeat_per_sample=2,
                     **{**common, "task_offset": 5})
    model = [it for it in mixed if it["extra_info"]["behaviour"] == "model"]
    assert model
    for it in model:
        for st in it["steps"]:
            assert st["token_exact"] and len(st["response_ids"]) == len(st["response_logprobs"]) > 0
            assert any(lp != 0.0 for lp in st["response_logprobs"])
    gw.store.flush()
    assert all(t.type == "side" and not t.trainable for _, ts in gw.store.iter_sessions() for t in ts)

    source = BufferSource(buf.url, engine.tokenizer)
    samples = source.to_samples(items)
    assert len(samples) == sum(len(it["steps"]) for it in items) == 12
    assert source.stats["buffer/steps"] == 12 and source.stats["buffer/retokenized"] == 0
    by_group: dict[str, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group_id, []).append(s.advantages[-1])
    assert all(any(a > 0 for a in v) and any(a < 0 for a in v) for v in by_group.values())

    sw = BufferSource(buf.url, engine.tokenizer, estimator="step_wise").to_samples(items)
    # step 0: oracle (1 + 1) vs noop (outcome + 0) differ -> kept; step 1: only oracle trajectories, constant -> dropped
    assert len(sw) == 8 and all(s.advantages[-1] != 0 for s in sw)

    trainer = Trainer(cfg, str(random_model_dir))
    tl = TrainerLoop(cfg, trainer, None, None, "offline", buffer_source=source)  # the shared engine stays at v0
    before = [p.detach().clone() for p in trainer.model.parameters()][:3]
    tl.pending = list(samples)
    cfg.train.rollout_batch_size = len(samples)

    async def step():
        return await asyncio.get_running_loop().run_in_executor(None, tl.run_once)

    assert asyncio.run(step()) is True
    after = [p.detach() for p in trainer.model.parameters()][:3]
    assert any(not (a == b).all() for a, b in zip(before, after))


def test_env_pool_http_leases(tmp_path):
    """The lease API over real HTTP: allocate/reset/step/evaluate/close, 429 at capacity, 410 after a crash,
    idle leases reaped."""
    from conftest import ServerThread

    from clawloop.envs.base import EnvOptions
    from clawloop.envs.pool import EnvPool, HTTPPool, PoolError, create_pool_app

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(CALC_TOOLS))
    pool = EnvPool("toolcall", EnvOptions(tools_config=str(tools)), capacity=2, lease_ttl_s=1.0, reap_interval_s=0.2)
    srv = ServerThread(create_pool_app(pool)).start()
    try:
        client = HTTPPool(srv.url)
        ids = client.task_ids()
        a = client.allocate(ids[0])
        b = client.allocate(ids[1])
        with pytest.raises(PoolError) as full:
            client.allocate(ids[2])
        assert full.value.status == 429
        r = httpx.post(srv.url + "/allocate", json={"task_id": ids[2]})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        first = client.reset(a["lease_id"])
        assert first["tools"][0]["function"]["name"] == "calculator"
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]}
        out = client.step(a["lease_id"], call)
        assert out["messages"] == [{"role": "tool", "tool_call_id": "c0", "content": "42"}] and not out["done"]
        assert httpx.post(srv.url + "/exec_tool", json={"lease_id": a["lease_id"], "message": call}).status_code == 200
        done = client.step(a["lease_id"], {"role": "assistant", "content": "\\boxed{42}"})
        assert done["done"]
        ev = client.evaluate(a["lease_id"])
        assert set(ev) == {"reward", "success", "details"}
        assert client.status()["active"] == 2
        client.close(a["lease_id"])
        with pytest.raises(PoolError) as gone:
            client.step(a["lease_id"], call)
        assert gone.value.status == 410
        with pytest.raises(PoolError) as bad:
            client.step(b["lease_id"], {"role": "user", "content": "hi"})
        assert bad.value.status == 422
        # b goes idle: reaped after its TTL, its slot is free again
        deadline = time.time() + 10
        while client.status()["active"] and time.time() < deadline:
            time.sleep(0.2)
        st = client.status()
        assert st["active"] == 0 and st["reaped"] == 1
        with pytest.raises(PoolError) as reaped:
            client.reset(b["lease_id"])
        assert reaped.value.status == 410 and "expired" in reaped.value.message
        c = client.allocate(ids[2])
        # an environment that crashes is closed, its lease answers 410, the pool keeps serving
        lease = pool._leases[c["lease_id"]]
        lease.env.step = lambda m: 1 / 0  # a bug inside an environment
        with pytest.raises(PoolError) as crash:
            client.step(c["lease_id"], call)
        assert crash.value.status == 500 and "ZeroDivisionError" in crash.value.message
        with pytest.raises(PoolError) as after:
            client.step(c["lease_id"], call)
        assert after.value.status == 410
        assert client.status()["crashed"] == 1
        d = client.allocate(ids[0])
        assert client.reset(d["lease_id"])["messages"]
        client.close(d["lease_id"])
    finally:
        srv.stop()
        pool.shutdown()


def test_an_environment_built_during_shutdown_removes_its_workspace(tmp_path, monkeypatch):
    """`/stop_rollout` shuts the pool down while an episode's environment is still being built: that
    environment (its workspace already made) closes itself instead of being leased after the shutdown
    and left in the work dir (the race `test_stop_rollout_leaves_no_agent_workspace_behind` hit)."""
    import threading

    from clawloop.envs.base import EnvOptions
    from clawloop.envs.pool import EnvPool, PoolError
    from clawloop.envs.toolcall import env as tc

    work = tmp_path / "work"
    work.mkdir()
    built, release = threading.Event(), threading.Event()
    real_init = tc.ToolCallEnv.__init__

    def slow_init(self, *a, **kw):
        real_init(self, *a, **kw)
        built.set()
        release.wait(10)  # the rest of the construction, still running when the pool stops

    monkeypatch.setattr(tc.ToolCallEnv, "__init__", slow_init)
    pool = EnvPool("toolcall", EnvOptions(work_dir=str(work)), capacity=2)
    errors: list[Exception] = []

    def allocate():
        try:
            pool.allocate(pool.task_ids()[0])
        except PoolError as e:
            errors.append(e)

    t = threading.Thread(target=allocate)
    t.start()
    assert built.wait(10) and len(list(work.iterdir())) == 1
    pool.shutdown()
    release.set()
    t.join(10)
    assert [e.status for e in errors] == [503] and list(work.iterdir()) == []


def test_llm_step_prm_through_a_served_model(gateway):
    """`--prm url` (here: clawloop's own gateway as the endpoint) judges a step with m votes through the
    next-state prompt; the random model's replies carry no verdict, so the votes are malformed (None) and the
    step scores 0, never a made-up +1."""
    from clawloop.envs.prm import StepPRM

    prm = StepPRM.from_data({"prm": "url", "prm_url": gateway.url + "/v1", "prm_votes": 3, "prm_max_tokens": 8},
                            gateway.url + "/v1", "toolcall")
    try:
        j = prm.score([{"role": "user", "content": "What is 2+3?"}],
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "c", "type": "function", "function": {"name": "calculator",
                                                                       "arguments": '{"expression": "2+3"}'}}]},
                      [{"role": "tool", "tool_call_id": "c", "content": "5"}], {})
    finally:
        prm.close()
    assert j["judge"].startswith("prm:url") and len(j["votes"]) == 3 and j["score"] in (-1, 0, 1)
    assert all(v in (None, -1, 0, 1) for v in j["votes"])
    with pytest.raises(ValueError, match="prm_url"):
        StepPRM.from_data({"prm": "url"}, "http://x", "swe")
    with pytest.raises(ValueError, match="prm must be"):
        StepPRM.from_data({"prm": "psychic"}, "http://x", "swe")
