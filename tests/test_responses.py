"""/v1/responses against a real server on loopback (one per module): the translation onto chat,
sessions linked natively by `previous_response_id`, the durable per-tenant response store, the
stream's events, and bad input. Through the official `openai` client; raw httpx where the
client cannot send the bad input. (Tool calls and structured output through real clients:
tests/test_clients.py.)"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import Gateway

CALC = {"type": "function", "name": "calculator", "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def gw(engine, random_model_dir, tmp_path_factory):
    g = Gateway(engine, random_model_dir, tmp_path_factory.mktemp("responses"))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def client(gw):
    return gw.client()


def turns_of(gw, sid=None):
    gw.store.flush()
    sessions = dict(gw.store.iter_sessions())
    return sessions if sid is None else sessions[sid]


def session_of_request(gw, rid):
    for sid, turns in turns_of(gw).items():
        for t in turns:
            if t.request_id == rid:
                return sid, t
    raise AssertionError(f"no turn for {rid}")


def test_text_response_shape_and_capture(gw, client):
    r = client.responses.create(model="m", input="What is 12+7?", instructions="Be brief.", max_output_tokens=5,
                                temperature=0.5, metadata={"k": "v"})
    assert r.object == "response" and r.id.startswith("resp-") and r.model == "m"
    # the random model never stops on its own: max_output_tokens cuts it
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    msg = r.output[0]
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.output_text == msg.content[0].text and r.usage.output_tokens == 5
    assert r.usage.total_tokens == r.usage.input_tokens + 5
    assert r.instructions == "Be brief." and r.temperature == 0.5 and r.max_output_tokens == 5
    assert r.metadata == {"k": "v"}
    sid, turn = session_of_request(gw, r.id)
    assert turn.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12+7?"}]
    assert turn.response_text == r.output_text and len(turn.response_ids) == 5 and turn.type == "main"
    assert turn.sampling["temperature"] == 0.5


def test_previous_response_id_links_one_session_without_headers(gw, client):
    r1 = client.responses.create(model="m", input="What is 2+2?", max_output_tokens=4)
    r2 = client.responses.create(model="m", input="And 3+3?", previous_response_id=r1.id, max_output_tokens=4)
    r3 = client.responses.create(model="m", input="Thanks.", previous_response_id=r2.id, max_output_tokens=4)
    assert r2.previous_response_id == r1.id
    sid, t3 = session_of_request(gw, r3.id)
    turns = sorted(turns_of(gw, sid), key=lambda t: t.index)
    assert [t.request_id for t in turns] == [r1.id, r2.id, r3.id]
    assert t3.messages == [{"role": "user", "content": "What is 2+2?"},
                           {"role": "assistant", "content": r1.output_text},
                           {"role": "user", "content": "And 3+3?"},
                           {"role": "assistant", "content": r2.output_text},
                           {"role": "user", "content": "Thanks."}]
    assert turns[0].next_state == {"role": "user", "content": "And 3+3?"}
    assert turns[1].next_state == {"role": "user", "content": "Thanks."}
    # instructions are not carried over: each request's own
    r4 = client.responses.create(model="m", input="x", instructions="New rules.", previous_response_id=r1.id,
                                 max_output_tokens=2)
    assert session_of_request(gw, r4.id)[1].messages[0] == {"role": "system", "content": "New rules."}


def test_an_explicit_session_is_inherited_and_an_explicit_one_wins(gw, client):
    r1 = client.responses.create(model="m", input="hi", max_output_tokens=2, extra_headers={"X-Session-Id": "rs-1"})
    r2 = client.responses.create(model="m", input="more", previous_response_id=r1.id, max_output_tokens=2)
    assert [t.request_id for t in sorted(turns_of(gw, "rs-1"), key=lambda t: t.index)] == [r1.id, r2.id]
    r3 = client.responses.create(model="m", input="elsewhere", previous_response_id=r2.id, max_output_tokens=2,
                                 extra_body={"session_id": "rs-2"})
    assert [t.request_id for t in turns_of(gw, "rs-2")] == [r3.id]


def test_function_call_items_become_tool_messages(gw, client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is 12+7?"}]},
             {"type": "function_call", "call_id": "call_a", "name": "calculator",
              "arguments": "{\"expression\": \"12+7\"}", "id": "fc_1", "status": "completed"},
             {"type": "function_call_output", "call_id": "call_a", "output": "19"}]
    r = client.responses.create(model="m", input=items, tools=[CALC], tool_choice="none", max_output_tokens=3)
    assert r.tools[0].name == "calculator" and r.tool_choice == "none"
    turn = session_of_request(gw, r.id)[1]
    assert turn.messages[1]["tool_calls"][0]["id"] == "call_a"
    assert turn.messages[1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert turn.messages[2] == {"role": "tool", "tool_call_id": "call_a", "name": "calculator", "content": "19"}


def test_stream_events_in_order(gw, client):
    # greedy: the random model sampled at T=1 can spend most of 6 tokens on special tokens, which add no text.
    # At least one delta, not two: tokens ready together leave as one write (serving.drain), and a cold first
    # request on a loaded machine got all 6 in one (CI, 2026-11-27). Several chunks: tests/test_clients.py.
    events = list(client.responses.create(model="m", input="Count.", max_output_tokens=6, stream=True,
                                          temperature=0))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and 1 <= len(kinds[4:-4]) <= 6
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text == events[-4].text
    assert final.id == events[0].response.id and events[0].response.status == "in_progress"
    assert final.usage.output_tokens == 6
    got = client.responses.retrieve(final.id)  # stored before the terminal event went out
    assert got.output_text == text and got.status == "incomplete"
    assert session_of_request(gw, final.id)[1].response_text == text


def test_store_false_keeps_nothing(gw, client):
    r = client.responses.create(model="m", input="secret", max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    assert all(t.request_id != r.id for ts in turns_of(gw).values() for t in ts)


def test_get_and_delete(client):
    r = client.responses.create(model="m", input="keep me", max_output_tokens=2)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="x", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_responses_survive_a_restart(engine, random_model_dir, tmp_path):
    a = Gateway(engine, random_model_dir, tmp_path)
    r1 = a.client().responses.create(model="m", input="first", max_output_tokens=3)
    a.stop()
    b = Gateway(engine, random_model_dir, tmp_path)
    try:
        c = b.client()
        assert c.responses.retrieve(r1.id).output_text == r1.output_text
        r2 = c.responses.create(model="m", input="second", previous_response_id=r1.id, max_output_tokens=2)
        turn = session_of_request(b, r2.id)[1]
        assert turn.messages[:2] == [{"role": "user", "content": "first"},
                                     {"role": "assistant", "content": r1.output_text}]
    finally:
        b.stop()


def test_one_tenant_cannot_read_or_continue_anothers(make_gateway):
    g = make_gateway(serve__api_keys=["alice=ka", "bob=kb"])
    alice, bob = g.client(api_key="ka"), g.client(api_key="kb")
    r = alice.responses.create(model="m", input="mine", max_output_tokens=2)
    assert alice.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="m", input="x", previous_response_id=r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    with pytest.raises(openai.AuthenticationError):
        g.client(api_key="nope").responses.retrieve(r.id)


BAD = [
    ("missing input", {}, "missing_required_parameter", "input"),
    ("empty input", {"input": []}, "invalid_value", "input"),
    ("image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "unsupported_content", "input[0].content[0].type"),
    ("unknown item", {"input": [{"type": "web_search_call", "id": "x"}]}, "unsupported_value", "input[0].type"),
    ("bad role", {"input": [{"role": "wizard", "content": "x"}]}, "invalid_value", "input[0].role"),
    ("call without name", {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     "missing_required_parameter", "input[0].name"),
    ("builtin tool", {"input": "x", "tools": [{"type": "web_search"}]}, "unsupported_value", "tools[0].type"),
    ("tool without name", {"input": "x", "tools": [{"type": "function"}]}, "missing_required_parameter",
     "tools[0].name"),
    ("allowed_tools", {"input": "x", "tools": [CALC], "tool_choice": {"type": "allowed_tools", "tools": []}},
     "unsupported_value", "tool_choice"),
    ("background", {"input": "x", "background": True}, "unsupported_parameter", "background"),
    ("conversation", {"input": "x", "conversation": "conv_1"}, "unsupported_parameter", "conversation"),
    ("reasoning", {"input": "x", "reasoning": {"effort": "high"}}, "unsupported_parameter", "reasoning"),
    ("truncation", {"input": "x", "truncation": "auto"}, "unsupported_parameter", "truncation"),
    ("include", {"input": "x", "include": ["file_search_call.results"]}, "unsupported_value", "include"),
    ("format type", {"input": "x", "text": {"format": {"type": "yaml"}}}, "invalid_value", "text.format.type"),
    ("verbosity", {"input": "x", "text": {"verbosity": "high"}}, "unsupported_value", "text.verbosity"),
    ("max_output_tokens", {"input": "x", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
    ("temperature", {"input": "x", "temperature": 5}, "invalid_value", "temperature"),
    ("context", {"input": "9 " * 3000}, "context_length_exceeded", "input"),
]


@pytest.mark.parametrize("name,body,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_400_naming_the_parameter(gw, name, body, code, param):
    before = turns_of(gw)
    r = httpx.post(gw.url + "/v1/responses", json={"model": "m", **body}, headers={"X-Session-Id": "bad"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["type"] == "invalid_request_error"
    assert turns_of(gw) == before


def test_a_stream_the_client_leaves_stores_no_response_and_keeps_an_aborted_turn(gw):
    import time

    with httpx.stream("POST", gw.url + "/v1/responses", json={"model": "m", "input": "Go on.", "stream": True,
                                                               "max_output_tokens": 900},
                      headers={"X-Session-Id": "left"}) as r:
        lines = r.iter_lines()
        first = json.loads(next(ln for ln in lines if ln.startswith("data: "))[6:])
        assert first["type"] == "response.created"
        next(ln for ln in lines if "output_text.delta" in ln)
    rid = first["response"]["id"]
    deadline = time.time() + 10
    while time.time() < deadline:
        gw.store.flush()
        turns = gw.store.session_turns("left")
        if turns and turns[0].finish_reason != "pending":
            break
        time.sleep(0.05)
    (turn,) = turns
    assert turn.request_id == rid and turn.finish_reason == "abort" and not turn.trainable
    assert 0 < len(turn.response_ids) < 900
    assert httpx.get(gw.url + f"/v1/responses/{rid}").status_code == 404
