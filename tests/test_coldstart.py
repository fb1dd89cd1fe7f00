"""`clawloop env coldstart`: a supervised stage on a track's verified reference solutions before RL
(envs/coldstart.py). Real parts: the tool-call track's environments in the sandbox, the tiny model,
its chat template; the trained model is loaded back and measured."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import needs_part

from clawloop.envs.base import EnvOptions
from clawloop.envs.coldstart import batches_of, cold_start, demonstrations, render
from clawloop.envs.sandbox import probe
from clawloop.naming import model_path

pytestmark = needs_part("sandbox", probe("bwrap") and probe("unshare")
                        and f"no sandbox level runs here: {probe('bwrap')}; {probe('unshare')}")

CALC = {"tools": [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]}
TASKS = [f"math-{i:03d}" for i in range(8)]


@pytest.fixture(scope="module")
def calc(tmp_path_factory):
    p = tmp_path_factory.mktemp("tools") / "calculator.json"
    p.write_text(json.dumps(CALC))
    return str(p)


def _tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(type("M", (), {"path": ""})()))


def test_reference_episodes_are_played_and_rendered_as_the_gateway_renders_them(calc):
    demos, skipped = demonstrations("toolcall", EnvOptions(max_steps=4, tools_config=calc), TASKS[:3])
    assert len(demos) == 3 and skipped == []
    # patterns pick tasks too: the packaged problems, not the held-out generated ones
    assert len(demonstrations("toolcall", EnvOptions(max_steps=4, tools_config=calc), ["math-00[0-2]"])[0]) == 3
    d = demos[0]
    roles = [m["role"] for m in d.messages]
    assert roles == ["user", "assistant", "tool", "assistant"], roles  # the calculator config has no system
    # the tool really ran (sandboxed): its output is the label the reference's answer gives
    assert f"\\boxed{{{d.messages[2]['content'].strip()}}}" in d.messages[3]["content"]
    tok = _tok()
    tokens, mask = render(tok, d.messages, d.tools)
    # the masked tokens are the two assistant turns, each through its end-of-turn token, nothing else
    spans, cur = [], []
    for t, m in zip(tokens, mask):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    assert len(spans) == 2
    call, answer = (tok.decode(s) for s in spans)
    assert call.startswith("<tool_call>") and call.endswith(tok.eos_token), call
    expr = json.loads(d.messages[1]["tool_calls"][0]["function"]["arguments"])["expression"]
    assert f'"expression": "{expr}"' in call
    assert answer.startswith("The answer is") and answer.endswith(tok.eos_token), answer
    # rendered exactly as the full conversation renders (what the gateway's prompt ids are)
    text = tok.apply_chat_template(d.messages, tools=d.tools, tokenize=False)
    assert tokens == tok.encode(text, add_special_tokens=False)


def test_a_reference_that_fails_is_left_out_with_its_reason(tmp_path, calc):
    # one step allowed: the reference's call uses it, no answer comes, the episode scores -1
    demos, skipped = demonstrations("toolcall", EnvOptions(max_steps=1, tools_config=calc), ["math-000", "math-001"])
    assert demos == [] and len(skipped) == 2
    assert skipped[0].startswith("math-000: reference scored -1")
    # a reference whose call does not give the answer (a wrong expression; its answer is the label, so
    # it scores the maximum) would teach ignoring the tool: left out too
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"instance_id": "ok", "prompt": "What is 2+2?", "label": "4"}) + "\n"
                     + json.dumps({"instance_id": "off", "prompt": "What is 2+2?", "label": "4", "oracle": "2+3"})
                     + "\n")
    demos, skipped = demonstrations("toolcall", EnvOptions(max_steps=4, tools_config=calc, task_dir=str(tasks)))
    assert [d.task_id for d in demos] == ["ok"]
    assert skipped == ["off: reference's tool calls did not give the answer (reference '2+3')"]
    with pytest.raises(ValueError, match="nothing to learn from"):
        cold_start(model_path(type("M", (), {"path": ""})()), str(tmp_path / "out"), "toolcall",
                   EnvOptions(max_steps=1, tools_config=calc), task_ids=["math-000"], steps=1)
    assert not (tmp_path / "out").exists()


def test_batches_mix_replay_rows_in_the_share_asked():
    rows = [([1, 2], [0, 1])] * 3
    plain = [([3, 4], [0, 1])] * 2
    b = batches_of(rows, plain, steps=5, batch_size=4, n_plain=1, seed=0)
    assert len(b) == 5 and all(len(x) == 4 and sum(r[0] == [3, 4] for r in x) == 1 for x in b)
    assert all(sum(r[0] == [3, 4] for r in x) == 0 for x in batches_of(rows, [], steps=2, batch_size=4, n_plain=1,
                                                                          seed=0))


def _demo_nll(path: str, rows: list[tuple[list[int], list[int]]]) -> float:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for t, k in rows:
            ids = torch.tensor([t])
            lp = torch.log_softmax(m(input_ids=ids).logits[0, :-1].float(), -1)  # (T-1, V)
            tgt = ids[0, 1:]
            mk = torch.tensor(k[1:], dtype=torch.bool)
            tot += float(-lp[torch.arange(len(tgt)), tgt][mk].sum())
            n += int(mk.sum())
    return tot / n


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from clawloop import cli

    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_coldstart_cli_trains_on_the_references_and_writes_a_servable_model(tmp_path, calc, capsys):
    out = tmp_path / "cold"
    prompts = tmp_path / "replay.jsonl"
    prompts.write_text("What is 3+4?\n" + json.dumps({"prompt": "What color is the sky?"}) + "\n")
    rc, stdout, err = _cli(capsys, "env", "coldstart", "--track", "toolcall", "--tools-config", calc, "--tasks",
                           ",".join(TASKS), "--steps", "24", "--lr", "1e-3", "--batch-size", "4", "--replay", "0.25",
                           "--replay-prompts", str(prompts), "--out", str(out))
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["demos"] == 8 and summary["skipped"] == 0 and summary["steps"] == 24
    info = json.loads((out / "build_info.json").read_text())
    assert info["name"].startswith("tiny-chat") and "files" not in info  # still the tiny model for the gate
    recipe = json.loads((out / "coldstart.json").read_text())
    assert recipe["tasks"] == TASKS and recipe["replay_rows"] == 2 and len(recipe["losses"]) == 24
    # the reference turns are what it learned: their loss fell against the base weights'
    demos, _ = demonstrations("toolcall", EnvOptions(max_steps=4, tools_config=calc), TASKS)
    tok = _tok()
    rows = [render(tok, d.messages, d.tools) for d in demos]
    base = model_path(type("M", (), {"path": ""})())
    before, after = _demo_nll(base, rows), _demo_nll(str(out), rows)
    assert after < 0.7 * before, (before, after)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold", "replay.jsonl"]  # nothing half-written

    # bad input: a clear error naming the option, nothing written
    rc, _, err = _cli(capsys, "env", "coldstart", "--track", "toolcall", "--tools-config", calc, "--tasks",
                      "math-000", "--steps", "1", "--out", str(out))
    assert rc == 2 and "--out" in err and "not empty" in err
    rc, _, err = _cli(capsys, "env", "coldstart", "--track", "toolcall", "--tools-config", calc, "--tasks",
                      "math-000", "--steps", "0", "--out", str(tmp_path / "z"))
    assert rc == 2 and "--steps" in err and not (tmp_path / "z").exists()
    prompts.write_text('{"text": "no prompt key"}\n')
    rc, _, err = _cli(capsys, "env", "coldstart", "--track", "toolcall", "--replay-prompts", str(prompts), "--out",
                      str(tmp_path / "b"))
    assert rc == 2 and "--replay-prompts" in err and ":1: no 'prompt'" in err
    rc, _, err = _cli(capsys, "env", "coldstart", "--track", "toolcall", "--tasks", "nope", "--out",
                      str(tmp_path / "u"))
    assert rc == 2 and "nope" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold", "replay.jsonl"]
