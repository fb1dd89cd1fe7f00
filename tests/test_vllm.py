"""The vLLM engine against real vLLM servers (`make test-vllm`; CPU here).

One module fixture starts two vLLM replicas as clawloop's children on the
tool-call test model, with a gateway and a real SQLite store in front; the
tests stream, call tools, check token exactness against the trainer's own
logprobs, publish full weights and LoRA adapters under load, kill a replica
and watch it come back. The last test runs `clawloop up --backend vllm` as a
user would, trains through it, then `kill -9`s clawloop and checks that no
vLLM process outlives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import ServerThread, free_port, make_cfg, require_or_skip, run_cli
from test_tools import Q, TOOLS, tool_model_dir  # noqa: F401  (module fixture: the tool-call model)

pytestmark = pytest.mark.vllm


def _vllm_python() -> Path:
    from clawloop.engines.vllm import VLLMNotInstalled, find_vllm_python

    try:
        return find_vllm_python(os.environ.get("VLLM_PYTHON", ""))
    except VLLMNotInstalled as e:
        require_or_skip("vllm", f"no vLLM environment: {e}")


class _LoopHandle:
    """The server's event loop, so tests can run engine coroutines (publish) on it."""

    loop: asyncio.AbstractEventLoop | None = None

    async def capture(self) -> None:
        self.loop = asyncio.get_running_loop()
        await asyncio.Event().wait()

    def run(self, coro, timeout: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@pytest.fixture(scope="module")
def vllm_gateway(tool_model_dir, tmp_path_factory):  # noqa: F811
    from clawloop.engines.vllm import VLLMEngine
    from clawloop.gateway import create_app
    from clawloop.naming import open_store

    python = _vllm_python()
    data = tmp_path_factory.mktemp("vllm-data")
    cfg = make_cfg(tool_model_dir, data, model__backend="vllm")
    engine = VLLMEngine(tool_model_dir, replicas=2, python=python, data_dir=data, max_model_len=1024,
                        lora_rank=8, health_interval_s=1.0, max_restarts=3, start_timeout_s=900)
    store = open_store(cfg)
    handle = _LoopHandle()
    app = create_app(cfg, engine, store, background=[handle.capture])
    server = ServerThread(app)
    server.start(timeout=900)
    while handle.loop is None:
        time.sleep(0.05)
    yield server, engine, store, handle, cfg
    server.stop()
    store.close()


def _client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _wait(pred, timeout: float, what: str, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def test_started_replicas_are_children_in_their_own_groups(vllm_gateway):
    import httpx

    server, engine, *_ = vllm_gateway
    # The tied test model is served from an untied copy, so a publish can update the head.
    assert json.loads((Path(engine.serve_dir) / "config.json").read_text())["tie_word_embeddings"] is False
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["backend"] == "vllm" and len(h["replicas"]) == 2
    for r in h["replicas"]:
        assert r["state"] == "up" and r["managed"] and r["url"].startswith("http://127.0.0.1:")
        assert os.getpgid(r["pid"]) == r["pid"]  # its own process group: stopping it stops vLLM's children
    m = httpx.get(server.url + "/metrics").text
    assert "clawloop_engine_replicas_up 2.0" in m


def test_streams_token_by_token_with_the_official_client(vllm_gateway):
    server, *_ = vllm_gateway
    c = _client(server)
    stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello there"}],
                                       stream=True, max_tokens=12, temperature=1.0, seed=7,
                                       extra_body={"return_token_ids": True})
    chunks = list(stream)
    content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    ids = [t for ch in chunks if ch.choices for t in (ch.choices[0].model_extra.get("token_ids") or [])]
    assert len(ids) >= 2 and len(content) >= 2  # real streaming: several chunks, not one at the end
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tool_call_through_vllm(vllm_gateway):
    server, *_ = vllm_gateway
    c = _client(server)
    r = c.chat.completions.create(model="m", messages=Q, tools=TOOLS, temperature=0, max_tokens=40,
                                  extra_headers={"X-Session-Id": "vllm-tools"})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "12+7"}


