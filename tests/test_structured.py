"""Structured outputs and valid tool calls by constrained decoding, sampling knobs, and the
chat parameters refused by name — through the official client against a real server on the
random tiny model. A random model writes nothing valid on its own: every valid object here
comes from the grammar."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import openai
import pytest
import torch
from pydantic import BaseModel, Field

from clawloop.engines.base import GenerationRequest, SamplingParams

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}
Q = [{"role": "user", "content": "What is 12+7?"}]
SCHEMA = {"type": "object", "properties": {
    "n": {"type": "integer"}, "ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]},
    "tag": {"type": "string", "maxLength": 3}}, "required": ["n", "ok", "color", "tag"], "additionalProperties": False}


class Answer(BaseModel):
    verdict: Literal["yes", "no"]
    confidence: int
    note: str = Field(max_length=4)


def valid_answer(obj: dict) -> bool:
    return (set(obj) == {"n", "ok", "color", "tag"} and isinstance(obj["n"], int) and isinstance(obj["ok"], bool)
            and obj["color"] in ("red", "green") and isinstance(obj["tag"], str) and len(obj["tag"]) <= 3)


def _collect(engine, prompt, params):
    async def run():
        return [ev async for ev in engine.generate(GenerationRequest(prompt, params))]
    return asyncio.run(run())


def test_engine_logprobs_are_those_of_the_constrained_distribution(engine):
    """Replaying the grammar over the sampled ids and masking the model's own logits gives the
    logprobs the engine reported: renormalised over the allowed ids, at temperature 1."""
    from clawloop.gateway.constraints import _json_format

    tag = {"type": "structural_tag", "format": _json_format(SCHEMA)}
    prompt = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    evs = _collect(engine, prompt, SamplingParams(temperature=1.0, max_tokens=200, seed=3, constraint=tag))
    ids = [e.token_id for e in evs]
    assert evs[-1].finish_reason == "stop" and ids[-1] in engine.eos_token_ids
    assert valid_answer(json.loads(engine.tokenizer.decode(ids, skip_special_tokens=True)))

    g = engine.grammars()
    m = g.matcher(g.compile(tag))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()  # (T, V)
    want, raw = [], []
    for t, tid in enumerate(ids):
        masked = g.mask(m, logits[t])
        want.append(float(torch.log_softmax(masked, -1)[tid]))
        raw.append(float(torch.log_softmax(logits[t], -1)[tid]))
        assert m.accept_token(tid)
    got = [e.logprob for e in evs]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    assert sum(got) > sum(raw) + 1.0, "a random model's raw logprobs of a valid object are far lower"


def _whitespace_ids(tok) -> list[int]:
    return [i for i in range(len(tok)) if (t := tok.decode([i])) and not t.strip()]


def test_constrained_json_leaves_no_free_whitespace(gateway):
    """A weak model takes every whitespace the grammar leaves it: the shipped tiny model, allowed 8
    characters a gap, wrote `{"a":93\\n\\n\\n\\n\\n\\n\\n\\n,\\n\\n...` until max_tokens (issue #28). Pushed hard
    toward whitespace here, the JSON is still written exactly as `json.dumps` writes it, and ends."""
    c = gateway.client()
    push = {str(i): 30 for i in _whitespace_ids(gateway.gw.tok)}
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "strict": True, "schema": SCHEMA}}
    r = c.chat.completions.create(model="m", messages=Q, response_format=rf, max_tokens=200, seed=0, logit_bias=push)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and valid_answer(json.loads(text)), text
    assert text == json.dumps(json.loads(text))  # separators ", " and ": ", no other whitespace
    r = c.chat.completions.create(model="m", messages=Q, tools=[ADD], max_tokens=200, seed=0, logit_bias=push,
                                  tool_choice={"type": "function", "function": {"name": "add"}},
                                  extra_headers={"X-Session-Id": "ws"})
    assert r.choices[0].finish_reason == "tool_calls"
    gateway.store.flush()  # the arguments as sampled (the API's are re-serialised): the captured ids
    (turn,) = gateway.store.session_turns("ws")
    written = gateway.gw.tok.decode(turn.response_ids, skip_special_tokens=True)
    args = written.split('"arguments": ', 1)[1].rsplit("}", 1)[0]
    assert args == json.dumps(json.loads(args)), written


def test_serve_json_whitespace_lets_a_gateway_pretty_print(make_gateway):
    """`--json-whitespace N` (serve.json_whitespace) reaches the grammar: pushed toward whitespace, the
    same request gets gaps of at most N characters; a negative value is a config error naming the key."""
    g = make_gateway(serve__json_whitespace="3")
    push = {str(i): 30 for i in _whitespace_ids(g.gw.tok)}
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "strict": True, "schema": SCHEMA}}
    r = g.client().chat.completions.create(model="m", messages=Q, response_format=rf, max_tokens=200, seed=0,
                                           logit_bias=push)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and valid_answer(json.loads(text)), text
    gaps = re.findall(r"\s+", text)
    assert text != json.dumps(json.loads(text)) and max(map(len, gaps)) <= 3, text
    from clawloop.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="serve.json_whitespace"):
        load_config({"serve__json_whitespace": "-1"}, env={})


def test_json_whitespace_option_allows_pretty_json(engine):
    """`json_whitespace=N` (JSON_WHITESPACE): up to N whitespace characters a gap, for pretty JSON."""
    from clawloop.gateway.constraints import _json_format

    prompt = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    push = {i: 30.0 for i in _whitespace_ids(engine.tokenizer)}
    texts = {}
    for n in (0, 4):
        tag = {"type": "structural_tag", "format": _json_format(SCHEMA, n)}
        evs = _collect(engine, prompt, SamplingParams(max_tokens=200, seed=0, logit_bias=push, constraint=tag))
        texts[n] = engine.tokenizer.decode([e.token_id for e in evs], skip_special_tokens=True)
        assert evs[-1].finish_reason == "stop" and valid_answer(json.loads(texts[n])), texts[n]
    assert texts[0] == json.dumps(json.loads(texts[0]))
    gaps = re.findall(r"\s+", texts[4])
    assert texts[4] != json.dumps(json.loads(texts[4])) and max(map(len, gaps)) <= 4, texts[4]


def test_structured_output_parse_returns_a_validated_object(gateway):
    c = gateway.client()
    for seed in range(3):
        r = c.chat.completions.parse(model="m", messages=Q, response_format=Answer, seed=seed, max_tokens=200)
        assert r.choices[0].finish_reason == "stop"
        ans = r.choices[0].message.parsed
        assert isinstance(ans, Answer), r.choices[0].message.content


def test_json_schema_streamed_and_captured_as_constrained(gateway):
    c = gateway.client()
    rf = {"type": "json_schema", "json_schema": {"name": "thing", "strict": True, "schema": SCHEMA}}
    chunks = list(c.chat.completions.create(model="m", messages=Q, response_format=rf, stream=True, max_tokens=200,
                                            extra_headers={"X-Session-Id": "js"}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert valid_answer(json.loads(text))
    assert list(json.loads(text)) == list(SCHEMA["properties"])  # written in the schema's order
    gateway.store.flush()
    (turn,) = gateway.store.session_turns("js")
    assert turn.sampling["logprobs"] == "constrained"
    assert turn.sampling["constraint"]["response_format"] == "json_schema"


def test_json_object_is_an_object(gateway):
    c = gateway.client()
    # Without a schema the random model would write keys forever; a bias toward closing keeps it short,
    # and the grammar still decides what is valid at every step.
    close = {str(i): 30 for i in gateway.gw.tok.convert_tokens_to_ids(['"', "}"]) if i is not None}
    r = c.chat.completions.create(model="m", messages=Q, response_format={"type": "json_object"}, max_tokens=60,
                                  logit_bias=close, seed=0)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_bad_schema_is_a_400_naming_the_parameter(gateway):
    c = gateway.client()
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=Q, response_format=rf)
    assert e.value.body["param"] == "response_format.json_schema.schema"
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=Q, tools=[ADD, bad_tool])
    assert e.value.body["param"] == "tools[1].function.parameters"


def _args_ok(call) -> bool:
    args = json.loads(call.function.arguments)
    if call.function.name == "add":
        return set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    return call.function.name == "now" and args == {}


def test_tool_choice_required_gives_valid_calls_only_to_offered_tools(gateway):
    c = gateway.client()
    for seed in range(3):
        r = c.chat.completions.create(model="m", messages=Q, tools=[ADD, NOW], tool_choice="required", seed=seed,
                                      max_tokens=120, parallel_tool_calls=False)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert len(ch.message.tool_calls) == 1  # parallel_tool_calls: false ends the reply after one call
        assert _args_ok(ch.message.tool_calls[0])


def test_named_tool_choice_calls_that_tool(gateway):
    c = gateway.client()
    r = c.chat.completions.create(model="m", messages=Q, tools=[ADD, NOW], max_tokens=200,
                                  tool_choice={"type": "function", "function": {"name": "add"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add" and _args_ok(call)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=Q, tools=[ADD],
                                  tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_auto_tool_call_once_triggered_is_valid_and_streams_its_arguments(gateway):
    """`auto` leaves the model free until it opens a call (forced here with logit_bias on the
    `<tool_call>` token); from there the call must be valid."""
    c = gateway.client()
    trigger = gateway.gw.tok.convert_tokens_to_ids("<tool_call>")
    chunks = list(c.chat.completions.create(model="m", messages=Q, tools=[ADD], max_tokens=120, stream=True,
                                            logit_bias={str(trigger): 100}, seed=1, parallel_tool_calls=False))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "add" and deltas[0].id
    assert len(deltas) > 2  # arguments arrive in pieces
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    assert set(args) == {"a", "b"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_unconstrained_calls_when_switched_off(make_gateway):
    """--no-constrain-tool-calls: the forced trigger opens a call the random model cannot write."""
    g = make_gateway(serve__constrain_tool_calls=False)
    trigger = g.gw.tok.convert_tokens_to_ids("<tool_call>")
    r = g.client().chat.completions.create(model="m", messages=Q, tools=[ADD], max_tokens=30, seed=1,
                                           logit_bias={str(trigger): 100})
    assert not r.choices[0].message.tool_calls


def test_logit_bias_and_penalties_shape_sampling(gateway):
    c = gateway.client()
    seven = gateway.gw.tok.convert_tokens_to_ids("7")
    r = c.chat.completions.create(model="m", messages=Q, max_tokens=6, temperature=1.0, seed=0,
                                  logit_bias={str(seven): 100})
    assert r.choices[0].message.content == "777777"
    greedy = dict(model="m", messages=Q, max_tokens=24, temperature=0, logprobs=True)
    plain = c.chat.completions.create(**greedy)
    pen = c.chat.completions.create(**greedy, frequency_penalty=2.0)
    pres = c.chat.completions.create(**greedy, presence_penalty=2.0)

    def distinct(r):
        toks = [e.token for e in r.choices[0].logprobs.content]
        return len(set(toks)) / len(toks)
    assert distinct(pen) > distinct(plain) and distinct(pres) > distinct(plain)
    # logprobs stay the model's own: penalties change what is sampled, not what is reported
    assert plain.choices[0].logprobs.content[0].logprob == pytest.approx(pen.choices[0].logprobs.content[0].logprob)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=Q, logit_bias={"99999999": 5})
    assert e.value.body["param"] == "logit_bias"


def test_min_tokens_holds_the_end_back(gateway):
    """vLLM's `min_tokens` (extra_body): with the end token pushed to near certainty by logit_bias, a reply
    ends at once; with min_tokens 5 not before 5 tokens (the stop ids are masked for sampling only: the
    logprobs stay the model's, and the captured turn says how it was sampled)."""
    c = gateway.client()
    end = gateway.gw.tok.convert_tokens_to_ids("<|im_end|>")
    ask = dict(model="m", messages=Q, max_tokens=12, temperature=1.0, seed=3, logit_bias={str(end): 100},
               logprobs=True, extra_headers={"X-Session-Id": "mt"})
    assert c.chat.completions.create(**ask).usage.completion_tokens == 1
    r = c.chat.completions.create(**{**ask, "extra_headers": {"X-Session-Id": "mt2"}}, extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens >= 5 and r.choices[0].finish_reason in ("stop", "length")
    assert all(e.logprob < 0 for e in r.choices[0].logprobs.content)
    gateway.store.flush()
    (t,) = gateway.store.session_turns("mt2")
    assert t.sampling["min_tokens"] == 5 and len(t.response_ids) >= 5
    for bad in (-1, 13, "5"):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", messages=Q, max_tokens=12, extra_body={"min_tokens": bad})
        assert e.value.body["param"] == "min_tokens"


@pytest.mark.parametrize("param,value", [
    ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}),
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("reasoning_effort", "high"),
    ("verbosity", "low"), ("service_tier", "flex")])
def test_unsupported_parameters_are_refused_by_name(gateway, param, value):
    with pytest.raises(openai.BadRequestError) as e:
        gateway.client().chat.completions.create(model="m", messages=Q, max_tokens=2, extra_body={param: value})
    assert e.value.body["param"] == param and param in e.value.body["message"]


def test_store_false_is_not_captured_and_metadata_is(gateway):
    c = gateway.client()
    c.chat.completions.create(model="m", messages=Q, max_tokens=2, store=False, extra_headers={"X-Session-Id": "s1"})
    c.chat.completions.create(model="m", messages=Q, max_tokens=2, metadata={"app": "t"},
                              extra_headers={"X-Session-Id": "s2"})
    gateway.store.flush()
    assert gateway.store.session_turns("s1") == []
    (t,) = gateway.store.session_turns("s2")
    assert t.sampling["client"]["metadata"] == {"app": "t"}


def test_tool_messages_must_answer_the_calls_made(gateway):
    c = gateway.client()
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    ok = Q + [call, {"role": "tool", "tool_call_id": "call_a", "content": "3"}]
    c.chat.completions.create(model="m", messages=ok, tools=[ADD], max_tokens=2)
    for msgs, param in [
        (Q + [call, {"role": "tool", "tool_call_id": "call_zzz", "content": "3"}], "messages[2].tool_call_id"),
        (Q + [call, {"role": "user", "content": "and?"}], "messages[1].tool_calls"),
        (Q + [call, {"role": "tool", "content": "3"}], "messages[2].tool_call_id"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", messages=msgs, tools=[ADD], max_tokens=2)
        assert e.value.body["param"] == param, e.value.body


def test_a_call_cut_by_max_tokens_is_the_same_streamed_or_not(make_gateway):
    """A reply that runs out of tokens inside a call: finish_reason `length`, the partial call as a tool
    call (as OpenAI reports it), no markup left in the content — identically with and without stream.
    (Closing in time is off here: it would end this call.)"""
    c = make_gateway(serve__close_json_tokens="0").client()
    kw = dict(model="m", messages=Q, tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}},
              max_tokens=20, seed=5, temperature=1.0)
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    (call,) = ch.message.tool_calls
    assert call.function.name == "add" and "<tool_call>" not in (ch.message.content or "")
    chunks = list(c.chat.completions.create(**kw, stream=True))
    deltas = [tc for x in chunks if x.choices for tc in (x.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "add"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [x.choices[0].finish_reason for x in chunks if x.choices][-1] == "length"


FREE = {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}, "t": {"type": "string"}},
        "required": ["s", "n", "t"], "additionalProperties": False}


def test_json_anchors_and_inside_json():
    """Where JSON starts (a tool tag's begin, the output's start, after a reasoning block) and whether
    the output so far ends inside an open string, object or array."""
    from clawloop.engines.grammar import inside_json, json_anchors
    from clawloop.gateway.constraints import _json_format, after_reasoning, tool_tag
    from clawloop.gateway.parsers import select_parsers

    rf = {"type": "structural_tag", "format": _json_format(FREE)}
    assert json_anchors(rf) == ("",)
    assert inside_json('{"s": "abc', ("",)) == inside_json('{"s": "a\\"b}', ("",)) == "string"
    assert inside_json('{"s": "a", "n": 12', ("",)) == inside_json('[1, [2', ("",)) == "container"
    assert inside_json('{"s": "a}", "n": 1, "t": ""}', ("",)) is None and inside_json("", ("",)) is None
    assert inside_json("Sure: {", ("",)) is None, "free text is not JSON"
    call = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"],
                                                 "tags": [tool_tag(ADD)], "at_least_one": False}}
    (begin,) = json_anchors(call)
    assert begin.startswith("<tool_call>") and begin.endswith('"arguments": ')
    assert inside_json("I will add {them", (begin,)) is None, "no call started yet"
    assert inside_json("ok " + begin + '{"a": 1', (begin,)) == "container"
    assert inside_json("ok " + begin + '{"a": 1, "b": 2}}\n</tool_call>', (begin,)) is None
    reasoning, _ = select_parsers("qwen3", "hermes", None)
    thinking = after_reasoning(rf, reasoning, True)
    anchors = json_anchors(thinking)
    assert set(anchors) == {"", reasoning.end}
    assert inside_json("let me think {", anchors) is None
    assert inside_json('hm</think>\n\n{"s": "x', anchors) == "string"


