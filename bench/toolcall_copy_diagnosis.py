"""Why the tiny model's calculator calls are wrong: where copying the question into the call fails.

    .venv/bin/python bench/toolcall_copy_diagnosis.py                    # ~20 s: the shipped model's copying
    .venv/bin/python bench/toolcall_copy_diagnosis.py --sft-steps 160    # + can it learn to copy? (~1 min)
    .venv/bin/python bench/toolcall_copy_diagnosis.py --rl-steps 48 --lr 2e-4 --every 16 --out ..._rl.json

On the tool-call track's 40 held-out problems ("What is 52+60?"), rendered exactly as the gateway renders
them (the chat template with the calculator tool), on the model itself (no gateway, no sampling noise):

1. the call: the prompt, then the call the model always starts (`<tool_call> ... "expression": "`),
   teacher-forced; for each character of the right expression, P(right character | right prefix), by
   role (first operand's tens / units digit, operator, second operand's tens / units); P(exact
   expression); and the greedy call's exact rate;
2. the answer: after the model's own greedy call and the calculator's true result for it, "The answer
   is " teacher-forced: P(the tool's result) against P(the right answer) - does the answer follow the
   tool or the question?
3. with `--sft-steps N`: N supervised steps (4 problems each, `--lr`) on the 100 training problems'
   right expressions, then 1. again: whether copying is learnable at all, and how much supervision it
   takes (the RL run gets nothing this dense);
4. with `--rl-steps N` (instead): N GRPO steps on the call alone, 4 problems x 8 sampled calls (T=1) a
   step, reward the track's `call_score`, advantage reward - group mean: the most the call's own reward
   can teach, without the answer step's noise.

Writes JSON (`--out`). Pure CPU, one thread.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from clawloop.envs.toolcall import CALCULATOR, DATA, generated_problems  # noqa: E402
from clawloop.generators.math_generator import read_problems  # noqa: E402

CALL_PREFIX = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "'


def operands(question: str) -> tuple[str, str, str]:
    m = re.search(r"(\d+)\s*([-+])\s*(\d+)", question)
    assert m, question
    return m.group(1), m.group(2), m.group(3)


def roles(a: str, op: str, b: str) -> list[str]:
    """What each character of `a op b` is: a_tens, a_units, op, b_tens, b_units."""
    def digits(x: str, name: str) -> list[str]:
        return [f"{name}_units"] if len(x) == 1 else [f"{name}_tens", f"{name}_units"]
    return digits(a, "a") + ["op"] + digits(b, "b")


class Model:
    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.lm = AutoModelForCausalLM.from_pretrained(path).eval()
        self.end = self.tok.encode('"}}', add_special_tokens=False)[0]

    def ids(self, messages: list[dict[str, Any]], suffix: str = "") -> list[int]:
        text = self.tok.apply_chat_template(messages, tools=[CALCULATOR], add_generation_prompt=True, tokenize=False)
        return self.tok.encode(text + suffix, add_special_tokens=False)

    def token_probs(self, prompt: list[int], target: list[int]) -> list[float]:
        """P(target[j] | prompt + target[:j]) for every j."""
        with torch.no_grad():
            logp = self.lm(torch.tensor([prompt + target])).logits[0].log_softmax(-1)  # (T, V)
        return [logp[len(prompt) - 1 + j, t].exp().item() for j, t in enumerate(target)]

    def greedy(self, prompt: list[int], stop: int, max_new: int = 12) -> list[int]:
        with torch.no_grad():
            out = self.lm.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                                   eos_token_id=stop, pad_token_id=0)[0, len(prompt):].tolist()
        return out[: out.index(stop)] if stop in out else out


def measure(m: Model, problems: list[dict[str, Any]]) -> dict[str, Any]:
    by_role: dict[str, list[float]] = {}
    exact, greedy_exact, follows_tool, follows_question = [], [], [], []
    for p in problems:
        q = p["prompt"]
        a, op, b = operands(q)
        prompt = m.ids([{"role": "user", "content": q}], CALL_PREFIX)
        target = m.tok.encode(a + op + b, add_special_tokens=False)
        assert len(target) == len(a + op + b), "digits are one token each in the tiny tokenizer"
        ps = m.token_probs(prompt, target)
        for role, pr in zip(roles(a, op, b), ps):
            by_role.setdefault(role, []).append(pr)
        exact.append(float(torch.tensor(ps).prod()))
        call = m.tok.decode(m.greedy(prompt, m.end)).strip()
        greedy_exact.append(call == a + op + b)
        # the answer after the model's own greedy call and what the calculator says to it
        try:
            x, o, y = operands(call)
            result = str(int(x) + int(y) if o == "+" else int(x) - int(y))
        except AssertionError:
            continue
        if result == p["label"]:
            continue  # a right call: following the tool and the question are the same answer
        msgs = [{"role": "user", "content": q},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
                    "name": "calculator", "arguments": json.dumps({"expression": call})}}]},
                {"role": "tool", "tool_call_id": "c", "content": result}]
        prompt2 = m.ids(msgs, "The answer is ")
        for out, text in ((follows_tool, result), (follows_question, p["label"])):
            out.append(float(torch.tensor(m.token_probs(prompt2, m.tok.encode(text, add_special_tokens=False))).prod()))
    return {"p_char_by_role": {k: round(statistics.mean(v), 3) for k, v in sorted(by_role.items())},
            "p_exact_expression_mean": round(statistics.mean(exact), 4),
            "p_exact_expression_median": round(statistics.median(exact), 4),
            "greedy_exact_call": round(statistics.mean(greedy_exact), 3),
            "wrong_greedy_calls": len(follows_tool),
            "answer_p_tool_result": round(statistics.mean(follows_tool), 3) if follows_tool else None,
            "answer_p_right_answer": round(statistics.mean(follows_question), 3) if follows_question else None}


def sft(m: Model, steps: int, lr: float, seed: int) -> None:
    """Supervised copying: the right expression after the call prefix, 4 training problems a step."""
    rng = random.Random(seed)
    train = [p for p in read_problems(DATA) if re.search(r"\d+\s*[-+]\s*\d+", p["prompt"])]
    opt = torch.optim.AdamW(m.lm.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    m.lm.train()
    for step in range(1, steps + 1):
        loss, n = torch.zeros(()), 0
        for p in rng.sample(train, 4):
            prompt = m.ids([{"role": "user", "content": p["prompt"]}], CALL_PREFIX)
            target = m.tok.encode("".join(operands(p["prompt"])), add_special_tokens=False) + [m.end]
            logp = m.lm(torch.tensor([prompt + target])).logits[0, len(prompt) - 1:-1].log_softmax(-1)  # (T, V)
            loss = loss - logp.gather(-1, torch.tensor(target)[:, None]).sum()
            n += len(target)
        opt.zero_grad()
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(m.lm.parameters(), 1.0)
        opt.step()
    m.lm.eval()


def rl(m: Model, steps: int, lr: float, seed: int) -> None:
    """GRPO on the call alone: sampled expressions scored by `call_score`, policy gradient with the group
    mean as baseline, token-mean over the step's sampled tokens."""
    from clawloop.envs.toolcall import call_score

    rng = random.Random(seed)
    train = [p for p in read_problems(DATA) if re.search(r"\d+\s*[-+]\s*\d+", p["prompt"])]
    opt = torch.optim.AdamW(m.lm.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    for _ in range(steps):
        terms, n = [], 0
        for p in rng.sample(train, 4):
            prompt = m.ids([{"role": "user", "content": p["prompt"]}], CALL_PREFIX)
            with torch.no_grad():
                out = m.lm.generate(torch.tensor([prompt] * 8), max_new_tokens=8, do_sample=True, top_k=0,
                                    eos_token_id=m.end, pad_token_id=0)[:, len(prompt):].tolist()
            calls = [c[: c.index(m.end) + 1] if m.end in c else c for c in out]
            a, op, b = operands(p["prompt"])
            ref = a + op + b
            result = str(int(a) + int(b) if op == "+" else int(a) - int(b))
            rewards = []
            for c in calls:
                expr = m.tok.decode([t for t in c if t != m.end]).strip()
                rewards.append(call_score(expr, result if "".join(expr.split()) == ref else None, p["label"], ref))
            adv = torch.tensor(rewards) - statistics.mean(rewards)  # (8,)
            m.lm.train()
            for c, ad in zip(calls, adv.tolist()):
                if ad == 0.0 or not c:
                    continue
                logp = m.lm(torch.tensor([prompt + c])).logits[0, len(prompt) - 1:-1].log_softmax(-1)  # (T, V)
                terms.append(-ad * logp.gather(-1, torch.tensor(c)[:, None]).sum())
                n += len(c)
            m.lm.eval()
        if terms:
            opt.zero_grad()
            (torch.stack(terms).sum() / n).backward()
            torch.nn.utils.clip_grad_norm_(m.lm.parameters(), 1.0)
            opt.step()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default="")
    ap.add_argument("--tasks", type=int, default=40, help="Held-out problems (the bench's evaluation set).")
    ap.add_argument("--sft-steps", type=int, default=0)
    ap.add_argument("--rl-steps", type=int, default=0)
    ap.add_argument("--every", type=int, default=40, help="Measure every this many steps.")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/toolcall_copy_diagnosis.json")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    if not a.model_path:
        from clawloop.tinymodel.build import default_model_dir

        a.model_path = str(default_model_dir())
    m = Model(a.model_path)
    problems = generated_problems()[: a.tasks]
    t0 = time.time()
    result: dict[str, Any] = {"model": a.model_path, "tasks": len(problems), "shipped": measure(m, problems)}
    print(json.dumps({"shipped": result["shipped"]}), flush=True)
    for kind, steps, train in (("sft", a.sft_steps, sft), ("rl", a.rl_steps, rl)):
        if not steps:
            continue
        result[kind] = {"lr": a.lr, "problems_per_step": 4, "curve": []}
        done = 0
        while done < steps:
            k = min(a.every, steps - done)
            train(m, k, a.lr, a.seed + done)
            done += k
            row = {"steps": done, **measure(m, problems)}
            result[kind]["curve"].append(row)
            print(json.dumps({kind: row}), flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
