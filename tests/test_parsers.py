"""The reasoning and tool-call parsers (gateway/parsers/) on hand-written replies of each family, whole
and streamed split at every character boundary (and one character at a time): the stream's reasoning,
content and tool calls add up to exactly what the whole reply gives, and nothing it sent is taken back.
The pipeline is the gateway's own: `TextStream` (reasoning split, stop strings, hold-back), `ToolStream`
and `finish_text`, as chat.py runs them."""

from __future__ import annotations

import json

import pytest

from clawloop.gateway.parsers import (QWEN3, HermesToolParser, Llama3JsonToolParser, MistralToolParser, ReasoningSplit,
                                      ToolStream, detect_reasoning, detect_tools, select_parsers)
from clawloop.gateway.render import TextStream, finish_text


def run(pieces, tools=None, reasoning=None, inside=False, stop=()):
    """Feed `pieces` as a stream; (reasoning, content as streamed, calls from the deltas, the final
    content, the final calls)."""
    split = ReasoningSplit(reasoning, inside) if reasoning is not None else None
    text = TextStream(list(stop), tools, split)
    stream = ToolStream(tools) if tools is not None else None
    r, shown, deltas = "", "", []
    for i, p in enumerate(pieces):
        shown += text.feed(p, final=i == len(pieces) - 1)
        r += text.take_reasoning()
        if stream is not None and text.in_tool:
            deltas += stream.feed(text.text[text.tool_start:])
    tail, content, calls, owed = finish_text(text, stream)
    shown += tail
    r += text.take_reasoning()
    deltas += owed
    assembled: dict[int, dict] = {}
    for d in deltas:
        c = assembled.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
        if "id" in d:
            assert c["id"] is None, "a call's id is sent once"
            c["id"], c["name"] = d["id"], d["function"]["name"]
        c["arguments"] += d["function"].get("arguments") or ""
    streamed = [assembled[k] for k in sorted(assembled)]
    assert r == text.reasoning
    return r, shown, streamed, content, calls


def check_every_split(text, tools=None, reasoning=None, inside=False, stop=()):
    """The whole reply, then the same reply split at every boundary and char by char: all agree."""
    whole = run([text], tools, reasoning, inside, stop)
    r, shown, _, content, calls = whole
    want_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    splits = [[text[:k], text[k:]] for k in range(1, len(text))] + [list(text)]
    for pieces in splits:
        r2, shown2, streamed, content2, calls2 = run(pieces, tools, reasoning, inside, stop)
        assert r2 == r, pieces
        assert (content2 or "") == (content or ""), pieces
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls2] == want_calls, pieces
        assert [(c["name"], c["arguments"]) for c in streamed] == want_calls, pieces
        assert [c["id"] for c in streamed] == [c["id"] for c in calls2]
        assert shown2.strip() == (content2 or "").strip(), pieces
    return whole


ADD = '{"name": "add", "arguments": {"a": 1, "b": "x}y"}}'


# -- Qwen3 / Hermes -------------------------------------------------------------------------
def test_qwen3_thinking_then_tool_call_starting_inside():
    """Qwen3-Thinking: the prompt opened `<think>`; the output closes it, then calls."""
    text = f"Let me add.\n</think>\n\nI will call it.\n<tool_call>\n{ADD}\n</tool_call>"
    r, _, _, content, calls = check_every_split(text, HermesToolParser(), QWEN3, inside=True)
    assert r == "Let me add.\n" and content == "I will call it."
    assert [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1, "b": "x}y"}'}]


def test_qwen3_hybrid_opens_its_own_think_and_two_calls():
    text = f"<think>\nhmm <tool_call> is how I call\n</think>\n\n<tool_call>\n{ADD}\n</tool_call>\n" \
           '<tool_call>\n{"name": "neg", "arguments": {"x": -2}}\n</tool_call>'
    r, _, _, content, calls = check_every_split(text, HermesToolParser(), QWEN3, inside=False)
    assert r == "\nhmm <tool_call> is how I call\n", "a call's tag inside the reasoning is reasoning"
    assert content is None and [c["function"]["name"] for c in calls] == ["add", "neg"]


