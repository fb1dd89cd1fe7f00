"""Tool calls round trip through the official client: a small model taught
(in seconds, here) to call `calculator` emits `<tool_call>`, the gateway
returns it as `tool_calls` (streamed and not), the client sends the tool
result back, and capture links it as the next state."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from conftest import Gateway

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
Q = [{"role": "user", "content": "What is 12+7?"}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "12+7"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "19"}
FINAL = {"role": "assistant", "content": "The answer is 19."}


@pytest.fixture(scope="module")
def tool_model_dir(random_model_dir, tmp_path_factory):
    """The random model, overfit on one tool-using conversation (full sequence loss)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    convs = [Q + [CALL], Q + [CALL, RESULT, FINAL]]
    seqs = [tok.apply_chat_template(c, tools=TOOLS, tokenize=False) for c in convs]
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        for text in seqs:
            ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    out = tmp_path_factory.mktemp("tool-model") / "m"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tool_gateway(tool_model_dir, tmp_path_factory):
    from clawloop.engines.hf import HFEngine

    eng = HFEngine(tool_model_dir, device="cpu", dtype="float32")
    asyncio.run(eng.start())
    g = Gateway(eng, tool_model_dir, tmp_path_factory.mktemp("tool-data"))
    yield g
    g.stop()
    asyncio.run(eng.stop())


def test_tool_call_round_trip(tool_gateway):
    g = tool_gateway
    c = g.client()
    h = {"X-Session-Id": "tools"}
    r = c.chat.completions.create(model="m", messages=Q, tools=TOOLS, temperature=0, max_tokens=40, extra_headers=h)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "12+7"}
    assert not ch.message.content

    # send the call and its result back, as an agent loop does
    msgs = Q + [ch.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "19"}]
    r2 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0, max_tokens=20,
                                   extra_headers=h)
    assert r2.choices[0].message.content == "The answer is 19."
    assert r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls

    g.store.flush()
    t = g.store.session_turns("tools")
    assert t[0].tool_calls[0]["function"]["name"] == "calculator"
    assert t[0].next_state == {"role": "tool", "content": "19"}
    assert t[0].tools == TOOLS
    # token-exact: the tool-call markup is in the captured ids
    assert "<tool_call>" in g.gw.tok.decode(t[0].response_ids)


def test_tool_call_streamed(tool_gateway):
    c = tool_gateway.client()
    chunks = list(c.chat.completions.create(model="m", messages=Q, tools=TOOLS, temperature=0, max_tokens=40,
                                            stream=True))
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    # OpenAI's shape: the first delta has the id, type and name; the arguments follow in pieces
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "calculator"
    assert all(tc.index == 0 for tc in calls) and all(tc.id is None for tc in calls[1:])
    assert len(calls) > 2, "arguments arrive as they are generated, not in one piece at the end"
    args = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(args) == {"expression": "12+7"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "<tool_call>" not in text


def test_tool_choice_none_gives_text(tool_gateway):
    c = tool_gateway.client()
    r = c.chat.completions.create(model="m", messages=Q, tools=TOOLS, tool_choice="none", temperature=0,
                                  max_tokens=40)
    assert r.choices[0].finish_reason != "tool_calls" and not r.choices[0].message.tool_calls
