"""Right results per answer form, sampled as users get them (issue #27 item 2: where the student's `correct` went).

Two reports:

1. `models DIR...`: each model answers the questions plainly (no style asked: the persona's opening), sampled
   at T=1 with fixed seeds (`gate.generate_replies`, the gate's own sampler): the corpus's 50 facts 8 times
   each and 192 held-out sums 4 times each. Per answer form (the styles of `corpus.STYLES`): its share of
   the answers and the right results within it.
2. `evals FILE...`: `clawloop eval` JSON files: each persona's `correct` before and after, split into sums
   and facts (the persona measure's 32 problems are 24 sums and 8 facts).

    .venv/bin/python bench/form_skill_sampled.py models src/clawloop/tinymodel/tiny-chat-v1 /tmp/other_model
    .venv/bin/python bench/form_skill_sampled.py evals bench/eval_s10_*.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def models(paths: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawloop.tinymodel import corpus
    from clawloop.tinymodel.corpus import STYLES, extract_answer, fits_style
    from clawloop.trainer.gate import Check, generate_replies

    sets = {"facts": ([{"question": q, "answer": a} for q, a in corpus.FACTS], 8),
            "sums": ([q for q in corpus.heldout_questions(512, seed=5) if q["skill"] != "fact"][:192], 4)}
    print("model | kind | correct | " + " | ".join(f"{s}: share, right" for s in STYLES))
    for path in paths:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tok = AutoTokenizer.from_pretrained(path)
        for kind, (items, k) in sets.items():
            checks = [Check(kind, [{"role": "user", "content": q["question"]}], lambda r: 0.0, 24, "")
                      for q in items for _ in range(k)]
            want = [q["answer"].lower() for q in items for _ in range(k)]
            replies = generate_replies(model, tok, checks, batch_size=128, temperature=1.0, seed=11)
            ok = [extract_answer(r) == a for r, a in zip(replies, want)]
            cells = []
            for style in STYLES:
                sel = [o for o, r in zip(ok, replies) if fits_style(r, style)]
                cells.append(f"{len(sel) / len(replies):.2f}, {sum(sel) / max(1, len(sel)):.2f}")
            print(f"{Path(path).name} | {kind} | {sum(ok) / len(ok):.3f} | " + " | ".join(cells), flush=True)


def evals(files: list[str]) -> None:
    from clawloop.eval import problems
    from clawloop.users import PERSONAS, RuleRater

    probs = {p["question"]: p for p in problems("tiny", 32, 0)}
    rater = RuleRater()
    by_name = {p.name: p for p in PERSONAS} if not isinstance(PERSONAS, dict) else PERSONAS
    print("file | persona | sums before -> after | facts before -> after")
    for f in files:
        d = json.loads(Path(f).read_text())
        for name, rec in d["personas"].items():
            cells = []
            for kind in ("sums", "facts"):
                vals = []
                for answers in (rec["answers_before"], rec["curve"][-1]["answers"] if rec["curve"] else []):
                    got = [rater.parts(by_name[name], probs[a["question"]], a["answer"])["correct"]
                           for a in answers if a["question"] in probs
                           and (re.search(r"\d", a["question"]) is not None) == (kind == "sums")]
                    vals.append(f"{sum(got) / len(got):.2f}" if got else "-")
                cells.append(" -> ".join(vals))
            print(f"{Path(f).name} | {name} | " + " | ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("models", "evals"):
        sys.exit(__doc__)
    (models if sys.argv[1] == "models" else evals)(sys.argv[2:])
