"""Serving you can trust: tenants and secrets, limits that answer in OpenAI's
shape, sampling and version labels on what was served, logprob bytes.

Real gateways on loopback; where a test needs an engine that is slow, fails,
or swaps versions on cue, `ScriptedEngine` plays back token ids through the
real tokenizer."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import socket
import sys
import threading
import time
import types

import httpx
import openai
import pytest

from clawloop.engines.base import TokenEvent

Q = [{"role": "user", "content": "What is 12+7?"}]


class ScriptedEngine:
    """Plays back `ids` (the real tokenizer's) `delay_s` apart. `bump_after=k` publishes a new
    version after token k while the running row stays on its own; `fail_after=k` raises (with
    secrets in the message) before token k."""

    def __init__(self, tokenizer, ids, *, delay_s=0.0, bump_after=None, fail_after=None):
        self.tokenizer = tokenizer
        self.eos_token_ids = {tokenizer.eos_token_id}
        self.ids, self.delay_s, self.bump_after, self.fail_after = list(ids), delay_s, bump_after, fail_after
        self.version = 0
        self.active = 0
        self.aborted = 0

    @property
    def policy_version(self) -> int:
        return self.version

    def stats(self):
        return {"engine/active_rows": float(self.active)}

    async def generate(self, request):
        self.active += 1
        done = False
        try:
            n = min(len(self.ids), request.params.max_tokens)
            mine = self.version
            for k in range(n):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.fail_after is not None and k == self.fail_after:
                    raise RuntimeError("engine blew up reading /home/alice/.secrets with key sk-live-SECRET")
                last = k == n - 1
                yield TokenEvent(self.ids[k], -0.5, finish_reason=("length" if last else None), policy_version=mine)
                if self.bump_after is not None and k == self.bump_after:
                    self.version += 1
            done = True
        finally:
            self.active -= 1
            if not done:
                self.aborted += 1


def scripted(engine, text="one two three four five six seven eight", **kw) -> ScriptedEngine:
    return ScriptedEngine(engine.tokenizer, engine.tokenizer.encode(text, add_special_tokens=False), **kw)


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def stored(g):
    g.store.flush()
    return g.store.stats()["turns"]


def record_turns(g) -> list:
    """The Turns the gateway hands to capture (what the store is asked to keep)."""
    seen: list = []
    finish = g.gw.capture.finish
    g.gw.capture.finish = lambda slot, turns: (seen.extend(turns), finish(slot, turns))[1]
    return seen


# ------------------------------------------------------------------ tenants and secrets

def test_tenants_are_on_turns_and_cannot_link_into_each_others_sessions(make_gateway):
    g = make_gateway(serve__api_keys=["alice=ka", "bob=kb", "kc"])
    turns = record_turns(g)
    alice, bob, plain = (g.client(api_key=k) for k in ("ka", "kb", "kc"))
    h = {"X-Session-Id": "shared"}
    r1 = alice.chat.completions.create(model="m", messages=Q, max_tokens=3, extra_headers=h)
    # bob names the same session and sends what would be the next state of alice's turn
    bob.chat.completions.create(model="m", max_tokens=3, extra_headers=h, messages=Q + [
        {"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "wrong!"}])
    plain.chat.completions.create(model="m", messages=Q, max_tokens=3, extra_headers={"X-Session-Id": "p"})
    assert [(t.session_id, t.tenant) for t in turns] == [("alice/shared", "alice"), ("bob/shared", "bob"),
                                                         ("default/p", "default")]
    g.store.flush()
    a = g.store.session_turns("alice/shared")
    b = g.store.session_turns("bob/shared")
    assert len(a) == 1 and a[0].next_state is None, "bob linked a next state into alice's session"
    assert len(b) == 1 and b[0].index == 0  # bob's session is his own, starting at turn 0
    assert g.store.session_turns("shared") == []
    # Export per tenant: alice's file has alice's session only.
    import json as _json

    from clawloop.trajectories import export_sessions

    out = g.store.path.parent / "alice.jsonl"
    n = export_sessions(g.cfg.data_dir, str(out), tenant="alice")
    rows = [_json.loads(ln) for ln in out.read_text().splitlines()]
    assert n == 1 and [r["session_id"] for r in rows] == ["alice/shared"]


def test_metrics_auth_and_per_tenant_counts(make_gateway):
    g = make_gateway(serve__api_keys=["alice=ka"], serve__metrics_auth="true")
    g.client(api_key="ka").chat.completions.create(model="m", messages=Q, max_tokens=2)
    assert_openai_error(httpx.get(g.url + "/metrics"), 401, "invalid_api_key")
    assert_openai_error(httpx.get(g.url + "/metrics", headers={"Authorization": "Bearer nope"}), 401)
    text = httpx.get(g.url + "/metrics", headers={"Authorization": "Bearer ka"}).text
    assert 'clawloop_tenant_requests_total{code="200",tenant="alice"} 1.0' in text
    assert 'clawloop_tenant_completion_tokens_total{tenant="alice"}' in text
    assert httpx.get(g.url + "/health").status_code == 200  # probes stay open


def test_metrics_auth_needs_a_key():
    from clawloop.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="metrics_auth"):
        load_config({"serve__metrics_auth": "true"}, env={})


def test_api_key_forms_and_masking(tmp_path):
    import yaml

    from clawloop.config import load_config
    from clawloop.config import api_key_tenants
    from clawloop.config_out import write_resolved

    cfg = load_config({"serve__api_keys": ["alice=sk-a1", "sk-plain", "YWJjZA=="], "data_dir": str(tmp_path)},
                      env={"OPENCLAW_API_KEY": "ignored-when-a-flag-is-given"})
    assert api_key_tenants(cfg.serve.api_keys) == [("alice", "sk-a1"), ("default", "sk-plain"),
                                                   ("default", "YWJjZA==")]
    env_cfg = load_config({}, env={"OPENCLAW_API_KEY": "team=sk-t"})
    assert api_key_tenants(env_cfg.serve.api_keys) == [("team", "sk-t")]
    text = write_resolved(cfg).read_text()
    assert "sk-a1" not in text and "sk-plain" not in text and "YWJjZA" not in text
    assert yaml.safe_load(text)["serve"]["api_keys"] == ["alice=***", "***", "***"]


def test_wandb_gets_no_secrets(tmp_path, monkeypatch):
    from clawloop.config import load_config
    from clawloop.apps.observe import export_metrics

    seen = {}
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: seen.update(kw) or types.SimpleNamespace(log=lambda *a, **k: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_PROJECT", "p")
    cfg = load_config({"serve__api_keys": ["alice=sk-alice-XYZZY"], "judge__api_key": "sk-judge-XYZZY",
                       "data_dir": str(tmp_path)}, env={})

    async def briefly():
        task = asyncio.create_task(export_metrics(cfg, {}, every_s=60))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(briefly())
    dumped = json.dumps(seen["config"])
    assert "XYZZY" not in dumped and "alice=***" in dumped


def test_500_body_has_a_request_id_not_the_exception(make_gateway, caplog):
    g = make_gateway()

    def boom():
        raise RuntimeError("cannot open /home/alice/.env holding sk-live-SECRET")

    g.gw.check_store = boom
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 2})
    err = assert_openai_error(r, 500, "internal_error")
    assert "SECRET" not in r.text and "alice" not in r.text and "RuntimeError" not in r.text
    rid = r.headers["x-request-id"]
    assert rid in err["message"] and rid in caplog.text and "SECRET" in caplog.text  # the log has it all


def test_stream_failure_event_has_a_request_id_not_the_exception(engine, make_gateway):
    g = make_gateway(engine=scripted(engine, fail_after=2))
    with httpx.stream("POST", g.url + "/v1/chat/completions",
                      json={"messages": Q, "max_tokens": 8, "stream": True}) as r:
        body = r.read().decode()
    assert "SECRET" not in body and "alice" not in body
    err = json.loads([ln for ln in body.splitlines() if ln.startswith("data: {\"error\"")][0][6:])["error"]
    assert err["code"] == "internal_error" and "chatcmpl-" in err["message"]


# ------------------------------------------------------------------ sampling and versions

def test_sampling_is_recorded_per_choice(gateway):
    turns = record_turns(gateway)
    gateway.client().chat.completions.create(model="m", messages=Q, max_tokens=3, n=2, temperature=0.7,
                                             top_p=0.9, seed=5, extra_headers={"X-Session-Id": "samp"})
    assert [t.sampling for t in sorted(turns, key=lambda t: t.choice_index)] == [
        {"temperature": 0.7, "top_p": 0.9, "seed": 5, "logprobs": "raw"},
        {"temperature": 0.7, "top_p": 0.9, "seed": 6, "logprobs": "raw"}]
    turns.clear()
    gateway.client().chat.completions.create(model="m", messages=Q, max_tokens=2, extra_headers={"X-Session-Id": "d"})
    assert turns[0].sampling == {"temperature": 1.0, "top_p": 1.0, "seed": None, "logprobs": "raw"}


def test_stream_labels_tokens_with_the_version_that_made_them(engine, make_gateway):
    eng = scripted(engine, bump_after=1, delay_s=0.01)  # a publish lands after the 2nd token; the row stays on v0
    g = make_gateway(engine=eng)
    with httpx.stream("POST", g.url + "/v1/chat/completions", headers={"X-Session-Id": "v"},
                      json={"messages": Q, "max_tokens": 6, "stream": True, "return_token_ids": True}) as r:
        assert r.headers["x-policy-version"] == "0"
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert eng.version == 1
    assert events[0]["policy_version"] == 0
    assert {e["system_fingerprint"] for e in events} == {"clawloop-v0"}, [e["system_fingerprint"] for e in events]
    token_chunks = [e for e in events if e["choices"] and e["choices"][0].get("token_ids")]
    assert all(set(e["choices"][0]["token_versions"]) == {0} for e in token_chunks)
    assert events[-1]["choices"][0]["policy_version"] == 0
    g.store.flush()
    assert g.store.session_turns("v")[0].policy_version == 0
    # a request after the publish is served (and labelled) v1
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 2})
    assert r.headers["x-policy-version"] == "1" and r.json()["system_fingerprint"] == "clawloop-v1"


def test_logprob_bytes_are_the_tokens_own(engine, make_gateway):
    tok = engine.tokenizer
    ids = tok.encode("é日", add_special_tokens=False)
    assert len(ids) >= 3, "the test wants tokens that split UTF-8 characters"
    g = make_gateway(engine=ScriptedEngine(tok, ids))
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 8, "logprobs": True,
                                                          "top_logprobs": 1})
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8") == "é日"
    assert all(e["bytes"] != list("\ufffd".encode()) for e in entries)


# ------------------------------------------------------------------ limits

def test_queue_full_is_429_with_retry_after_and_captures_nothing(engine, make_gateway):
    eng = scripted(engine, delay_s=0.1)
    g = make_gateway(engine=eng, serve__max_concurrent_generations="1", serve__max_queued_requests="1")
    body = {"messages": Q, "max_tokens": 8}

    def wait_for(cond):
        deadline = time.time() + 10
        while not cond() and time.time() < deadline:
            time.sleep(0.005)

    with cf.ThreadPoolExecutor(3) as ex:
        running = ex.submit(httpx.post, g.url + "/v1/chat/completions", json=body, timeout=30)
        wait_for(lambda: g.gw.slots.used == 1)
        queued = ex.submit(httpx.post, g.url + "/v1/chat/completions", json=body, timeout=30)
        wait_for(lambda: len(g.gw.slots.waiters) == 1)
        refused = httpx.post(g.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "refused"})
        assert running.result().status_code == 200 and queued.result().status_code == 200
    err = assert_openai_error(refused, 429, "rate_limit_exceeded")
    assert err["type"] == "requests" and int(refused.headers["retry-after"]) >= 1
    assert stored(g) == 2 and g.store.session_turns("refused") == []
    assert g.gw.slots.used == 0 and not g.gw.slots.waiters
    # the SDK sees a RateLimitError
    g.gw.slots.used = 1
    g.gw.slots.max_queued = 0
    with pytest.raises(openai.RateLimitError):
        g.client().chat.completions.create(model="m", messages=Q, max_tokens=2)
    g.gw.slots.used = 0


def test_store_overload_is_429(make_gateway):
    g = make_gateway()
    g.store.overloaded = lambda: True
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 2},
                   headers={"X-Session-Id": "over"})
    assert_openai_error(r, 429, "capture_overloaded")
    assert r.headers["retry-after"]
    assert stored(g) == 0 and "over" not in g.gw.capture.sessions
    g.store.overloaded = lambda: False
    assert httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 2}).status_code == 200


def test_request_timeout_is_504_aborts_and_keeps_what_was_made(engine, make_gateway):
    eng = scripted(engine, delay_s=0.15)  # 8 tokens take 1.2 s
    g = make_gateway(engine=eng, serve__request_timeout_s="0.8")
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 8},
                   headers={"X-Session-Id": "slow"})
    err = assert_openai_error(r, 504, "timeout")
    assert "request_timeout_s" in err["message"]
    # streamed: the error arrives as an event, after the tokens that made it out
    with httpx.stream("POST", g.url + "/v1/chat/completions", headers={"X-Session-Id": "slow-stream"},
                      json={"messages": Q, "max_tokens": 8, "stream": True}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert json.loads(lines[-1][6:])["error"]["code"] == "timeout" and "data: [DONE]" not in lines
    deadline = time.time() + 5
    while eng.active and time.time() < deadline:
        time.sleep(0.02)
    assert eng.active == 0 and eng.aborted == 2, "the generations were not aborted"
    g.store.flush()
    for sid in ("slow", "slow-stream"):
        (t,) = g.store.session_turns(sid)
        assert t.finish_reason == "abort" and not t.trainable and 0 < len(t.response_ids) < 8
        assert len(t.response_ids) == len(t.response_logprobs)
    assert g.gw.slots.used == 0


def test_request_timeout_while_queued_is_504(make_gateway):
    g = make_gateway(serve__max_concurrent_generations="1", serve__request_timeout_s="0.4")
    g.gw.slots.used = 1  # every slot busy
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 8},
                   headers={"X-Session-Id": "queued"})
    assert_openai_error(r, 504, "timeout")
    assert not g.gw.slots.waiters and g.gw.slots.used == 1
    g.gw.slots.used = 0
    assert httpx.post(g.url + "/v1/chat/completions", json={"messages": Q, "max_tokens": 2}).status_code == 200
    g.store.flush()
    assert g.store.session_turns("queued") == [] and g.gw.slots.used == 0


def test_huge_prompt_is_refused_without_blocking_the_server(make_gateway):
    g = make_gateway()
    big = {"messages": [{"role": "user", "content": "12+7 " * 1_500_000}]}  # 7.5 MB: under the body limit
    t0 = time.perf_counter()
    r = httpx.post(g.url + "/v1/chat/completions", json=big, timeout=60)
    assert time.perf_counter() - t0 < 5
    assert_openai_error(r, 400, "context_length_exceeded")
    # a long prompt under the guard is rendered off the event loop: health answers meanwhile
    mid = {"messages": [{"role": "user", "content": "9 " * 20_000}], "max_tokens": 2}
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(httpx.post, g.url + "/v1/chat/completions", json=mid, timeout=60)
        assert httpx.get(g.url + "/health", timeout=5).status_code == 200
        assert_openai_error(fut.result(), 400, "context_length_exceeded")


@pytest.mark.parametrize("mib", [9, 64])
def test_oversized_body_gets_a_readable_413(make_gateway, mib):
    g = make_gateway()
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * (mib << 20) + b'"}]}'
    # raw socket: send everything, then read the answer
    s = socket.create_connection(("127.0.0.1", g.server.port), timeout=30)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sender = threading.Thread(target=lambda: s.sendall(head + body))
    sender.start()
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 100:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    sender.join(timeout=30)
    s.close()
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"
    # and through the openai SDK: a 413 status error, not a connection error it would retry
    with pytest.raises(openai.APIStatusError) as e:
        g.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * (mib << 20)}])
    assert e.value.status_code == 413
    assert httpx.get(g.url + "/health").status_code == 200


@pytest.mark.parametrize("messages", [
    [{"role": "tool", "tool_call_id": "c1", "content": "19"}],
    [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "19"}],
    [{"role": "system", "content": "s"}, {"role": "tool", "content": "19"}, {"role": "user", "content": "hi"}],
], ids=["alone", "after-user", "after-system"])
def test_tool_message_without_an_assistant_call_is_400(gateway, messages):
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    err = assert_openai_error(r, 400, "invalid_value")
    assert err["param"].endswith(".role") and "tool" in err["message"]
    ok = [{"role": "user", "content": "hi"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "19"}, {"role": "tool", "tool_call_id": "c2", "content": "20"}]
    assert httpx.post(gateway.url + "/v1/chat/completions", json={"messages": ok, "max_tokens": 2}).status_code == 200
