"""Thinking models and tool parsers end to end on tiny random models of each family (tinymodel/families.py):
Qwen3 (thinking: the prompt opens `<think>`), Qwen3-MoE (hybrid: the model opens it), Llama 3 (JSON calls)
and Mistral (`[TOOL_CALLS]`), each served through a real gateway with its parsers picked `auto` from its
chat template, captured, judged by the offline judge, trained one step and published — token-exact.

A random model writes noise, so the call comes from constrained decoding (a named `tool_choice`: the
family's call format is the grammar) and the thinking from the model's own sampling, with a logit bias
on the end marker (a request parameter) so the reasoning ends within a few tokens. Every id the client
and the store see is one the engine sampled; nothing is teacher-forced.

Run by `make test-families` (marker `families`, about a minute on 2 cores), not by `make test`.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from clawloop.records import Sample
from conftest import Gateway, make_cfg

pytestmark = pytest.mark.families

ADD = {"type": "function", "function": {"name": "add", "description": "Add two digits.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}}
ASK = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2+3?"}]
EXPECT = {"qwen3": ("qwen3", "hermes", True), "qwen3_moe": ("qwen3", "hermes", False),
          "llama": (None, "llama3_json", None), "mistral": (None, "mistral", None)}
"""family -> (reasoning parser, tool parser, whether the output starts inside the reasoning)."""
REPLY = {True: "Thanks, that is right!", False: "No, that is wrong."}
"""The user's last words in the session that kept its reasoning / dropped it: a +1 and a -1 for the judge,
so the rewards the trainer centres are not all the same."""


@pytest.fixture(scope="module", params=list(EXPECT))
def fam(request, tmp_path_factory):
    from clawloop.engines.hf import HFEngine
    from clawloop.tinymodel.families import build_family_model

    path = build_family_model(request.param, tmp_path_factory.mktemp(request.param) / "model")
    eng = HFEngine(path, device="cpu", dtype="float32", max_batch_size=8, max_model_len=2048)
    asyncio.run(eng.start())
    yield request.param, path, eng
    asyncio.run(eng.stop())


def bias(tok, family: str) -> dict[str, float]:
    """Shorten a random model's thinking: the end marker favoured (and, hybrid, the start at first); the
    family's call marker favoured where the grammar could also spell it out."""
    v = tok.get_vocab()
    if family == "qwen3":
        return {str(v["</think>"]): 6.0}
    if family == "qwen3_moe":
        return {str(v["<think>"]): 7.0, str(v["</think>"]): 7.0}
    if family == "mistral":  # the grammar takes `[TOOL_CALLS]` as the token or spelt out; Mistral writes the token
        return {str(v["[TOOL_CALLS]"]): 8.0}
    return {}


def ask(client, family, tok, messages, seed=11, **kw):
    return client.chat.completions.create(
        model="m", messages=messages, tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=60, temperature=1.0, seed=seed, logit_bias=bias(tok, family) or None,
        extra_body={"return_token_ids": True}, **kw)


