"""/v1/messages (Anthropic's Messages API) against a real server on loopback (one per module) over
the random tiny model, through the official `anthropic` SDK, unchanged: create, both ways of
streaming, system and multi-turn, tools (constrained decoding forces the call the request names)
and a tool_result turn, stop_sequences, count_tokens, x-api-key tenants and Anthropic-shaped
errors seen as the SDK's exception classes. What was captured is checked token-exact: the prompt
ids are the chat template's rendering of the translated messages, the response ids and logprobs
are what the engine sampled (the model's log_softmax at each id).

A random model never stops on its own, so every answer here ends at `max_tokens`, a forced tool
call's end, or a stop sequence taken from a greedy answer (temperature 0 takes the same path
every time)."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from clawloop.gateway.messages import anthropic_error
from clawloop.gateway.protocol import APIError
from conftest import Gateway

CALC = {"name": "calculator", "description": "Evaluate arithmetic.",
        "input_schema": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 8}},
                         "required": ["expression"], "additionalProperties": False}}
FORCE_CALC = {"type": "tool", "name": "calculator"}
GREEDY = {"temperature": 0}
"""SDK 2.x has no `temperature` argument (the newest Claude models dropped it); the API still takes it."""


@pytest.fixture(scope="module")
def gw(engine, random_model_dir, tmp_path_factory):
    g = Gateway(engine, random_model_dir, tmp_path_factory.mktemp("messages"), serve__api_keys=["alice=ka", "bob=kb"])
    yield g
    g.stop()


@pytest.fixture(scope="module")
def client(gw):
    return anthropic.Anthropic(base_url=gw.url, api_key="ka", max_retries=0)


def turns(gw, sid):
    gw.store.flush()
    return sorted(gw.store.session_turns(sid), key=lambda t: t.index)


def turn_of(gw, request_id):
    gw.store.flush()
    for sid, ts in gw.store.iter_sessions():
        for t in ts:
            if t.request_id == request_id:
                return sid, t
    raise AssertionError(f"no captured turn for {request_id}")


def model_logprobs(engine, prompt_ids, response_ids):
    import torch

    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt_ids + response_ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[len(prompt_ids) - 1 + k, tid]) for k, tid in enumerate(response_ids)]


def test_create_system_multi_turn_is_captured_token_exact(gw, client, engine):
    history = [{"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": [{"type": "text", "text": "4"}]},
               {"role": "user", "content": [{"type": "text", "text": "And 3+"}, {"type": "text", "text": "3?"}]}]
    r = client.messages.create(model="m", max_tokens=8, system=[{"type": "text", "text": "Be brief."}],
                               messages=history, extra_headers={"X-Session-Id": "exact"},
                               extra_body={"return_token_ids": True, "temperature": 0.7})
    assert r.type == "message" and r.role == "assistant" and r.model == "m" and r.id.startswith("msg-")
    assert [b.type for b in r.content] == ["text"]
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.output_tokens == 8
    extra = r.model_extra
    (t,) = turns(gw, "alice/exact")  # x-api-key "ka" is tenant alice: her session ids are namespaced
    want = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    assert t.messages == want and t.tenant == "alice" and t.type == "main" and t.trainable
    text = engine.tokenizer.apply_chat_template(want, tokenize=False, add_generation_prompt=True)
    prompt = engine.tokenizer.encode(text, add_special_tokens=False)
    assert t.prompt_ids == prompt == extra["prompt_token_ids"] and r.usage.input_tokens == len(prompt)
    assert t.response_ids == extra["token_ids"] and len(t.response_ids) == 8
    assert t.response_logprobs == pytest.approx(extra["token_logprobs"])
    assert t.response_logprobs == pytest.approx(model_logprobs(engine, t.prompt_ids, t.response_ids), abs=1e-3)
    assert engine.tokenizer.decode(t.response_ids, skip_special_tokens=True) == t.response_text == r.content[0].text
    assert t.request_id == r.id and t.sampling["temperature"] == 0.7
    assert t.policy_version == extra["policy_version"] == 0


def test_multi_turn_without_headers_links_next_states(gw, client):
    q1 = {"role": "user", "content": "Say hi."}
    r1 = client.messages.create(model="m", max_tokens=4, messages=[q1])
    q2 = {"role": "user", "content": "Again?"}
    r2 = client.messages.create(model="m", max_tokens=4,
                                messages=[q1, {"role": "assistant", "content": r1.content}, q2])
    sid1, _ = turn_of(gw, r1.id)
    sid2, t2 = turn_of(gw, r2.id)
    assert sid1 == sid2 and "conv-" in sid1  # the history carries the served answer: one inferred session
    first, second = turns(gw, sid1)
    assert first.next_state == {"role": "user", "content": "Again?"} and second.index == 1


def test_side_turn_header(gw, client):
    r = client.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "Title?"}],
                               extra_headers={"X-Session-Id": "side", "X-Turn-Type": "side"})
    (t,) = turns(gw, "alice/side")
    assert t.request_id == r.id and t.type == "side" and not t.trainable


def test_stream_helper_matches_create(gw, client):
    kw = dict(model="m", max_tokens=10, extra_body=GREEDY, messages=[{"role": "user", "content": "What is 12+7?"}])
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw, extra_headers={"X-Session-Id": "stream"}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens == whole.usage.input_tokens
    (t,) = turns(gw, "alice/stream")
    assert t.request_id == final.id and t.response_text == text and len(t.response_ids) == 10


def test_raw_stream_event_sequence(client):
    events = list(client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}],
                                         stream=True))
    kinds = [e.type for e in events]  # the SDK drops pings (the raw test below sees it)
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens > 0 and events[0].message.content == []
    assert all(e.delta.type == "text_delta" for e in events if e.type == "content_block_delta")
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 5


def test_raw_stream_has_event_lines(gw):
    body = {"model": "m", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", gw.url + "/v1/messages", json=body,
                      headers={"x-api-key": "ka", "anthropic-version": "2023-06-01"}) as r:
        raw = r.read().decode()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in raw.split("\n\n") if f.strip()]
    assert [f.split("\n")[0] for f in frames[:3]] == ["event: message_start", "event: ping",
                                                     "event: content_block_start"]
    for f in frames:  # every frame names its event, and the data says the same type
        ev, data = f.split("\n")
        assert ev.startswith("event: ") and json.loads(data[len("data: "):])["type"] == ev[len("event: "):]


def test_forced_tool_use_then_tool_result_is_next_state(gw, client):
    q = {"role": "user", "content": "What is 12+7?"}
    r = client.messages.create(model="m", max_tokens=80, extra_body=GREEDY, tools=[CALC], tool_choice=FORCE_CALC,
                               messages=[q], extra_headers={"X-Session-Id": "tools"})
    assert r.stop_reason == "tool_use"
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "calculator" and set(use.input) == {"expression"} and len(use.input["expression"]) <= 8
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "19"}]}
    r2 = client.messages.create(model="m", max_tokens=4, tools=[CALC], messages=[
        q, {"role": "assistant", "content": r.content}, result], extra_headers={"X-Session-Id": "tools"})
    t0, t1 = turns(gw, "alice/tools")
    assert t0.tool_calls[0]["function"]["name"] == "calculator"
    assert json.loads(t0.tool_calls[0]["function"]["arguments"]) == use.input
    assert t0.sampling["logprobs"] == "constrained"
    assert t0.next_state == {"role": "tool", "content": "19"}  # the tool result is the call's next state
    assert t1.request_id == r2.id and t1.messages[-1] == {"role": "tool", "tool_call_id": use.id, "content": "19",
                                                          "name": "calculator"}
    assert t1.messages[-2]["tool_calls"][0]["id"] == use.id


def test_streamed_tool_use(client):
    with client.messages.stream(model="m", max_tokens=80, extra_body=GREEDY, tools=[CALC], tool_choice=FORCE_CALC,
                                messages=[{"role": "user", "content": "What is 12+7?"}]) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert any(d.type == "input_json_delta" for d in deltas)
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and set(use.input) == {"expression"}
    partial = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    assert json.loads(partial) == use.input


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(client, stream):
    # the random model's greedy answer is all newlines: sampled, with clawloop's `seed`, it is not
    kw = dict(model="m", max_tokens=16, extra_body={"seed": 5}, messages=[{"role": "user", "content": "Count."}])
    text = client.messages.create(**kw).content[0].text
    stop = next(text[k:k + 2] for k in range(3, len(text) - 1) if text[k:k + 2].strip())
    if stream:
        with client.messages.stream(**kw, stop_sequences=["zzzq", stop]) as s:
            r = s.get_final_message()
    else:
        r = client.messages.create(**kw, stop_sequences=["zzzq", stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.find(stop)]


def test_count_tokens(client):
    kw = dict(model="m", system="Be brief.", messages=[{"role": "user", "content": "What is 2+2?"}])
    n = client.messages.count_tokens(**kw).input_tokens
    assert n == client.messages.create(**kw, max_tokens=1).usage.input_tokens > 0


def test_x_api_key_tenants(gw):
    bob = anthropic.Anthropic(base_url=gw.url, api_key="kb", max_retries=0)
    bob.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                        extra_headers={"X-Session-Id": "mine"})
    (t,) = turns(gw, "bob/mine")
    assert t.tenant == "bob"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=gw.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 401 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=gw.url, auth_token="kb", max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]).usage


def _bad_request(fn) -> dict:
    with pytest.raises(anthropic.BadRequestError) as e:
        fn()
    assert e.value.status_code == 400 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    return e.value.body["error"]


def test_errors_in_anthropic_shape(client):
    hi = [{"role": "user", "content": "hi"}]
    err = _bad_request(lambda: client.post("/v1/messages", body={"model": "m", "messages": hi},
                                           cast_to=httpx.Response))
    assert "max_tokens" in err["message"]
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=[
        {"role": "system", "content": "be nice"}]))
    assert "messages.0.role" in err["message"] and "top-level 'system'" in err["message"]
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=hi, extra_body={"top_k": 5}))
    assert err["message"].startswith("top_k: not supported")
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=hi,
                                                      thinking={"type": "enabled", "budget_tokens": 1024}))
    assert "thinking" in err["message"]
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=hi, tools=[
        {"type": "web_search_20250305", "name": "web_search"}]))
    assert "server tools" in err["message"]
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=hi,
                                                      extra_body={"temperature": 1.5}))
    assert "temperature" in err["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.post("/v1/messages/nope", body={}, cast_to=httpx.Response)
    assert e.value.body["error"]["type"] == "not_found_error"


def test_engine_unavailable_is_529_overloaded():
    status, body = anthropic_error(APIError(503, "no replica", headers={"Retry-After": "2"}))
    assert status == 529 and body == {"type": "error", "error": {"type": "overloaded_error", "message": "no replica"}}


def test_timeout_is_anthropic_shaped_in_reply_and_stream(make_gateway):
    # the random model answers this in 478 tokens, ~0.33 s on 2 idle cores: 0.3 s was the edge (it once finished)
    g = make_gateway(serve__request_timeout_s=0.1)
    c = anthropic.Anthropic(base_url=g.url, api_key="none", max_retries=0)
    kw = dict(model="m", max_tokens=1000, messages=[{"role": "user", "content": "Write a lot."}],
              extra_body={"seed": 1})
    with pytest.raises(anthropic.GatewayTimeoutError) as e:
        c.messages.create(**kw)
    assert e.value.body["error"]["type"] == "timeout_error"
    with pytest.raises(anthropic.APIStatusError) as e:  # after the headers left: an error event
        with c.messages.stream(**kw) as s:
            list(s)
    assert e.value.body["error"]["type"] == "timeout_error" and "request_timeout_s" in e.value.message


def test_final_assistant_turn_is_a_prefill(gw, client, engine):
    msgs = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "The answer is"}]
    r = client.messages.create(model="m", max_tokens=3, messages=msgs, extra_headers={"X-Session-Id": "prefill"},
                               extra_body={"return_token_ids": True})
    (t,) = turns(gw, "alice/prefill")
    text = engine.tokenizer.apply_chat_template(msgs, tokenize=False, continue_final_message=True)
    assert t.prompt_ids == engine.tokenizer.encode(text, add_special_tokens=False) == r.model_extra["prompt_token_ids"]
    assert t.messages == msgs and r.usage.output_tokens == 3
    err = _bad_request(lambda: client.messages.create(model="m", max_tokens=2, messages=msgs + [
        {"role": "user", "content": []}]))  # an empty turn is refused, not read as a prefill of the one before
    assert err["message"].startswith("messages.2.content: all messages must have non-empty content")


def test_tool_choice_any_without_parallel_calls(gw, client):
    r = client.messages.create(model="m", max_tokens=80, tools=[CALC], messages=[{"role": "user", "content": "12+7"}],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True},
                               extra_body={"seed": 2})
    assert r.stop_reason == "tool_use" and [b.type for b in r.content if b.type == "tool_use"] == ["tool_use"]
    _, t = turn_of(gw, r.id)
    assert t.sampling["constraint"]["tool_choice"] == "required"
    assert t.sampling["constraint"]["parallel_tool_calls"] is False


def test_output_config_json_schema(client):
    schema = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
              "required": ["verdict", "sure"], "additionalProperties": False}
    r = client.messages.create(model="m", max_tokens=30, messages=[{"role": "user", "content": "Is 2+2 4?"}],
                               output_config={"format": {"type": "json_schema", "schema": schema}},
                               extra_body={"seed": 4})
    got = json.loads(r.content[0].text)
    assert set(got) == {"verdict", "sure"} and got["verdict"] in ("yes", "no") and isinstance(got["sure"], bool)