def test_structured_outputs_through_vllm(vllm_gateway, tool_model_dir):  # noqa: F811
    """vLLM enforces the same structural tag (xgrammar): a schema'd object and a required call to
    an offered tool are valid, and the logprobs it reports are the constrained distribution's —
    the model's own logits masked by the replayed grammar, renormalised."""
    from transformers import AutoModelForCausalLM

    from clawloop.engines.hf import HFEngine
    from test_structured import ADD, SCHEMA, valid_answer

    server, engine, store, *_ = vllm_gateway
    c = _client(server)
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "strict": True, "schema": SCHEMA}}
    r = c.chat.completions.create(model="m", messages=Q, response_format=rf, max_tokens=200, seed=1,
                                  temperature=1.0, extra_headers={"X-Session-Id": "vllm-json"})
    assert r.choices[0].finish_reason == "stop" and valid_answer(json.loads(r.choices[0].message.content))
    # `add` with bounded integers: bounded work for any model (an unbounded integer is not, now that the
    # grammar leaves no whitespace to end one with; the calculator's free string is not either)
    bounded = {"type": "integer", "minimum": -999, "maximum": 999}
    add = {"type": "function", "function": {**ADD["function"], "parameters": {
        **ADD["function"]["parameters"], "properties": {"a": bounded, "b": bounded}}}}
    r = c.chat.completions.create(model="m", messages=Q, tools=[add], tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=200, seed=2)
    assert r.choices[0].message.tool_calls, r.choices[0]
    (call,) = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "add" and set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())

    store.flush()
    (turn,) = store.session_turns("vllm-json")
    assert turn.sampling["logprobs"] == "constrained"
    hf = HFEngine(tool_model_dir, device="cpu", dtype="float32")  # its grammar helper, same tokenizer
    g = hf.grammars()
    m = g.matcher(g.compile(engine_constraint(rf)))
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32).eval()
    seq = torch.tensor([turn.prompt_ids + turn.response_ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(turn.prompt_ids) - 1:-1].float()  # (T, V)
    want = []
    for t, tid in enumerate(turn.response_ids):
        want.append(float(torch.log_softmax(g.mask(m, logits[t]), -1)[tid]))
        assert m.accept_token(tid), (t, hf.tokenizer.decode(turn.response_ids[:t + 1]), turn.response_ids)
    diff = max(abs(a - b) for a, b in zip(want, turn.response_logprobs))
    assert diff < 1e-3, diff


def test_json_closes_within_max_tokens_through_vllm(vllm_gateway):
    """The servers clawloop starts load its logits processor (`clawloop_json_close:JsonClose`): with
    `serve.close_json_tokens`, an object with free strings ends valid within a max_tokens too short for
    the model to end it alone; with 0 the same requests are cut."""
    from test_structured import FREE

    server, engine, store, handle, cfg = vllm_gateway
    c = _client(server)
    rf = {"type": "json_schema", "json_schema": {"name": "free", "strict": True, "schema": FREE}}

    def ask(seed):
        return c.chat.completions.create(model="m", messages=Q, response_format=rf, max_tokens=32, seed=seed,
                                         temperature=1.0).choices[0]

    before = cfg.serve.close_json_tokens
    try:
        cfg.serve.close_json_tokens = 24  # closing from the 9th token of 32: room for the three members
        closed = [ask(s) for s in range(3)]
        cfg.serve.close_json_tokens = 0
        alone = [ask(s) for s in range(3)]
    finally:
        cfg.serve.close_json_tokens = before
    for ch in closed:
        assert ch.finish_reason == "stop", ch
        assert set(json.loads(ch.message.content)) == {"s", "n", "t"}, ch.message.content
    assert [ch.finish_reason for ch in alone].count("length") >= 2, [ch.message.content for ch in alone]


def engine_constraint(response_format):
    from clawloop.gateway.constraints import build_constraint
    from clawloop.gateway.protocol import parse_chat_request

    return build_constraint(parse_chat_request({"messages": Q, "response_format": response_format}, 1024), False)


def test_bad_request_gets_an_openai_error(vllm_gateway):
    import openai

    server, *_ = vllm_gateway
    c = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["type"] == "invalid_request_error"


def _recompute_logprobs(model_dir_or_sd, tool_model_dir, prompt_ids, response_ids):  # noqa: F811
    from transformers import AutoModelForCausalLM

    from clawloop.trainer.core import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32).eval()
    if isinstance(model_dir_or_sd, dict):
        model.load_state_dict(model_dir_or_sd, strict=False)
    seq = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        lp, _ = token_logprobs(model, seq, torch.ones_like(seq))  # (1, L-1)
    n = len(prompt_ids)
    return lp[0, n - 1:n - 1 + len(response_ids)].tolist()