def test_thinking_and_tool_calls_serve_capture_judge_train_publish(fam, tmp_path):
    from clawloop.gateway.render import render_prompt
    from clawloop.judge.loop import JudgeLoop, make_judge
    from clawloop.trainer import Trainer, TrainerLoop

    family, path, engine = fam
    tok = engine.tokenizer
    want_reasoning, want_tools, inside = EXPECT[family]
    g = Gateway(engine, path, tmp_path / "data")
    try:
        gw = g.gw
        assert (getattr(gw.reasoning_parser, "name", None), gw.tool_parser.name) == (want_reasoning, want_tools)
        c = g.client()

        # -- serve: the reasoning split off, the call parsed after it -------------------------
        r = ask(c, family, tok, ASK)
        ch = r.choices[0]
        (call,) = ch.message.tool_calls
        assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a", "b"}
        assert ch.finish_reason == "tool_calls"
        reasoning = (ch.message.model_extra or {}).get("reasoning_content")
        details = r.usage.completion_tokens_details  # how many ids were reasoning, `</think>` included
        if want_reasoning:
            end = tok.convert_tokens_to_ids("</think>")
            assert details.reasoning_tokens == ch.model_extra["token_ids"].index(end) + 1
        else:
            assert details is None
        ids = ch.model_extra["token_ids"]
        text = tok.decode(ids, skip_special_tokens=False)
        if want_reasoning:
            assert reasoning is not None and "</think>" in text
            assert "<tool_call>" not in (ch.message.content or "") and "</think>" not in reasoning
        else:
            assert reasoning is None
        if family == "mistral":
            assert ids[0] == tok.convert_tokens_to_ids("[TOOL_CALLS]") and len(call.id) == 9 and call.id.isalnum()

        # the same request streamed (a side turn: it does not join the conversation) gives the same ids,
        # the reasoning as reasoning deltas and the call as tool-call deltas
        chunks = list(ask(c, family, tok, ASK, stream=True, extra_headers={"X-Turn-Type": "side"}))
        s_ids = [i for x in chunks if x.choices for i in (x.choices[0].model_extra or {}).get("token_ids") or []]
        assert s_ids == ids
        deltas = [x.choices[0].delta for x in chunks if x.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == (reasoning or "")
        tcs = [t for d in deltas for t in d.tool_calls or []]
        assert tcs[0].function.name == "add"
        assert "".join(t.function.arguments or "" for t in tcs) == call.function.arguments

        # -- the conversation goes on; the client keeps its earlier reasoning in one session, drops it in another
        sessions = {}
        for keep in (True, False):
            assistant = {"role": "assistant", "content": ch.message.content,
                         "tool_calls": [{"id": call.id, "type": "function",
                                         "function": {"name": "add", "arguments": call.function.arguments}}]}
            if keep and reasoning is not None:
                assistant["reasoning_content"] = reasoning
            history = ASK + [assistant, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
            if keep is False:
                r = ask(c, family, tok, ASK, seed=12)  # this session's own first answer
                ch2 = r.choices[0]
                call2 = ch2.message.tool_calls[0]
                assistant = {"role": "assistant", "content": ch2.message.content, "tool_calls": [
                    {"id": call2.id, "type": "function",
                     "function": {"name": "add", "arguments": call2.function.arguments}}]}
                history = ASK + [assistant, {"role": "tool", "tool_call_id": call2.id, "content": "5"}]
            r2 = c.chat.completions.create(model="m", messages=history, max_tokens=6, temperature=1.0, seed=3)
            a2 = r2.choices[0].message
            history += [{"role": "assistant", "content": a2.content or ""},
                        {"role": "user", "content": REPLY[keep]}]
            r3 = httpx.post(g.url + "/v1/chat/completions", headers={"X-Session-Done": "1"}, timeout=60,
                            json={"model": "m", "messages": history, "max_tokens": 4, "seed": 4})
            assert r3.status_code == 200, r3.text
            sessions[keep] = history
        # the first answer of the first session had its twin (stream) stored as a side turn
        store = g.store
        store.flush()
        convs = [turns for _, turns in store.iter_sessions() if turns[0].type == "main"]
        assert len(convs) == 2, [[(t.type, t.index) for t in ts] for ts in convs]
        convs.sort(key=lambda ts: ts[0].response_ids != ids)  # the session that kept its reasoning first
        for turns in convs:
            first, second, last = turns
            # linked by the history whether the reasoning came back or not
            assert first.next_state == {"role": "tool", "content": "5"}
            assert second.next_state["role"] == "user" and last.final
            # token-exact: the prompt is the template's rendering, the response the sampled ids
            assert first.prompt_ids == render_prompt(tok, first.messages, first.tools)
            assert len(first.response_logprobs) == len(first.response_ids)
            if want_reasoning:
                end_id = tok.convert_tokens_to_ids("</think>")
                assert first.reasoning_end is not None and first.response_ids[first.reasoning_end - 1] == end_id
                assert first.reasoning == reasoning if turns is convs[0] else first.reasoning is not None
                if not inside:
                    assert first.response_ids[0] == tok.convert_tokens_to_ids("<think>")
            else:
                assert first.reasoning is None and first.reasoning_end is None
        assert convs[0][0].response_ids == ids
        # the one kept its reasoning: the template rendered it into the next prompt (Qwen3 keeps it after the
        # last user message), the one dropped: not
        if want_reasoning:
            kept, dropped = (decode := lambda t: tok.decode(t.prompt_ids, skip_special_tokens=False))(convs[0][1]), \
                decode(convs[1][1])
            assert reasoning.strip("\n") in kept and kept.count("</think>") == 1 and dropped.count("</think>") == 0

        # -- judge (offline) and train one step on the whole sampled responses, then publish --------
        # baseline none: a handful of live turns would centre to nothing (their rewards are the baseline)
        cfg = make_cfg(path, tmp_path / "data", train__method="binary", train__rollout_batch_size="2",
                       train__lr="1e-3", train__baseline="none")
        judge = make_judge(cfg)
        loop = JudgeLoop(store, judge, cfg.judge)
        tids = [t.id for ts in convs for t in ts]

        async def judge_all():
            stop = asyncio.Event()
            task = asyncio.create_task(loop.run(stop))
            while any(store.get_judgement(t, judge.name) is None for t in tids):
                await asyncio.sleep(0.02)
            stop.set()
            await task

        asyncio.run(asyncio.wait_for(judge_all(), 60))
        scores = {t: store.get_judgement(t, judge.name).score for t in tids}
        assert (scores[convs[0][1].id], scores[convs[1][1].id]) == (1, -1), scores
        sample = Sample.from_turn(convs[0][0], store.get_judgement(convs[0][0].id, judge.name))
        assert sample.tokens == convs[0][0].prompt_ids + ids and sum(sample.loss_mask) == len(ids)  # thinking too
        trainer = Trainer(cfg, str(path))
        before = {k: v.clone() for k, v in engine.state_dict().items()}
        v0 = engine.policy_version
        tl = TrainerLoop(cfg, trainer, store, engine, judge.name)
        assert tl.run_once() is True
        assert engine.policy_version == v0 + 1
        after = engine.state_dict()
        assert any(float((after[k] - before[k]).abs().sum()) > 0 for k in before)
        assert trainer.last["train/tokens"] > 0 if "train/tokens" in trainer.last else True
        r = ask(c, family, tok, ASK)
        assert r.system_fingerprint == f"clawloop-v{v0 + 1}" and r.choices[0].message.tool_calls
    finally:
        g.stop()


def test_responses_and_messages_reasoning(fam, tmp_path):
    """The Responses and Messages APIs on the same models: the reasoning is a `reasoning` output item /
    a `thinking` block before the call (streamed as `response.reasoning_text.delta` / `thinking_delta`),
    and one sent back in the history reaches the template."""
    family, path, engine = fam
    want_reasoning = EXPECT[family][0]
    g = Gateway(engine, path, tmp_path / "data")
    try:
        tool = {"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}
        body = {"model": "m", "input": "What is 2+3?", "tools": [tool], "max_output_tokens": 40,
                "tool_choice": {"type": "function", "name": "add"}, "temperature": 1.0}
        r = httpx.post(g.url + "/v1/responses", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()["output"]
        kinds = [o["type"] for o in out]
        g.store.flush()
        (turn,) = [t for _, ts in g.store.iter_sessions() for t in ts]
        assert (turn.reasoning is not None) == bool(want_reasoning and (EXPECT[family][2] or kinds[0] == "reasoning"))
        if turn.reasoning:
            assert kinds[0] == "reasoning" and out[0]["content"][0]["text"] == turn.reasoning
        else:
            assert "reasoning" not in kinds
        with httpx.stream("POST", g.url + "/v1/responses", json={**body, "stream": True}, timeout=60) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        final = events[-1]["response"]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        items = [o for o in final["output"] if o["type"] == "reasoning"]
        assert deltas == (items[0]["content"][0]["text"] if items else "")
        # a reasoning item sent back is given to the assistant turn after it, for the template to render
        if want_reasoning:
            inp = [{"type": "message", "role": "user", "content": "What is 2+3?"},
                   {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "add 2 and 3"}]},
                   {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
                   {"type": "function_call_output", "call_id": "c1", "output": "5"}]
            r = httpx.post(g.url + "/v1/responses", json={"model": "m", "input": inp, "max_output_tokens": 4},
                           timeout=60)
            assert r.status_code == 200, r.text
            g.store.flush()
            last = max((t for _, ts in g.store.iter_sessions() for t in ts), key=lambda t: t.created_at)
            assert "<think>\nadd 2 and 3\n</think>" in engine.tokenizer.decode(last.prompt_ids)

        # Anthropic Messages: a thinking block first, the same thinking streamed as thinking_delta events
        m = {"model": "m", "max_tokens": 40, "seed": 5, "messages": [{"role": "user", "content": "What is 2+3?"}],
             "tools": [{"name": "add", "input_schema": ADD["function"]["parameters"]}],
             "tool_choice": {"type": "tool", "name": "add"}}
        r = httpx.post(g.url + "/v1/messages", json=m, timeout=60)
        assert r.status_code == 200, r.text
        blocks = r.json()["content"]
        thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
        assert (blocks[0]["type"] == "thinking") == bool(thinking)  # (no logit bias here: it may think to the end)
        assert bool(thinking) <= bool(want_reasoning)
        with httpx.stream("POST", g.url + "/v1/messages", json={**m, "stream": True}, timeout=60) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        streamed = "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                           and e["delta"]["type"] == "thinking_delta")
        assert streamed == "".join(thinking)
        if want_reasoning:
            hist = [{"role": "user", "content": "What is 2+3?"},
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "add 2 and 3", "signature": ""},
                                                      {"type": "tool_use", "id": "c1", "name": "add",
                                                       "input": {"a": 2, "b": 3}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "5"}]}]
            r = httpx.post(g.url + "/v1/messages", json={"model": "m", "max_tokens": 4, "messages": hist}, timeout=60)
            assert r.status_code == 200, r.text
            g.store.flush()
            last = max((t for _, ts in g.store.iter_sessions() for t in ts), key=lambda t: t.created_at)
            assert "<think>\nadd 2 and 3\n</think>" in engine.tokenizer.decode(last.prompt_ids)
    finally:
        g.stop()
