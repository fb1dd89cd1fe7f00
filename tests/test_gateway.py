"""The OpenAI-compatible API against a real server on loopback, through the
official `openai` client (raw httpx only where the client cannot send the bad
input)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

Q = [{"role": "user", "content": "What is 12+7?"}]


def test_non_streaming_shape_and_version_header(gateway):
    c = gateway.client()
    raw = c.chat.completions.with_raw_response.create(model="anything", messages=Q, max_tokens=8, seed=1)
    r = raw.parse()
    assert raw.headers["x-policy-version"] == "0"
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert len(r.choices) == 1 and r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_non_streaming_for_same_seed(gateway):
    c = gateway.client()
    full = c.chat.completions.create(model="m", messages=Q, max_tokens=16, seed=42, temperature=1.0)
    chunks = list(c.chat.completions.create(model="m", messages=Q, max_tokens=16, seed=42, temperature=1.0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content_chunks) >= 3, "streaming must deliver several chunks, not one blob"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(ch.id == chunks[0].id for ch in chunks)


def test_stream_usage_chunk_and_done(gateway):
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json={
            "messages": Q, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 6
    finish = json.loads(lines[-3][6:])
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")


def test_n_choices_are_independent(gateway):
    c = gateway.client()
    r = c.chat.completions.create(model="m", messages=Q, max_tokens=12, n=3, seed=5, temperature=1.0,
                                  extra_body={"return_token_ids": True})
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in r.choices]
    assert len(set(texts)) > 1, texts
    assert r.usage.completion_tokens == sum(len(ch.model_extra["token_ids"]) for ch in r.choices)
    # streamed n: every index gets its own finish chunk
    chunks = list(c.chat.completions.create(model="m", messages=Q, max_tokens=5, n=2, stream=True))
    finished = {ch.choices[0].index for ch in chunks if ch.choices and ch.choices[0].finish_reason}
    assert finished == {0, 1}


def test_max_tokens_and_max_completion_tokens(gateway):
    c = gateway.client()
    for kw in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        r = c.chat.completions.create(model="m", messages=Q, temperature=0, **kw,
                                      extra_body={"return_token_ids": True})
        ids = r.choices[0].model_extra["token_ids"]
        assert len(ids) <= 3
        if r.choices[0].finish_reason == "length":
            assert len(ids) == 3


def test_logprobs_and_top_logprobs(gateway):
    c = gateway.client()
    r = c.chat.completions.create(model="m", messages=Q, max_tokens=6, logprobs=True, top_logprobs=3,
                                  temperature=0, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    content = ch.logprobs.content
    lps = ch.model_extra["token_logprobs"]
    assert 1 <= len(content) <= len(lps)
    for k, e in enumerate(content):
        assert e.logprob <= 0 and e.logprob == pytest.approx(lps[k])
        assert len(e.top_logprobs) == 3
        # greedy: the sampled token is the most likely one
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob)
    assert "".join(e.token for e in content) == ch.message.content


def test_stop_strings_truncate(gateway):
    c = gateway.client()
    base = c.chat.completions.create(model="m", messages=Q, max_tokens=30, temperature=0).choices[0].message.content
    assert len(base) > 6
    stop = base[3:5]
    r = c.chat.completions.create(model="m", messages=Q, max_tokens=30, temperature=0, stop=[stop, "\x00never"])
    assert r.choices[0].message.content == base[:base.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    # and streamed, the stop string never leaks into the deltas
    chunks = c.chat.completions.create(model="m", messages=Q, max_tokens=30, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == base[:base.index(stop)]


def test_message_forms_accepted(gateway):
    c = gateway.client()
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                               "parameters": {"type": "object",
                                                              "properties": {"expression": {"type": "string"}}}}}]
    msgs = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "12+7?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calculator", "arguments": "{\"expression\": \"12+7\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "19"},
    ]
    r = c.chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=4,
                                  extra_body={"return_token_ids": True})
    prompt_ids = r.model_extra["prompt_token_ids"]
    rendered = gateway.gw.tok.decode(prompt_ids)
    assert "calculator" in rendered and "12+7" in rendered and "19" in rendered and "Be brief." in rendered


def test_models_health_metrics(gateway):
    c = gateway.client()
    models = c.models.list()
    assert models.data[0].id == "clawloop"
    h = httpx.get(gateway.url + "/health").json()
    assert h["status"] == "ok" and h["policy_version"] == 0
    c.chat.completions.create(model="m", messages=Q, max_tokens=2)
    text = httpx.get(gateway.url + "/metrics").text
    assert 'clawloop_requests_total{code="200"}' in text
    assert "clawloop_engine_policy_version" in text and "clawloop_capture_turns_captured" in text


# -- bad input -----------------------------------------------------------------

def _post(url, body=None, raw=None, headers=None):
    return httpx.post(url + "/v1/chat/completions", json=body if raw is None else None,
                      content=raw, headers=headers or {})


BAD = [
    ("malformed json", None, b"{not json", "invalid_json", None),
    ("not an object", None, b"[1, 2]", "invalid_json", None),
    ("missing messages", {"model": "m"}, None, "missing_required_parameter", "messages"),
    ("empty messages", {"messages": []}, None, "empty_array", "messages"),
    ("messages not a list", {"messages": "hi"}, None, "invalid_type", "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, None, "invalid_value", "messages[0].role"),
    ("missing content", {"messages": [{"role": "user"}]}, None, "missing_required_parameter",
     "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, None,
     "unsupported_content", "messages[0].content[0].type"),
    ("temperature", {"messages": Q, "temperature": 3}, None, "invalid_value", "temperature"),
    ("top_p zero", {"messages": Q, "top_p": 0}, None, "invalid_value", "top_p"),
    ("n zero", {"messages": Q, "n": 0}, None, "invalid_value", "n"),
    ("n huge", {"messages": Q, "n": 1000}, None, "invalid_value", "n"),
    ("max_tokens zero", {"messages": Q, "max_tokens": 0}, None, "invalid_value", "max_tokens"),
    ("max_tokens string", {"messages": Q, "max_tokens": "5"}, None, "invalid_type", "max_tokens"),
    ("top_logprobs alone", {"messages": Q, "top_logprobs": 2}, None, "invalid_value", "top_logprobs"),
    ("top_logprobs range", {"messages": Q, "logprobs": True, "top_logprobs": 50}, None, "invalid_value",
     "top_logprobs"),
    ("stop list too long", {"messages": Q, "stop": ["a", "b", "c", "d", "e"]}, None, "invalid_value", "stop"),
    ("seed float", {"messages": Q, "seed": 1.5}, None, "invalid_type", "seed"),
    ("tool without name", {"messages": Q, "tools": [{"type": "function", "function": {}}]}, None,
     "missing_required_parameter", "tools[0].function.name"),
    ("stream_options without stream", {"messages": Q, "stream_options": {"include_usage": True}}, None,
     "invalid_value", "stream_options"),
    ("context too long", {"messages": [{"role": "user", "content": "9 " * 3000}]}, None,
     "context_length_exceeded", "messages"),
]


@pytest.mark.parametrize("name,body,raw,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_400_and_captures_nothing(gateway, name, body, raw, code, param):
    r = _post(gateway.url, body, raw, headers={"X-Session-Id": "bad"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["param"] == param
    assert err["message"]
    gateway.store.flush()
    assert gateway.store.stats()["turns"] == 0
    assert "bad" not in gateway.gw.capture.sessions
    assert httpx.get(gateway.url + "/health").json()["status"] == "ok"


def test_bad_turn_type_header(gateway):
    r = _post(gateway.url, {"messages": Q}, headers={"X-Turn-Type": "sideways"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Turn-Type"


def test_openai_client_raises_bad_request(gateway):
    with pytest.raises(openai.BadRequestError) as e:
        gateway.client().chat.completions.create(model="m", messages=Q, temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_body_over_limit_is_413(make_gateway):
    g = make_gateway(serve__max_body_bytes="2000")
    r = _post(g.url, {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # chunked upload without a content-length is cut off too
    r = httpx.post(g.url + "/v1/chat/completions", content=iter([b"{" + b" " * 1500, b" " * 1500 + b"}"]))
    assert r.status_code == 413
    g.store.flush()
    assert g.store.stats()["turns"] == 0
    assert g.client().chat.completions.create(model="m", messages=Q, max_tokens=2).choices


def test_unknown_route_is_openai_shaped_404(gateway):
    r = httpx.get(gateway.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_api_keys(make_gateway):
    g = make_gateway(serve__api_keys=["k1", "k2"])
    with pytest.raises(openai.AuthenticationError):
        g.client(api_key="wrong").chat.completions.create(model="m", messages=Q, max_tokens=2)
    r = httpx.post(g.url + "/v1/chat/completions", json={"messages": Q})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for key in ("k1", "k2"):
        assert g.client(api_key=key).chat.completions.create(model="m", messages=Q, max_tokens=2).choices
    assert httpx.get(g.url + "/health").status_code == 200  # health stays open for probes


def test_non_loopback_bind_needs_key_or_insecure():
    from clawloop.config import ConfigError
    from clawloop.gateway import check_bind

    with pytest.raises(ConfigError, match="serve.host"):
        check_bind("0.0.0.0", [], False)
    check_bind("0.0.0.0", ["k"], False)
    check_bind("0.0.0.0", [], True)
    check_bind("127.0.0.1", [], False)
    check_bind("::1", [], False)


def test_cli_refuses_open_bind(tmp_path):
    from conftest import run_cli

    r = run_cli("serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "--api-key" in r.stderr


def test_concurrent_requests_all_succeed(gateway):
    import concurrent.futures as cf

    c = gateway.client()
    with cf.ThreadPoolExecutor(16) as ex:
        futs = [ex.submit(c.chat.completions.create, model="m", messages=Q, max_tokens=8, seed=i)
                for i in range(32)]
        results = [f.result() for f in futs]
    assert all(r.choices[0].message.content is not None for r in results)


def test_gc_pauses_are_timed_in_metrics_and_startup_objects_are_frozen_while_serving(engine, random_model_dir, tmp_path):
    """serve.gc_freeze (default on): once the app has started, the objects alive then are out of the
    collector's way (gc.get_freeze_count), and /metrics times the collections; after shutdown they are
    collectable again. A real app served with TestClient's lifespan, the random model."""
    import gc

    from fastapi.testclient import TestClient
    from conftest import make_cfg

    from clawloop.gateway import create_app

    from clawloop.config import Config

    assert Config().serve.gc_freeze is True  # the default (tests' make_cfg turns it off)
    cfg = make_cfg(random_model_dir, tmp_path, serve__gc_freeze="true")
    app = create_app(cfg, engine, None, manage_engine=False)
    with TestClient(app) as c:
        assert gc.get_freeze_count() > 1000
        gc.collect()  # a full collection, timed by the watch
        text = c.get("/metrics").text
        metrics = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("clawloop_gateway_gc")}
        assert metrics["clawloop_gateway_gc_full_collections"] >= 1
        assert metrics["clawloop_gateway_gc_pause_s_total"] > 0
        assert metrics["clawloop_gateway_gc_frozen_objects"] >= gc.get_freeze_count() > 1000  # freed ones leave
    assert gc.get_freeze_count() == 0
    off = create_app(make_cfg(random_model_dir, tmp_path / "off", serve__gc_freeze="false"), engine, None,
                     manage_engine=False)
    with TestClient(off):
        assert gc.get_freeze_count() == 0
