"""Does the publish gate's own set read what users lose? (issue #27, RESULTS "Why the loop made the model
worse" 9.) Each model given is scored, sampled 4 times a question at T=1 as the gate scores, on the gate's
64 held-out sums (seed 27, the fixed set before `--gate-rotations`), the persona measure's 24 sums (seed 1)
and two fresh sets of 64 held-out sums (seeds 99, 100), each with two sampling seeds. A run whose gate
kept its own set while fresh sets fell has been selected for the gate's questions.

    .venv/bin/python bench/gate_overfit.py BASE_MODEL_DIR TRAINED_MODEL_DIR...

(a trained model: a `clawloop eval --data-dir D` persona's D/<persona>/checkpoints/step_N/model)
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawloop.tinymodel.corpus import heldout_questions
from clawloop.trainer.gate import Check, _answer_is, generate_replies, score_checks


def main(paths: list[str]) -> None:
    torch.set_num_threads(1)
    sets = {"gate(s27)": [q for q in heldout_questions(256, seed=27) if q["skill"] != "fact"][:64],
            "measure(s1)": [q for q in heldout_questions(32, seed=1) if q["skill"] != "fact"],
            "fresh(s99)": [q for q in heldout_questions(256, seed=99) if q["skill"] != "fact"][:64],
            "fresh(s100)": [q for q in heldout_questions(256, seed=100) if q["skill"] != "fact"][:64]}
    tok = AutoTokenizer.from_pretrained(paths[0])
    print("model | " + " | ".join(f"{name} seed {s}" for name in sets for s in (27, 5)))
    for path in paths:
        m = AutoModelForCausalLM.from_pretrained(path).eval()
        row = []
        for name, qs in sets.items():
            checks = [Check(name, [{"role": "user", "content": q["question"]}], _answer_is(q["answer"]), 24, str(i))
                      for i, q in enumerate(qs)]
            asked = [c for c in checks for _ in range(4)]
            for seed in (27, 5):
                row.append(f"{score_checks(asked, generate_replies(m, tok, asked, batch_size=64, temperature=1.0, seed=seed))[name]:.3f}")
        print(path + " | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
