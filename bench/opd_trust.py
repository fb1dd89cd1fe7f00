"""Where OPD's hinted teacher is evidence: its confidence per token and where the divergence point lands
(issue #27: why the teacher persona learned its "!" slowly, `--opd-trust`).

For each persona's form (student: bare, teacher: exclaim) and its offline-judge hint, held-out arithmetic
questions answered right in each of the other forms ("The answer is 61." to the teacher persona) are read
by the student (the model, no hint) and by OPD's teacher (the same weights, the hint after the question, as
`trainer.core.teacher_messages` puts it). Printed: per token class (the answer's first token, the
other form tokens, the digits after it), the student's and the teacher's logprob
of the token and how often the teacher's top-1 is that token; and where the divergence point lands (the
first position the teacher would not write) with `--opd-trust all` (its first disagreement) and `surer`
(its first disagreement where it prefers its token over the written one more than the student prefers the
written one over it: `losses.credit.teacher_trust`).

    .venv/bin/python bench/opd_trust.py [MODEL_DIR] [N]
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawloop.config import Config
from clawloop.judge.offline import classify_user_reply
from clawloop.naming import model_path
from clawloop.tinymodel.corpus import STYLES, correction_for, heldout_questions, render_answer
from clawloop.trainer.core import teacher_messages


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else str(model_path(Config()))
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def read(msgs: list[dict[str, str]], resp: str) -> tuple[list[int], torch.Tensor]:
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok(prompt + resp + tok.eos_token, add_special_tokens=False)["input_ids"]
        start = len(tok(prompt, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (L, V)
        return ids[start:], lp[start - 1:len(ids) - 1]  # response ids, (R, V) the distribution before each

    qs = [q for q in heldout_questions(4 * n, seed=2) if q["skill"] in ("add", "sub")][:n]
    print(f"{len(qs)} held-out sums, {path}")
    for persona, style in (("student", "bare"), ("teacher", "exclaim")):
        hint = classify_user_reply(correction_for(style)).hint
        cls: dict[str, list[float]] = {}
        lands = {"all": {}, "surer": {}}
        for q in qs:
            msgs = [{"role": "user", "content": q["question"]}]
            for other in STYLES:
                if other == style:
                    continue
                ids, s_lp = read(msgs, render_answer(q["answer"], other))
                _, t_lp = read(teacher_messages(msgs, hint), render_answer(q["answer"], other))
                first = {"all": None, "surer": None}
                for k, t in enumerate(ids):
                    kind = "first token" if k == 0 else "digit" if tok.decode([t]).strip().isdigit() else "form"
                    c = cls.setdefault(kind, [0, 0.0, 0.0, 0])
                    top = int(t_lp[k].argmax())
                    c[0] += 1
                    c[1] += float(s_lp[k, t])
                    c[2] += float(t_lp[k, t])
                    c[3] += top == t
                    if top != t and first["all"] is None:
                        first["all"] = kind
                    # credit.teacher_trust: the product of the two distributions also picks the teacher's token
                    if top != t and first["surer"] is None and \
                            float(t_lp[k, top] + s_lp[k, top]) > float(t_lp[k, t] + s_lp[k, t]):
                        first["surer"] = kind
                for mode, kind in first.items():
                    lands[mode][kind or "none"] = lands[mode].get(kind or "none", 0) + 1
        print(f"\n{persona} (form {style}), hint {hint!r}: the right result in each other form")
        print("| token | n | student logprob | hinted teacher logprob | teacher's top-1 is the token |\n|---|---|---|---|---|")
        for kind, (m, s, t, agree) in sorted(cls.items()):
            print(f"| {kind} | {m} | {s / m:.2f} | {t / m:.2f} | {agree / m:.2f} |")
        total = sum(lands["all"].values())
        print("| divergence point lands on | all | surer |\n|---|---|---|")
        for kind in ("first token", "form", "digit", "none"):
            print(f"| {kind} | {lands['all'].get(kind, 0) / total:.2f} | {lands['surer'].get(kind, 0) / total:.2f} |")


if __name__ == "__main__":
    main()
