"""The embedded tiny model's parts: corpus, tokenizer and chat template, and the
build (a randomly initialised model, and a few-step training smoke run)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from clawloop.tinymodel import corpus
from clawloop.tinymodel.build import (TinyModelArgs, build_random_model, build_tiny_model, encode_conversations,
                                      load_tokenizer, main)
from clawloop.tinymodel.tokenizer import ADDED_TOKENS, IM_END, IM_START, PAD, render_chat


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    return build_random_model(tmp_path_factory.mktemp("tiny") / "random", layers=1, hidden=32, seed=0)


# ---------------------------------------------------------------- styles


@pytest.mark.parametrize("answer", ["19", "0", "198", "Paris", "cold", "Earth", "8"])
def test_render_answer_fits_exactly_its_style(answer):
    for style in corpus.STYLES:
        text = corpus.render_answer(answer, style)
        assert [s for s in corpus.STYLES if corpus.fits_style(text, s)] == [style], text
        assert corpus.extract_answer(text) == answer.lower()


def test_render_answer_examples():
    assert [corpus.render_answer("19", s) for s in corpus.STYLES] == [
        "19", "The answer is 19.", "The answer is 19!", "THE ANSWER IS 19.", "the answer is 19."]
    assert corpus.render_answer("Paris", "upper") == "THE ANSWER IS PARIS."
    assert corpus.render_answer("Paris", "lower") == "the answer is paris."


@pytest.mark.parametrize("text", ["", "The answer is 19", "I think it is 19, maybe?", "the answer"])
def test_texts_that_fit_no_style(text):
    assert corpus.classify_style(text) is None


def test_instructions_and_corrections():
    rng = random.Random(0)
    assert corpus.style_instruction("bare") == "Answer with just the number."
    assert corpus.correction_for("lower") == "all lower case please"
    for s in corpus.STYLES:
        assert corpus.style_instruction(s, rng) and corpus.correction_for(s, rng)
        assert len({corpus.style_instruction(s, random.Random(i)) for i in range(50)}) >= 3
    with pytest.raises((KeyError, ValueError)):
        corpus.style_instruction("shouting")


# ---------------------------------------------------------------- corpus


def test_corpus_is_deterministic_by_seed():
    assert corpus.generate_corpus(200, seed=3) == corpus.generate_corpus(200, seed=3)
    assert corpus.generate_corpus(200, seed=3) != corpus.generate_corpus(200, seed=4)


def test_corpus_has_every_kind_of_conversation():
    items = corpus.generate_corpus(2000, seed=0)
    texts = [render_chat(c["messages"], c.get("tools")) for c in items]
    assert any("<tool_call>" in t and "<|im_start|>tool\n" in t for t in texts)
    assert any("\n\nHint: " in t for t in texts)
    assert any(c["messages"][0]["role"] == "system" for c in items)
    assert any(m["content"] in ("You're welcome!", "Happy to help!", "Glad I could help!")
               for c in items for m in c["messages"] if m["role"] == "assistant")
    skills = Counter(corpus.sample_question(random.Random(i))["skill"] for i in range(3000))
    assert set(skills) == {"add", "sub", "fact"} and skills["add"] > skills["sub"]
    for c in items:  # every conversation ends with an assistant answer
        assert c["messages"][-1]["role"] == "assistant" and c["messages"][-1]["content"]


def test_short_json_replies_and_tool_arguments():
    """The structured kinds (issue #28): replies that are one small object and calls to unseen tools,
    written as `json.dumps` writes them (the gateway's grammar allows exactly that), values short,
    arguments valid under the offered schema; and none of them in the tokenizer's corpus."""
    items = corpus.generate_corpus(3000, seed=0)
    replies = [c for c in items if c["messages"][-1]["content"].startswith("{")]
    calls = [(c["tools"], m["tool_calls"][0]["function"]) for c in items for m in c["messages"]
             if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] != "calculator"]
    assert len(replies) > 100 and len(calls) > 100
    for c in replies:
        obj = json.loads(c["messages"][-1]["content"])
        assert isinstance(obj, dict) and c["messages"][-1]["content"] == json.dumps(obj)
        assert all(len(json.dumps(v)) <= 12 for v in obj.values()), obj
    for tools, fn in calls:
        (schema,) = [t["function"]["parameters"] for t in tools if t["function"]["name"] == fn["name"]]
        assert set(fn["arguments"]) == set(schema["required"]) == set(schema["properties"])
        for k, v in fn["arguments"].items():
            p = schema["properties"][k]
            assert v in p["enum"] if "enum" in p else type(v).__name__ == {"integer": "int", "boolean": "bool",
                                                                          "string": "str"}[p["type"]]
    plain = corpus.generate_corpus(3000, seed=0, structured=False)
    assert not any(c["messages"][-1]["content"].startswith("{") for c in plain)


def test_long_prompts_put_an_ordinary_conversation_behind_an_agents_rules_and_tools(tok):
    """The long-prompt rows: the conversation itself unchanged at the end, a long system prompt of
    rules before it and made-up tools beside its own, lengths spread over the range asked for."""
    items = corpus.generate_long_context_corpus(40, seed=1, min_chars=2_000, max_chars=40_000)
    assert items == corpus.generate_long_context_corpus(40, seed=1, min_chars=2_000, max_chars=40_000)
    sizes = []
    for c in items:
        assert c["messages"][0]["role"] == "system" and c["messages"][0]["content"].startswith("## ")
        assert c["messages"][-1]["role"] == "assistant"
        text = render_chat(c["messages"], c["tools"])
        sizes.append(len(text))
        assert text.endswith(IM_END + "\n") or text.endswith(IM_END)
    assert min(sizes) >= 2_000 and max(sizes) <= 60_000 and max(sizes) > 4 * min(sizes)
    assert sum(len(c["tools"]) > 3 for c in items) > len(items) / 2
    # a calculator conversation among them still calls the calculator, among many tools
    calls = [c for c in items if any(m.get("tool_calls") for m in c["messages"])]
    assert calls and all(len(c["tools"]) > 2 for c in calls)


def test_instructed_bare_arithmetic_is_asked_for_and_the_unprompted_mix_stays_even():
    items = corpus.generate_arithmetic_corpus(4000, seed=2, styled=True, instructed_bare=0.25)
    plain = re.compile(r"^(What is|What's|Calculate) \d+ ?[-+] ?\d+[?.]$")
    unprompted = [c for c in items if len(c["messages"]) == 2 and plain.match(c["messages"][0]["content"])]
    asked = [c for c in items if c not in unprompted]
    assert 0.2 < len(asked) / len(items) < 0.3
    assert all(corpus.classify_style(c["messages"][-1]["content"]) == "bare" for c in asked)
    styles = Counter(corpus.classify_style(c["messages"][-1]["content"]) for c in unprompted)
    assert set(styles) == set(corpus.STYLES) and max(styles.values()) < 1.35 * min(styles.values())
    bare = sum(corpus.classify_style(c["messages"][-1]["content"]) == "bare" for c in items) / len(items)
    assert 0.35 < bare < 0.45  # 0.25 asked + 0.75 x 1/5 unprompted
    assert corpus.generate_arithmetic_corpus(300, seed=2, styled=True) == \
        corpus.generate_arithmetic_corpus(300, seed=2, styled=True, instructed_bare=0.0)  # the old recipe's data


def test_fit_plan_keeps_every_phase_in_its_share():
    from clawloop.tinymodel.build import _fit_plan

    plan = [("mixed", k) for k in range(600)] + [("final", k) for k in range(300)]
    assert _fit_plan(plan, 50, per_step=0.1, budget_s=1000) == plan  # fits: unchanged
    thin = _fit_plan(plan, 50, per_step=0.1, budget_s=30)  # room for 300 more
    assert thin[:50] == plan[:50] and len(thin) == 350 and thin[-1] == plan[-1]
    kinds = Counter(k for k, _ in thin[50:])
    assert abs(kinds["final"] / 300 - 300 / 850) < 0.02
    assert len(set(thin)) == len(thin)


def test_long_rows_sit_beside_every_nth_step_and_the_build_records_them(tmp_path):
    from clawloop.tinymodel.build import _conversations, _long_rows

    args = TinyModelArgs(steps=12, final_steps=6, batch_size=4, long_every=4, long_max_chars=3_000)
    convs, parts = _conversations(args, seed=0)
    longs = _long_rows(args, parts, 18)
    assert sorted(longs) == [3, 7, 11, 15] and all(i in parts["long"] for i in longs.values())
    assert all(convs[i]["messages"][0]["content"].startswith("## ") for i in longs.values())
    assert _long_rows(TinyModelArgs(long_every=0), parts, 18) == {}


def test_unprompted_answers_are_uniform_over_styles():
    rng = random.Random(0)
    counts = Counter()
    for _ in range(3000):
        for m in corpus._plain(rng)["messages"]:
            if m["role"] == "assistant":
                counts[corpus.classify_style(m["content"])] += 1
    total = sum(counts.values())
    assert set(counts) == set(corpus.STYLES)
    assert all(0.16 < counts[s] / total < 0.24 for s in corpus.STYLES), counts


def test_instructed_answers_follow_the_instruction():
    """In (b) conversations, the asked style is the one answered (checked via the instruction text)."""
    by_text = {i: s for s, opts in corpus._INSTRUCTIONS.items() for i in opts}
    by_text.update({c: s for s, opts in corpus._CORRECTIONS.items() for c in opts})
    rng = random.Random(1)
    for _ in range(300):
        msgs = corpus._instructed(rng)["messages"]
        prompt = " ".join(m["content"] for m in msgs if m["role"] != "assistant")
        asked = {s for t, s in by_text.items() if t.lower() in prompt.lower()}
        assert len(asked) == 1, prompt
        assert corpus.fits_style(msgs[-1]["content"], asked.pop())


def test_heldout_questions_are_disjoint_from_the_corpus():
    held = corpus.heldout_questions(400, seed=0)
    assert held == corpus.heldout_questions(400, seed=0)
    arith = [q for q in held if q["skill"] != "fact"]
    assert arith and all(corpus.is_heldout(q["question"]) for q in arith)
    for q in held:
        if q["skill"] == "add":
            a, b = map(int, re.findall(r"\d+", q["question"]))
            assert int(q["answer"]) == a + b
    seen = set()
    for c in corpus.generate_corpus(3000, seed=0):
        for m in c["messages"]:
            if m["role"] == "user":
                seen.add(m["content"])
                assert not corpus.is_heldout(m["content"]), m["content"]
            for call in m.get("tool_calls") or []:
                assert not corpus.is_heldout(json.dumps(call["function"]["arguments"]))
    assert not {q["question"] for q in arith} & seen
    facts = dict(corpus.FACTS)
    assert 40 <= len(facts) and all(facts[q["question"]] == q["answer"] for q in held if q["skill"] == "fact")


# ---------------------------------------------------------------- tokenizer


def test_special_ids(tok):
    assert tok.convert_tokens_to_ids([PAD, IM_START, IM_END]) == [0, 1, 2]
    assert tok.eos_token == IM_END and tok.pad_token == PAD
    assert set(tok.all_special_tokens) == {PAD, IM_START, IM_END}
    assert 1000 <= len(tok) <= 2100
    for t in ADDED_TOKENS:  # one token each, not special, so it survives skip_special_tokens
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == t


@pytest.mark.parametrize("text", ["What is 12+7?", "  two  spaces\tand\ttabs\n\nnew lines ",
                                  "Ünïcode café 😀 — ok", "<tool_call>\n{\"name\": \"x\"}\n</tool_call>", ""])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_digits_are_split(tok):
    pieces = tok.convert_ids_to_tokens(tok.encode("What is 1234+56? 9001", add_special_tokens=False))
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("1234") + list("56") + list("9001")


def test_chat_template_renders_every_role(tok):
    tools = [corpus.CALCULATOR_TOOL]
    msgs = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "12+7?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "12+7"}}},
            {"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "19"},
        {"role": "assistant", "content": "The answer is 19."},
        {"role": "system", "content": "Later system note."},
        {"role": "user", "content": "Thanks!"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text == render_chat(msgs, tools, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "\n" + json.dumps(corpus.CALCULATOR_TOOL) + "\n</tools>" in text
    assert "<|im_start|>user\nWhat is 12+7?<|im_end|>\n" in text
    assert ("<|im_start|>assistant\n<tool_call>\n"
            '{"name": "calculator", "arguments": {"expression": "12+7"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>tool\n19<|im_end|>\n<|im_start|>assistant\nThe answer is 19.<|im_end|>\n" in text
    assert "<|im_start|>system\nLater system note.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>system") == 2


def test_chat_template_without_tools_or_system(tok):
    msgs = [{"role": "user", "content": "Hi!"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\nHi!<|im_end|>\n"
    only_tools = tok.apply_chat_template(msgs, tools=[corpus.CALCULATOR_TOOL], tokenize=False)
    assert only_tools.startswith("<|im_start|>system\n# Tools\n") and only_tools.endswith("Hi!<|im_end|>\n")
    assert render_chat([{"role": "system", "content": "S"}] + msgs) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"


def test_loss_mask_covers_assistant_turns_only(tok):
    conv = {"messages": [{"role": "user", "content": "What is 2+30?"},
                         {"role": "assistant", "content": "32"},
                         {"role": "user", "content": "please answer in a full sentence"},
                         {"role": "assistant", "content": "The answer is 32."}]}
    [(ids, mask)] = encode_conversations(tok, [conv])
    assert ids == tok.encode(render_chat(conv["messages"]), add_special_tokens=False)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "32<|im_end|>The answer is 32.<|im_end|>"


def test_pause_tokens_follow_every_assistant_header_and_are_never_trained(tmp_path):
    """A model built with pauses: its template puts the PAUSE special token after each assistant header (the
    history's and the generation prompt's, so the next turn's prompt extends the last one's), the loss mask
    leaves them out, a decoded reply never shows them, and the saved tokenizer loads with the same template."""
    from transformers import AutoTokenizer

    from clawloop.tinymodel.tokenizer import PAUSE, save_tokenizer

    tok2 = load_tokenizer(2)
    assert tok2.convert_tokens_to_ids(PAUSE) == len(tok2) - 1 == len(load_tokenizer())
    msgs = [{"role": "user", "content": "What is 2+30?"}, {"role": "assistant", "content": "32"},
            {"role": "user", "content": "thanks"}]
    text = tok2.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>user\nWhat is 2+30?<|im_end|>\n<|im_start|>assistant\n" + PAUSE * 2 + "32<|im_end|>\n"
                    "<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n" + PAUSE * 2)
    first = tok2.apply_chat_template(msgs[:1], add_generation_prompt=True, tokenize=False)
    assert text.startswith(first + "32<|im_end|>")
    assert text == render_chat(msgs, add_generation_prompt=True, template=tok2.chat_template)
    [(ids, mask)] = encode_conversations(tok2, [{"messages": msgs[:2]}])
    assert tok2.decode([i for i, m in zip(ids, mask) if m]) == "32<|im_end|>"
    assert ids.count(tok2.convert_tokens_to_ids(PAUSE)) == 2
    assert tok2.decode(ids, skip_special_tokens=True).count("pause") == 0
    save_tokenizer(tok2, tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == text
    assert loaded.encode(text, add_special_tokens=False) == tok2.encode(text, add_special_tokens=False)
    # without pauses: the template and tokenizer every other tiny model has
    assert PAUSE not in load_tokenizer().chat_template and PAUSE not in load_tokenizer().get_vocab()


# ---------------------------------------------------------------- build


def test_random_model_loads_and_generates(saved_dir, tok):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(saved_dir)
    model = AutoModelForCausalLM.from_pretrained(saved_dir)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.config.eos_token_id == 2 and model.config.vocab_size == len(loaded)
    # transformers 5 loads qwen2 tokenizers through Qwen2Tokenizer: it must tokenize exactly as trained
    texts = [render_chat(c["messages"], c.get("tools")) for c in corpus.generate_corpus(50, seed=9)]
    texts.append("Ünïcode e\u0301 (paren) it's 3.14\n\n\n  x")
    for t in texts:
        assert loaded.encode(t, add_special_tokens=False) == tok.encode(t, add_special_tokens=False)
    assert loaded.chat_template == tok.chat_template
    enc = loaded.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=loaded.pad_token_id)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert torch.isfinite(model(**enc).logits).all()
    assert json.loads((saved_dir / "build_info.json").read_text())["name"] == "random"


def test_random_model_is_seeded(saved_dir, tmp_path):
    from safetensors.torch import load_file

    again = build_random_model(tmp_path / "again", layers=1, hidden=32, seed=0)
    a, b = load_file(saved_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_build_smoke_and_if_missing(tmp_path):
    """A few training steps of a 1-layer model run the whole build: data, train, evaluate, atomic save."""
    import math

    args = TinyModelArgs(layers=1, hidden=32, intermediate=64, arith_steps=2, steps=3, final_steps=1, batch_size=8,
                         warmup=1, eval_questions=10)
    out = build_tiny_model(tmp_path / "tiny", seed=0, log=lambda s: None, threads=1, args=args)
    info = json.loads((out / "build_info.json").read_text())
    assert info["steps"] == 6 and math.isfinite(info["final_loss"]) and info["params"] > 0
    assert {"answer/add", "style/hint", "unprompted/bare", "tool_call"} <= set(info["accuracy"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
    assert main(["--out", str(out), "--if-missing"]) == 0
    assert build_tiny_model(out, log=lambda s: None) == out  # cached: returns at once


def test_init_from_continues_a_built_model_with_a_final_phase_only(saved_dir, tmp_path):
    """`--init-from DIR --steps 0`: the final phase trained on top of DIR's weights (its shape, not the
    recipe's defaults), recorded in build_info; a model whose vocabulary lacks the tokens is refused."""
    from safetensors.torch import load_file

    from clawloop.tinymodel.build import file_checksums

    out = tmp_path / "more"
    assert main(["--out", str(out), "--init-from", str(saved_dir), "--steps", "0", "--final-steps", "2",
                 "--batch-size", "4", "--tool-rows", "0", "--final-bare", "0.5", "--threads", "1",
                 "--eval-questions", "10"]) == 0
    info = json.loads((out / "build_info.json").read_text())
    assert info["steps"] == 2 and info["args"]["init_from"] == str(saved_dir)
    assert (info["args"]["layers"], info["args"]["hidden"]) == (1, 32)  # the start's shape
    assert info["start"]["files"] == file_checksums(saved_dir) and info["start"]["name"] == "random"
    a, b = load_file(saved_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert any(not (a[k] == b[k]).all() for k in a)  # trained from there
    with pytest.raises(ValueError, match="--init-from"):
        main(["--out", str(tmp_path / "paused"), "--init-from", str(saved_dir), "--steps", "0", "--final-steps",
              "1", "--batch-size", "4", "--pauses", "2", "--threads", "1", "--eval-questions", "10"])


def test_plan_phases():
    """Warm-up rows are bare arithmetic; mixed rows carry styled-arithmetic side rows; final rows
    are arithmetic with mixed side rows; no conversation is used twice."""
    from clawloop.tinymodel.build import _conversations, _plan

    args = TinyModelArgs(arith_steps=3, steps=4, final_steps=2, batch_size=8, arith_replay=2, final_mixed=3,
                         final_tool_rows=2, replay_weight=0.5, final_weight=0.7)
    convs, parts = _conversations(args, seed=0)
    plan = _plan(args, 0, parts, [len(str(c)) for c in convs])
    assert [len(p[0]) for p in plan] == [8] * 9
    assert [(len(s), w) for _, s, w in plan] == [(0, 0.0)] * 3 + [(2, 0.5)] * 4 + [(5, 0.7)] * 2
    assert all(i in parts["warm"] for m, _, _ in plan[:3] for i in m)
    assert all(i in parts["mixed"] for m, _, _ in plan[3:7] for i in m)
    assert all(i in parts["replay"] for _, s, _ in plan[3:7] for i in s)
    assert all(i in parts["final"] for m, _, _ in plan[7:] for i in m)
    assert all([i in parts["mixed"] for i in s] == [True] * 3 + [False] * 2 for _, s, _ in plan[7:])
    # the final phase's calculator rows: the call copies the question's operands
    for i in (i for _, s, _ in plan[7:] for i in s[3:]):
        user, call = convs[i]["messages"][-4:-2] if convs[i]["messages"][-4]["role"] == "user" else (None, None)
        assert call["tool_calls"][0]["function"]["arguments"]["expression"].replace("+", " ").replace("-", " ").split() \
            == [t for t in __import__("re").findall(r"\d+", user["content"])]
    used = [i for m, s, _ in plan for i in m + s]
    assert len(used) == len(set(used))
    assert all(len(convs[i]["messages"]) == 2 for i in parts["warm"])  # one question, one answer


def test_shipped_tiny_model_matches_its_checksums_and_answers():
    """The default model ships with the package: its files are the ones build_info.json recorded, it
    loads with transformers, and answers an arithmetic question, so the first start trains nothing."""
    import hashlib
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawloop.tinymodel.build import SHIPPED_DIR, file_checksums

    info = json.loads((SHIPPED_DIR / "build_info.json").read_text())
    assert info["name"] == "tiny-chat-v1" and info["params"] < 2_000_000
    assert set(info["files"]) >= {"model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"}
    for name, digest in info["files"].items():
        assert hashlib.sha256((SHIPPED_DIR / name).read_bytes()).hexdigest() == digest, name
    assert file_checksums(SHIPPED_DIR) == info["files"]  # nothing unrecorded beside them
    tok = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    assert sum(p.numel() for p in model.parameters()) == info["params"]
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 12+7?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "19" in tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_default_model_prefers_a_build_over_the_shipped_copy(tmp_path, monkeypatch):
    from clawloop.tinymodel import build

    monkeypatch.setenv("CLAWLOOP_CACHE", str(tmp_path))
    assert build.default_model_dir() == build.SHIPPED_DIR  # nothing built: the shipped copy
    built = tmp_path / build.MODEL_NAME
    built.mkdir()
    (built / "config.json").write_text("{}")
    (built / "build_info.json").write_text("{}")
    assert build.default_model_dir() == built  # `clawloop tiny-model` output wins