def test_captured_turn_is_token_exact_and_matches_the_trainer(vllm_gateway, tool_model_dir):  # noqa: F811
    server, engine, store, *_ = vllm_gateway
    c = _client(server)
    sid = "vllm-exact"
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3+4?"}],
                                  max_tokens=24, temperature=1.0, seed=3, extra_headers={"X-Session-Id": sid},
                                  extra_body={"return_token_ids": True})
    ch = r.choices[0].model_extra
    store.flush()
    (turn,) = store.session_turns(sid)
    assert turn.response_ids == ch["token_ids"]  # what vLLM sampled is what was captured
    assert turn.prompt_ids == r.model_extra["prompt_token_ids"]
    assert len(turn.response_logprobs) == len(turn.response_ids)
    assert turn.policy_version == engine.policy_version and turn.response_versions is None
    mine = _recompute_logprobs(None, tool_model_dir, turn.prompt_ids, turn.response_ids)
    diff = max(abs(a - b) for a, b in zip(mine, turn.response_logprobs))
    assert diff < 1e-3, diff  # raw logprobs (temperature 1) in float32: the trainer's own numbers


def test_top_logprobs_by_id(vllm_gateway):
    server, *_ = vllm_gateway
    c = _client(server)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                  logprobs=True, top_logprobs=3, temperature=0)
    entries = r.choices[0].logprobs.content
    assert entries and all(len(e.top_logprobs) == 3 for e in entries)
    for e in entries:  # greedy: the chosen token is the best alternative
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)


def test_sessions_stick_to_one_replica_and_spread(vllm_gateway):
    server, engine, *_ = vllm_gateway
    c = _client(server)
    before = [r.requests for r in engine.replicas]
    for _ in range(3):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                  extra_headers={"X-Session-Id": "sticky-1"})
    after = [r.requests for r in engine.replicas]
    assert sorted(a - b for a, b in zip(after, before)) == [0, 3]
    chosen = {engine._route(f"s{i}", set()).index for i in range(40)}
    assert chosen == {0, 1}


def _load(server, stop: threading.Event, results: list, errors: list, sid_prefix: str):
    c = _client(server)
    i = 0
    while not stop.is_set():
        i += 1
        try:
            r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Tell me {i}"}],
                                          max_tokens=48, temperature=1.0,
                                          extra_headers={"X-Session-Id": f"{sid_prefix}-{threading.get_ident()}-{i}"},
                                          extra_body={"return_token_ids": True})
            results.append(r)
        except Exception as e:  # noqa: BLE001
            errors.append(e)


