"""Held-out sums on checkpoints against the shipped tiny model, read the way the publish gate reads them
(issue #27; bench/RESULTS.md "Why the loop made the model worse" 14).

For each checkpoint (a `checkpoints/step_*/model` folder of a `clawloop up` data dir) and for v0: `correct`
on three sets of held-out sums, with the gate's own sampling (`PublishGate.score`: T=1, per-row draws,
fixed seeds): the gate's whole built-in pool (its rounds together), the 128 other sums
`clawloop eval --wide-sums` asks, and the fixed sums of `clawloop eval --problems 32`; then, with
`--per-question N`, each fixed sum's rate over N samples (where a model's loss sits).

    .venv/bin/python bench/checkpoint_sums.py /tmp/ev/d_binary_corpus/teacher/checkpoints/step_000078/model --per-question 16
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from clawloop.eval import problems  # noqa: E402
from clawloop.tinymodel.build import default_model_dir  # noqa: E402
from clawloop.tinymodel.corpus import extract_answer, heldout_questions  # noqa: E402
from clawloop.trainer.gate import BUILTIN_SEED, Check, PublishGate, _answer_is, builtin_checks, generate_replies  # noqa: E402


def sums_as_checks(questions: list[dict[str, str]], prefix: str) -> list[Check]:
    return [Check("arithmetic", [{"role": "user", "content": q["question"]}], _answer_is(q["answer"]), 24, f"{prefix}{i}")
            for i, q in enumerate(questions)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", help="model folders of checkpoints")
    ap.add_argument("--problems", type=int, default=32, help="clawloop eval --problems (its seed 0)")
    ap.add_argument("--wide", type=int, default=128, help="clawloop eval --wide-sums")
    ap.add_argument("--pool", type=int, default=512, help="the gate's pool: rounds x gate.builtin_checks")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--per-question", type=int, default=0, help="samples per fixed sum for the per-question table")
    a = ap.parse_args()
    base = default_model_dir()
    tok = AutoTokenizer.from_pretrained(base)
    paths = [str(base)] + a.checkpoints
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in paths]
    fixed = [p for p in problems("tiny", a.problems, 0) if p["skill"] != "fact"]
    asked = {p["question"] for p in problems("tiny", a.problems, 0)}
    # the questions `clawloop eval --wide-sums` asks with its default --seed 0
    wide = [q for q in heldout_questions(2 * a.wide + 8, seed=20_000) if q["skill"] != "fact"
            and q["question"] not in asked][:a.wide]
    sets = {f"gate pool {a.pool}": [c for c in builtin_checks(a.pool, 24, seed=BUILTIN_SEED) if c.group == "arithmetic"],
            f"eval's other {len(wide)}": sums_as_checks(wide, "w"), f"eval's fixed {len(fixed)}": sums_as_checks(fixed, "f")}
    gate = PublishGate([], 0.05, samples=a.samples, temperature=1.0)
    print("| set | " + " | ".join(["v0"] + [Path(p).parent.name for p in a.checkpoints]) + " |")
    for name, checks in sets.items():
        got = [gate.score(types.SimpleNamespace(model=m, tokenizer=tok), checks)["arithmetic"] for m in models]
        print(f"| {name} | " + " | ".join([f"{got[0]:.3f}"] + [f"{g:.3f} ({g - got[0]:+.3f})" for g in got[1:]]) + " |",
              flush=True)
    if a.per_question:
        n = a.per_question
        asks = [c for c in sets[f"eval's fixed {len(fixed)}"] for _ in range(n)]
        rates = []
        for m in models:
            replies = generate_replies(m, tok, asks, batch_size=64, temperature=1.0)
            rates.append([sum(extract_answer(replies[i * n + j]) == p["answer"] for j in range(n)) / n
                          for i, p in enumerate(fixed)])
        print()
        for i, p in enumerate(fixed):
            print(f"{p['question']:<22} {p['answer']:>4}  " + " ".join(f"{r[i]:.2f}" for r in rates))


if __name__ == "__main__":
    main()
