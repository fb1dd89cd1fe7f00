"""What a hinted teacher says first (issue #27): the tiny model's first token for 16 of its corpus facts and 16
held-out sums, asked plainly, with a style hint, and with the hint the offline judge used to write for a bare
rejection ("That is incorrect, try again."), appended as the trainer's teacher sees it
(`trainer.core.teacher_messages`). Counts how often the most likely content token (the form tokens "The",
"the", "THE" set aside) is the right answer's first token, and the mean probability of that token.

    .venv/bin/python bench/hint_teacher.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from clawloop.gateway.render import render_prompt  # noqa: E402
from clawloop.tinymodel import corpus  # noqa: E402
from clawloop.tinymodel.build import default_model_dir  # noqa: E402
from clawloop.trainer.core import teacher_messages  # noqa: E402

HINTS = {"none": None, "style (bare)": corpus.style_instruction("bare"),
         "rejection": 'The user corrected the previous answer: "That is incorrect, try again." Follow this correction.'}


def main() -> None:
    torch.set_num_threads(1)
    path = default_model_dir()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    qs = list(corpus.FACTS[:16]) + [(q["question"], q["answer"]) for q in corpus.heldout_questions(40, seed=5)
                                    if q["skill"] != "fact"][:16]
    form = [tok.encode(w, add_special_tokens=False)[0] for w in ("The", "the", "THE")]
    print("hint | right content top-1 | mean p(right first token)")
    for name, hint in HINTS.items():
        right, p = 0, 0.0
        for q, a in qs:
            msgs = [{"role": "user", "content": q}]
            ids = render_prompt(tok, teacher_messages(msgs, hint) if hint else msgs, None)
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
            first = tok.encode(a, add_special_tokens=False)[0]
            content = lp.clone()
            content[form] = -float("inf")
            right += int(content.argmax()) == first
            p += float(lp[first].exp())
        print(f"{name} | {right}/{len(qs)} | {p / len(qs):.3f}")


if __name__ == "__main__":
    main()