def test_full_weight_publish_under_load_fails_nothing(vllm_gateway, tool_model_dir):  # noqa: F811
    from clawloop.engines.hf import load_state_dict_from_dir

    server, engine, store, handle, _ = vllm_gateway
    base = load_state_dict_from_dir(tool_model_dir)
    stop, results, errors = threading.Event(), [], []
    threads = [threading.Thread(target=_load, args=(server, stop, results, errors, "pub")) for _ in range(6)]
    for t in threads:
        t.start()
    v0 = engine.policy_version
    published = {}
    assert engine.shared_memory  # started replicas take full weights from a shared-memory image ...
    try:
        for k in range(1, 6):
            time.sleep(0.5)
            engine.shared_memory = k > 3  # ... and attached ones as files: both paths, under the same load
            sd = {n: t * (1.0 + 0.02 * k) if "norm" not in n else t for n, t in base.items()}
            handle.run(engine.publish(sd, v0 + k))
            published[v0 + k] = sd
            assert engine.policy_version == v0 + k
        # On a starved machine a 48-token answer can outlast the five publishes: the load keeps going
        # until enough answers came back (each publish froze and preempted the ones in flight).
        _wait(lambda: len(results) >= 10 or bool(errors), 900, "10 answers around the publishes", every=1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors[:3]
    assert len(results) >= 10
    import httpx

    h = httpx.get(server.url + "/health").json()
    assert h["policy_version"] == v0 + 5 and all(r["policy_version"] == v0 + 5 for r in h["replicas"])
    store.flush()
    turns = [t for sid, ts in store.iter_sessions() if sid.startswith("pub-") for t in ts]
    assert turns
    for t in turns:  # versions never go backwards within a response, and a mixed one says so per token
        vs = t.response_versions or [t.policy_version] * len(t.response_ids)
        assert vs == sorted(vs) and t.policy_version == vs[0]
    # Weight folders (files path): the last few only; the image is the newest version.
    kept = sorted(p.name for p in (engine.weights_dir).iterdir() if p.name.startswith("v"))
    assert kept == [f"v{v0 + k}" for k in (1, 2, 3)]
    assert engine.images.current.version == v0 + 5 and engine.stats()["engine/publish_groups_sent"] > 1
    # A turn served wholly by the newest weights matches the trainer on those weights.
    c = _client(server)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3+4?"}],
                                  max_tokens=16, temperature=1.0, seed=5, extra_body={"return_token_ids": True})
    ids = r.choices[0].model_extra["token_ids"]
    mine = _recompute_logprobs(published[v0 + 5], tool_model_dir, r.model_extra["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(mine, r.choices[0].model_extra["token_logprobs"])) < 1e-3
    assert r.model_extra["policy_version"] == v0 + 5


def test_lora_publish_routes_new_requests_to_the_newest_adapter(vllm_gateway, tool_model_dir):  # noqa: F811
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from clawloop.engines.base import LoraAdapter

    server, engine, _, handle, _ = vllm_gateway
    c = _client(server)
    base = AutoModelForCausalLM.from_pretrained(tool_model_dir, dtype=torch.float32)
    lcfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(base, lcfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a non-trivial delta
    cfg_dict = json.loads(json.dumps(pm.peft_config["default"].to_dict(), default=list))
    lora_sd = {k: t.detach().clone() for k, t in get_peft_model_state_dict(pm).items()}
    # Adapters apply to the base weights: put them back first (earlier tests published others).
    from clawloop.engines.hf import load_state_dict_from_dir

    handle.run(engine.publish(load_state_dict_from_dir(tool_model_dir), engine.policy_version + 1))
    v = engine.policy_version + 1
    with pytest.raises(ValueError, match="no tensors"):  # an empty adapter would crash vLLM: refused first
        handle.run(engine.publish(LoraAdapter({}, cfg_dict), v))
    handle.run(engine.publish(LoraAdapter(lora_sd, cfg_dict), v))
    assert engine.policy_version == v
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3+4?"}],
                                  max_tokens=12, temperature=1.0, seed=9, extra_body={"return_token_ids": True})
    assert r.model_extra["policy_version"] == v
    merged = pm.merge_and_unload()
    sd = {k: t.detach().clone() for k, t in merged.state_dict().items()}
    ids = r.choices[0].model_extra["token_ids"]
    mine = _recompute_logprobs(sd, tool_model_dir, r.model_extra["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(mine, r.choices[0].model_extra["token_logprobs"])) < 2e-3
    # A second adapter: new requests move to it, the first is unloaded once drained.
    handle.run(engine.publish(LoraAdapter({k: t * 0.5 for k, t in lora_sd.items()}, cfg_dict), v + 1))
    r2 = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                   extra_body={"return_token_ids": True})
    assert r2.model_extra["policy_version"] == v + 1
    _wait(lambda: engine.stats()["engine/lora_adapters_unloaded"] >= 1, 30, "the old adapter to be unloaded")


def test_publish_sends_only_what_changed_and_stays_token_exact(vllm_gateway, tool_model_dir):  # noqa: F811
    from clawloop.engines.hf import load_state_dict_from_dir

    server, engine, _, handle, _ = vllm_gateway
    base = load_state_dict_from_dir(tool_model_dir)
    v = engine.policy_version
    handle.run(engine.publish(base, v + 1))  # after an adapter: the first image is sent whole
    s = engine.stats()
    assert s["engine/publish_bytes_sent"] == s["engine/publish_bytes"] > 0
    name = next(k for k in sorted(base) if ".layers.1." in k and k.endswith("q_proj.weight"))
    sd = dict(base)
    sd[name] = base[name] * 1.5
    handle.run(engine.publish(sd, v + 2))
    s = engine.stats()
    assert s["engine/publish_groups_sent"] == 1 and s["engine/publish_bytes_sent"] < s["engine/publish_bytes"] / 2
    c = _client(server)

    def check(sid: str) -> float:
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3+4?"}],
                                      max_tokens=12, temperature=1.0, seed=11, extra_headers={"X-Session-Id": sid},
                                      extra_body={"return_token_ids": True})
        assert r.model_extra["policy_version"] == v + 2
        ids, served = r.choices[0].model_extra["token_ids"], r.choices[0].model_extra["token_logprobs"]
        mine = _recompute_logprobs(sd, tool_model_dir, r.model_extra["prompt_token_ids"], ids)
        base_lp = _recompute_logprobs(None, tool_model_dir, r.model_extra["prompt_token_ids"], ids)
        assert max(abs(a - b) for a, b in zip(mine, served)) < 1e-3  # the new layer, and the rest kept
        return max(abs(a - b) for a, b in zip(base_lp, served))

    assert all(check(_session_on(engine, i)) > 1e-3 for i in range(len(engine.replicas)))  # it did change
    # Catch-up (what a restarted replica gets): the whole current image, then token-exact again.
    handle.run(engine.replicas.bring_up(engine.replicas[0]))
    check(_session_on(engine, 0))


def test_crashed_replica_restarts_and_requests_never_hang(vllm_gateway):
    import httpx
    import openai

    server, engine, store, handle, _ = vllm_gateway
    c = _client(server)
    version = engine.policy_version
    victim = engine.replicas[0]
    old_pid = victim.process.pid
    os.killpg(old_pid, signal.SIGKILL)
    _wait(lambda: httpx.get(server.url + "/health").json()["status"] == "degraded", 30, "degraded health")
    # The other replica serves every session meanwhile, including the victim's.
    for i in range(4):
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                      extra_headers={"X-Session-Id": f"during-crash-{i}"})
        assert r.choices[0].message is not None
    # With both down: a 503 in OpenAI's shape with Retry-After, at once.
    other = engine.replicas[1]
    os.killpg(other.process.pid, signal.SIGKILL)
    _wait(lambda: not engine.available, 30, "both replicas down")
    t0 = time.time()
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert time.time() - t0 < 10
    assert e.value.status_code == 503 and e.value.response.headers.get("retry-after")
    assert e.value.body["code"] == "engine_unavailable"
    h = httpx.get(server.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "unavailable"
    # Both come back on their own, serving the current weights under the current version.
    _wait(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", 900, "the restarts", every=2)
    assert victim.process.pid != old_pid and victim.restarts >= 1
    assert all(r.version == version for r in engine.replicas)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                  extra_body={"return_token_ids": True})
    assert r.model_extra["policy_version"] == version
    store.flush()
    assert store.session_turns("during-crash-0")  # served during the crash, captured


def _session_on(engine, index: int) -> str:
    return next(f"s-{i}" for i in range(1000) if engine._route(f"s-{i}", set()).index == index)


def test_cancelled_stream_aborts_the_vllm_request(vllm_gateway):
    """The tiny model answers 900 tokens faster than a client can hang up, so the replica is
    paused (requests freeze in place): the request is in vLLM when the client leaves. Had it
    not been aborted, it would finish after the resume and be counted as `length`/`stop`."""
    import httpx

    server, engine, *_ = vllm_gateway
    sid = _session_on(engine, 0)
    replica_url = engine.replicas[0].url

    def counts() -> dict[str, float]:
        text = httpx.get(replica_url + "/metrics").text
        out: dict[str, float] = {}
        for ln in text.splitlines():
            if ln.startswith(("vllm:request_success_total", "vllm:num_requests_running",
                              "vllm:num_requests_waiting{")):
                key = ln.split("{")[0] + (ln.split('finished_reason="')[1].split('"')[0]
                                          if "finished_reason" in ln else "")
                out[key] = out.get(key, 0.0) + float(ln.rsplit(" ", 1)[1])
        return out

    def finished() -> float:
        c = counts()
        return c["vllm:request_success_totallength"] + c["vllm:request_success_totalstop"]

    c = _client(server)
    for leave in (False, True):  # the control first: a paused request the client waits for does finish
        before = finished()
        httpx.post(replica_url + "/pause", params={"mode": "keep"})
        try:
            stream = c.chat.completions.create(model="m", stream=True, max_tokens=900,
                                               messages=[{"role": "user", "content": "Tell me a story"}],
                                               extra_headers={"X-Session-Id": sid})
            it = iter(stream)
            next(it)  # the role chunk: generation has been sent to vLLM
            time.sleep(1.0)
            if leave:
                stream.close()  # the client goes away
                time.sleep(1.0)
        finally:
            httpx.post(replica_url + "/resume")
        if not leave:
            list(it)
        time.sleep(3.0)
        after = counts()
        assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
        assert finished() == before + (0 if leave else 1)


def test_hung_replica_ends_its_requests_and_is_replaced(vllm_gateway):
    import httpx
    import openai

    server, engine, store, *_ = vllm_gateway
    victim = engine.replicas[1]
    sid = _session_on(engine, 1)
    c = _client(server)
    # End-of-turn banned: the reply cannot finish on its own. The hang must still land mid-stream: on a
    # loaded machine vLLM can have generated all 900 tokens before SIGSTOP lands (seen in CI), and then the
    # stream completes; that attempt is let go and the scenario tried again.
    no_end = {str(t): -100 for t in engine.eos_token_ids}
    pgid = victim.process.pid
    raised, finished = False, []
    try:
        for _attempt in range(4):
            stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Tell me a story"}],
                                               stream=True, max_tokens=900, temperature=1.0, logit_bias=no_end,
                                               extra_headers={"X-Session-Id": sid})
            it = iter(stream)
            next(it)
            next(it)
            os.killpg(pgid, signal.SIGSTOP)  # alive but silent: a hang, not a crash
            t0 = time.time()
            chunks = []
            try:
                for ch in it:
                    chunks.append(ch)
            except openai.APIError:
                raised = True
                break
            finished.append((len(chunks), [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1:]))
            os.killpg(pgid, signal.SIGCONT)  # the stream was complete before the hang: again
            _wait(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", 900, "a healthy replica")
        assert raised, f"every attempt finished before the hang landed: (chunks, finish) {finished}"
        assert time.time() - t0 < 60  # ended by the health monitor, not by a 10-minute read timeout
        assert httpx.get(server.url + "/health").json()["status"] == "degraded"
        # New requests of that session go to the healthy replica meanwhile.
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                      extra_headers={"X-Session-Id": sid})
        assert r.choices
    finally:
        try:
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    _wait(lambda: httpx.get(server.url + "/health").json()["status"] == "ok", 900, "the replacement", every=2)
    assert victim.process.pid != pgid
    store.flush()
    (turn,) = [t for t in store.session_turns(sid) if t.finish_reason == "abort"]
    assert turn.response_ids and not turn.trainable  # what was streamed is kept, never trained on


def test_judge_self_and_frozen_with_the_vllm_backend(vllm_gateway, tool_model_dir, tmp_path):  # noqa: F811
    from clawloop.engines.vllm import VLLMEngine
    from clawloop.judge.llm import EngineChatBackend
    from clawloop.judge.loop import local_frozen_engine

    server, engine, _, handle, cfg = vllm_gateway
    reply = handle.run(EngineChatBackend(engine).complete([{"role": "user", "content": "Was this right?"}],
                                                          temperature=0.6, max_tokens=8))
    assert isinstance(reply, str)
    frozen = local_frozen_engine(make_cfg(tool_model_dir, tmp_path, model__backend="vllm", train__use_lora="true",
                                     model__engine_replicas="2"))
    assert isinstance(frozen, VLLMEngine) and frozen.managed and len(frozen.replicas) == 1
    assert frozen.lora_rank == 0 and frozen.data_dir == tmp_path / "judge-engine"


def _pgroup_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_up_backend_vllm_end_to_end_then_kill_9_leaves_no_vllm(tool_model_dir, tmp_path, mode):  # noqa: F811
    """The done-when path: `clawloop up --backend vllm`, a session with corrections judged and
    trained on, the served version advancing with zero failed requests, export token-exact;
    then SIGKILL to clawloop, and vLLM goes too. `lora`: the trainer's own adapters hot-loaded."""
    import httpx

    _vllm_python()
    port = free_port()
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "clawloop.cli", "up", "--backend", "vllm", "--model-path", str(tool_model_dir),
           "--data-dir", str(data), "--port", str(port), "--rollout-batch-size", "2", "--lr", "1e-4",
           "--method", "binary", "--negative-weight", "1", "--model-max-model-len", "1024"]
    if mode == "lora":
        cmd += ["--use-lora", "--lora-rank", "8"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(ln) for ln in proc.stdout], daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    vllm_pgids: list[int] = []
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError("clawloop up exited:\n" + "".join(lines[-40:]))
            try:
                return httpx.get(url + "/health", timeout=2).json()["status"] == "ok"
            except httpx.HTTPError:
                return False

        _wait(up, 900, "clawloop up --backend vllm to be healthy", every=2)
        assert any("waiting for vLLM" in ln or "ready on" in ln for ln in lines)
        vllm_pgids = [r["pid"] for r in httpx.get(url + "/health").json()["replicas"]]
        import openai

        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        failures = 0
        for s in range(6):
            sid = f"user-{s}"
            msgs = [{"role": "user", "content": f"What is {s}+{s}?"}]
            for k in range(3):
                try:
                    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=16,
                                                  extra_headers={"X-Session-Id": sid})
                except openai.APIError:
                    failures += 1
                    continue
                msgs += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": "No, that's wrong. Just the number, please."}]
            c.chat.completions.create(model="m", messages=msgs, max_tokens=4,
                                      extra_headers={"X-Session-Id": sid, "X-Session-Done": "1"})
        assert failures == 0
        _wait(lambda: httpx.get(url + "/health").json()["policy_version"] >= 1, 600, "a published train step",
              every=2)
        published = list((data / "weights").glob("v*"))
        if mode == "lora":  # adapters go as files
            assert published and all(p.name.endswith("-lora") for p in published)
        else:  # full weights to a server clawloop started: through shared memory, no weight files
            assert not any(p.name.endswith("-lora") for p in published)
            assert "publish_bytes_sent" in httpx.get(url + "/metrics").text
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      extra_body={"return_token_ids": True})
        assert r.model_extra["policy_version"] >= 1  # new requests are served by the trained weights
        stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                           stream=True)
        assert [ch for ch in stream]
        out = tmp_path / "export.jsonl"
        res = run_cli("export", "--data-dir", str(data), "--out", str(out))
        assert res.returncode == 0, res.stderr
        sessions = [json.loads(ln) for ln in out.read_text().splitlines()]
        turns = [t for s in sessions for t in s["turns"]]
        assert turns and all(len(t["response_ids"]) == len(t["response_logprobs"]) for t in turns)
        assert any(t.get("next_state") for t in turns)
    finally:
        if proc.poll() is None:
            proc.kill()  # SIGKILL: no cleanup code of clawloop's runs
        proc.wait(timeout=30)
    assert vllm_pgids
    _wait(lambda: not any(_pgroup_alive(g) for g in vllm_pgids), 60, "vLLM to exit after clawloop was killed")


def test_architecture_vllm_cannot_load_is_a_clear_error(tmp_path, random_model_dir):
    import shutil

    _vllm_python()
    bad = tmp_path / "bad-model"
    shutil.copytree(random_model_dir, bad)
    cfgj = json.loads((bad / "config.json").read_text())
    cfgj["architectures"] = ["NoSuchModelForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfgj))
    res = run_cli("serve", "--backend", "vllm", "--model-path", str(bad), "--data-dir", str(tmp_path / "d"),
                  "--port", str(free_port()), timeout=900)
    assert res.returncode != 0
    err = res.stdout + res.stderr
    assert "vLLM replica0 exited" in err and "NoSuchModelForCausalLM" in err, err[-3000:]