def test_json_closes_within_max_tokens(engine):
    """A weak model under a grammar writes string characters until max_tokens (issue #28: LangChain
    got nothing). With close_within, the last tokens of the budget close the open JSON — the likeliest
    allowed `"`/`}`/`]`, else a `,` on to a required member — and the reply ends valid, within the
    budget; off, the same seeds are cut. The logprobs stay those of the constrained distribution."""
    from clawloop.gateway.constraints import _json_format

    tag = {"type": "structural_tag", "format": _json_format(FREE)}
    prompt = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    before = engine.grammars().closed_tokens
    cut = 0
    for seed in range(4):
        for close in (0, 24):
            evs = _collect(engine, prompt, SamplingParams(max_tokens=40, seed=seed, constraint=tag, close_within=close))
            text = engine.tokenizer.decode([e.token_id for e in evs], skip_special_tokens=True)
            assert len(evs) <= 40
            if close:
                assert evs[-1].finish_reason == "stop", text
                obj = json.loads(text)
                assert set(obj) == {"s", "n", "t"} and isinstance(obj["n"], int), text
            else:
                cut += evs[-1].finish_reason == "length"
    assert cut >= 3, "a random model left alone writes strings past 40 tokens"
    assert engine.grammars().closed_tokens > before
    assert engine.stats()["engine/json_closing_tokens"] == engine.grammars().closed_tokens


def test_serve_close_json_tokens_reaches_the_engine(make_gateway):
    """`--close-json-tokens` (serve.close_json_tokens, default 32): a structured reply ends valid within
    max_tokens=48; 0 leaves it to the model (cut); a negative value is a config error naming the key."""
    rf = {"type": "json_schema", "json_schema": {"name": "free", "strict": True, "schema": FREE}}
    finishes = {}
    for n in ("32", "0"):
        c = make_gateway(serve__close_json_tokens=n).client()
        rs = [c.chat.completions.create(model="m", messages=Q, response_format=rf, max_tokens=48, seed=s)
              for s in range(3)]
        finishes[n] = [r.choices[0].finish_reason for r in rs]
        if n == "32":
            for r in rs:
                assert set(json.loads(r.choices[0].message.content)) == {"s", "n", "t"}
    assert finishes == {"32": ["stop"] * 3, "0": ["length"] * 3}, finishes
    from clawloop.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="serve.close_json_tokens"):
        load_config({"serve__close_json_tokens": "-1"}, env={})
