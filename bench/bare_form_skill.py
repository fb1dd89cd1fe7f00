"""What the tiny model can do in each answer form, and what a teacher asked for the bare form writes
(issue #27 item 1: why the student persona cannot learn its form without losing correctness).

Held-out questions (`heldout_questions`: half addition, a quarter each subtraction and facts, pairs kept
out of the corpus), greedy:
1. per style, the corpus's own instruction for it in the system prompt or after the question: how often
   the answer is right and in that style;
2. teachers for the bare form, the student persona's: the hint appended to the question (OPD's hinted
   teacher), and the conversation as it went on (the model's own answer, then a user correction asking
   for the bare form) with and without the hint: how often they are right in bare form.

    .venv/bin/python bench/bare_form_skill.py [MODEL_DIR] [N]
"""

from __future__ import annotations

import random
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawloop.config import Config
from clawloop.naming import model_path
from clawloop.tinymodel.corpus import (STYLES, _INSTRUCTIONS, correction_for, extract_answer, fits_style,
                                       heldout_questions)
from clawloop.trainer.core import HINT_PREFIX

BARE_HINT = "Answer with just the number."  # the offline judge's hint for the bare form


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else str(model_path(Config()))
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def answer(msgs: list[dict[str, str]]) -> str:
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id or 0)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()

    qs = heldout_questions(n, seed=1)
    print(f"{n} held-out questions, greedy, {path}")
    print("| style | asked in | correct | in style | correct and in style |\n|---|---|---|---|---|")
    for style in STYLES:
        ins = _INSTRUCTIONS[style][0]
        for where in ("system", "user"):
            right = fit = both = 0
            for p in qs:
                msgs = ([{"role": "system", "content": ins}, {"role": "user", "content": p["question"]}]
                        if where == "system" else [{"role": "user", "content": p["question"] + " " + ins}])
                o = answer(msgs)
                r, f = extract_answer(o) == p["answer"].lower(), fits_style(o, style)
                right, fit, both = right + r, fit + f, both + (r and f)
            print(f"| {style} | {where} | {right / n:.2f} | {fit / n:.2f} | {both / n:.2f} |")

    rng = random.Random(0)
    tally = {k: [0, 0] for k in ("no instruction (the model's own form)", "hint after the question (OPD's teacher)",
                                 "own answer, then a correction", "own answer, then a correction + hint")}
    for p in qs:
        q, a = p["question"], p["answer"].lower()
        own = answer([{"role": "user", "content": q}])
        corr = correction_for("bare", rng)
        outs = [own, answer([{"role": "user", "content": q + HINT_PREFIX + BARE_HINT}]),
                answer([{"role": "user", "content": q}, {"role": "assistant", "content": own},
                        {"role": "user", "content": corr}]),
                answer([{"role": "user", "content": q}, {"role": "assistant", "content": own},
                        {"role": "user", "content": corr + HINT_PREFIX + BARE_HINT}])]
        for k, o in zip(tally, outs):
            tally[k][0] += extract_answer(o) == a
            tally[k][1] += extract_answer(o) == a and fits_style(o, "bare")
    print("\n| teacher for the bare form | correct | correct and bare |\n|---|---|---|")
    for k, (r, rb) in tally.items():
        print(f"| {k} | {r / n:.2f} | {rb / n:.2f} |")


if __name__ == "__main__":
    main()