def test_qwen3_no_thinking_and_unfinished_thinking():
    r, _, _, content, calls = check_every_split("Just 19.", HermesToolParser(), QWEN3, inside=False)
    assert (r, content, calls) == ("", "Just 19.", [])
    r, _, _, content, _ = check_every_split("still thinking about </thi", None, QWEN3, inside=True)
    assert r == "still thinking about </thi" and content == ""


def test_hermes_other_key_order_and_broken_blocks_stay_content():
    text = ('Sure.<tool_call>\n{"arguments": {"a": 2}, "name": "add"}\n</tool_call>'
            '<tool_call>not json</tool_call> done')
    _, _, _, content, calls = check_every_split(text, HermesToolParser())
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert content == "Sure.<tool_call>not json</tool_call> done"


def test_hermes_call_cut_short_is_still_a_call():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b'
    _, _, streamed, content, calls = check_every_split(text, HermesToolParser())
    assert content is None and calls[0]["function"] == {"name": "add", "arguments": '{"a": 1, "b'}


def test_stop_strings_apply_to_the_content_not_the_reasoning():
    r, _, _, content, _ = check_every_split("a STOP b</think>\n\nanswer STOP more", None, QWEN3, inside=True,
                                            stop=["STOP"])
    assert r == "a STOP b" and content == "answer "


# -- Llama 3 JSON ------------------------------------------------------------------------
def test_llama3_json_calls_joined_by_semicolons():
    text = '{"name": "add", "parameters": {"a": 1}}; {"name": "neg", "parameters": {"x": 2}}'
    _, _, _, content, calls = check_every_split(text, Llama3JsonToolParser())
    assert content is None
    assert [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1}'},
                                              {"name": "neg", "arguments": '{"x": 2}'}]


def test_llama3_python_tag_and_plain_text():
    _, _, _, content, calls = check_every_split('<|python_tag|>{"name": "add", "parameters": {}}',
                                                Llama3JsonToolParser())
    assert content is None and calls[0]["function"] == {"name": "add", "arguments": "{}"}
    _, _, _, content, calls = check_every_split('The answer is {"a": 1}.', Llama3JsonToolParser())
    assert content == 'The answer is {"a": 1}.' and calls == []
    _, _, _, content, calls = check_every_split('{"a": 1}', Llama3JsonToolParser())
    assert content == '{"a": 1}' and calls == [], "JSON that is not a call is content"


# -- Mistral ---------------------------------------------------------------------------------
def test_mistral_v3_array_form():
    text = 'Let me see. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "neg", "arguments": {}}]'
    _, _, _, content, calls = check_every_split(text, MistralToolParser())
    assert content == "Let me see."
    assert [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1}'},
                                              {"name": "neg", "arguments": "{}"}]


def test_mistral_v11_named_form():
    text = '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]neg[ARGS]{"x": [1, 2]}'
    _, _, _, content, calls = check_every_split(text, MistralToolParser())
    assert content is None
    assert [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1}'},
                                              {"name": "neg", "arguments": '{"x": [1, 2]}'}]


def test_mistral_call_with_an_id_after_its_arguments():
    """Mistral's v0.3 template writes each call's id after its arguments."""
    text = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}, "id": "abcDEF123"}]'
    _, _, _, content, calls = check_every_split(text, MistralToolParser())
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}


# -- selection ---------------------------------------------------------------------------
def test_auto_reads_the_chat_template():
    assert (detect_reasoning("... '<think>\\n' ... '</think>' <tool_call>"), detect_tools("<tool_call>")) == \
           ("qwen3", "hermes")
    assert detect_tools("{{ '[TOOL_CALLS] [' }}") == "mistral"
    assert detect_tools("<|start_header_id|>ipython ... \"parameters\"") == "llama3_json"
    assert detect_reasoning("<|im_start|>") == "none" and detect_tools(None) == "hermes"
    r, t = select_parsers("none", "llama3_json", "</think><tool_call>")
    assert r is None and t.name == "llama3_json"
    with pytest.raises(ValueError, match="unknown tool parser"):
        select_parsers("auto", "pythonic", None)


def test_arguments_are_valid_json_in_every_family():
    for parser, text in [(HermesToolParser(), f"<tool_call>{ADD}</tool_call>"),
                         (Llama3JsonToolParser(), ADD.replace("arguments", "parameters")),
                         (MistralToolParser(), f"[TOOL_CALLS] [{ADD}]")]:
        _, _, _, _, calls = run([text], parser)
        assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": "x}y"}
