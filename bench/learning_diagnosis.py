"""Why did the loop make the model worse? Per-token numbers on the tiny model.

    .venv/bin/python bench/learning_diagnosis.py                 # JSON + PNG under bench/
    .venv/bin/python bench/learning_diagnosis.py --lr 5e-4 --steps 4

The situation the persona evaluation trains on (bench/RESULTS.md "Persona
evaluation"): most answers have the right result in the wrong form ("The
answer is 19." to a student who wants "19"), the user objects, the offline
judge says -1 with the hint "Answer with just the number.", and the rare
answer in the right form gets +1. This script builds exactly such a batch
(15 right-result/wrong-form answers scored -1, 1 bare answer scored +1, on
held-out questions) and asks, per response token:

1. the advantage each objective gives it: binary with the raw score (the old
   default), binary with the mean baseline (`train.baseline mean`), OPD
   (hinted teacher - old logprob), and combine (both);
2. what OPD's hinted teacher assigns to the student's right digits, next to
   the student's own logprob;
3. what `--steps` train steps on that batch do to the logprob of each kind of
   token (the form tokens "The answer is", the digits, the final "."), and to
   the bare right answer of OTHER held-out questions (generalisation of the
   damage), per objective;
4. on the base model: how an instruction's placement changes the right first
   digit's share among digits (OPD's teacher sees it as a hint), and the
   greedy right results with each answer form forced (the price of a form).

Prints a table, writes `--out` (JSON) and a PNG of the per-token advantages
for a few turns beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from clawloop.config import load_config  # noqa: E402
from clawloop.gateway.render import render_prompt  # noqa: E402
from clawloop.losses import combined_advantages  # noqa: E402
from clawloop.records import Sample  # noqa: E402
from clawloop.tinymodel.build import default_model_dir  # noqa: E402
from clawloop.tinymodel.corpus import heldout_questions, render_answer, style_instruction  # noqa: E402
from clawloop.trainer.core import Trainer  # noqa: E402

HINT = style_instruction("bare")
OBJECTIVES = {  # name -> config flags
    "binary, old default": {"train__method": "binary", "train__baseline": "none", "train__negative_weight": "1"},
    "binary, new default": {"train__method": "binary"},
    "opd, old default": {"train__method": "opd", "train__opd_credit": "all", "train__opd_target": "advantage"},
    "opd, new default": {"train__method": "opd"},
    "combine, old default": {"train__method": "combine", "train__baseline": "none", "train__negative_weight": "1",
                             "train__opd_credit": "all", "train__opd_target": "advantage"},
    "combine, new default": {"train__method": "combine"},
}


def make_sample(tok, question: str, answer_text: str, score: float, hint: str | None) -> Sample:
    msgs = [{"role": "user", "content": question}]
    prompt = render_prompt(tok, msgs, None)
    resp = tok.encode(answer_text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")
                                                                 if "<|im_end|>" in tok.get_vocab()
                                                                 else tok.eos_token_id]
    n = len(prompt)
    return Sample(tokens=prompt + resp, loss_mask=[0] * n + [1] * len(resp), rollout_logprobs=[0.0] * (n + len(resp)),
                  prompt_len=n, reward=score, hint=hint, messages=msgs)


def token_kinds(tok, s: Sample, answer: str) -> list[str]:
    """A kind per response token: form / digit / end."""
    out = []
    for i in s.tokens[s.prompt_len:]:
        piece = tok.decode([i])
        if piece.strip() and piece.strip() in answer:
            out.append("digit")
        elif any(c.isalpha() for c in piece):
            out.append("form")
        else:
            out.append("end")
    return out


def response_logprobs(tr: Trainer, samples: list[Sample]) -> list[torch.Tensor]:
    rows = [(s.tokens[:s.prompt_len], s.tokens[s.prompt_len:]) for s in samples]
    return [r["lp"] for r in tr.score_responses(tr.model, rows)]


def instruction_and_form_costs(model_path: str) -> dict:
    """The base model's arithmetic (i) at the first token, with the bare instruction placed as a hint, a
    system message, a prefix, a suffix, or absent: the right first digit's share among digits; (ii) in each
    answer form, with the form's opening forced: greedy right results. 64 held-out sums."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawloop.trainer.core import teacher_messages

    tok = AutoTokenizer.from_pretrained(model_path)
    m = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    qs = [q for q in heldout_questions(128, seed=11) if q["skill"] in ("add", "sub")][:64]
    digits = torch.tensor([i for t, i in tok.get_vocab().items() if t.isdigit()])
    instr = style_instruction("bare")
    places = {
        "none": lambda q: [{"role": "user", "content": q}],
        "hint (OPD's teacher)": lambda q: teacher_messages([{"role": "user", "content": q}], instr),
        "system": lambda q: [{"role": "system", "content": instr}, {"role": "user", "content": q}],
        "prefix": lambda q: [{"role": "user", "content": f"{instr} {q}"}],
        "suffix": lambda q: [{"role": "user", "content": f"{q} {instr}"}],
    }
    out: dict = {"first_digit_share": {}, "greedy_right_by_form": {}}
    with torch.no_grad():
        for name, make in places.items():
            share = 0.0
            for q in qs:
                p = torch.softmax(m(torch.tensor([render_prompt(tok, make(q["question"]), None)])).logits[0, -1], -1)
                first = tok.encode(q["answer"], add_special_tokens=False)[0]
                share += float(p[first] / p[digits].sum())
            out["first_digit_share"][name] = round(share / len(qs), 3)
        for form, opening in (("sentence", "The answer is "), ("upper", "THE ANSWER IS "),
                              ("lower", "the answer is "), ("bare", "")):
            right = 0
            for q in qs:
                ids = render_prompt(tok, [{"role": "user", "content": q["question"]}], None)
                ids = ids + tok.encode(opening, add_special_tokens=False)
                ans = tok.encode(q["answer"], add_special_tokens=False)
                lp = torch.log_softmax(m(torch.tensor([ids + ans])).logits[0], -1)  # (L, V)
                n = len(ids)
                if form == "bare":  # the form itself is the first digit: right share among digits, then greedy
                    ok = int(digits[lp[n - 1, digits].argmax()]) == ans[0]
                    right += ok and all(int(lp[n - 1 + k].argmax()) == ans[k] for k in range(1, len(ans)))
                else:
                    right += all(int(lp[n - 1 + k].argmax()) == ans[k] for k in range(len(ans)))
            out["greedy_right_by_form"][form] = round(right / len(qs), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=5e-4, help="The persona evaluation's learning rate until now.")
    ap.add_argument("--steps", type=int, default=4, help="Train steps on the batch.")
    ap.add_argument("--model-path", default="")
    ap.add_argument("--flag", action="append", default=[], help="key=value config override for every objective, "
                                                                 "e.g. train__kl_coef=0.1")
    ap.add_argument("--only", default="", help="Run only the objectives whose name contains this.")
    ap.add_argument("--out", default="bench/learning_diagnosis.json")
    a = ap.parse_args()
    model = a.model_path or str(default_model_dir())
    torch.manual_seed(0)
    qs = heldout_questions(40, seed=3)
    qs = [q for q in qs if q["skill"] in ("add", "sub")][:24]
    train_q, probe_q = qs[:16], qs[16:]
    data = Path(tempfile.mkdtemp(prefix="clawloop-diag-"))
    result: dict = {"lr": a.lr, "steps": a.steps, "hint": HINT, "objectives": {}}
    costs = instruction_and_form_costs(model)
    result["base_model"] = costs
    print("right first digit's share among digits, by where 'Answer with just the number.' is:",
          costs["first_digit_share"], flush=True)
    print("greedy right results with the answer's form forced:", costs["greedy_right_by_form"], flush=True)
    extra = dict(f.split("=", 1) for f in a.flag)
    result["flags"] = extra
    for name, flags in OBJECTIVES.items():
        if a.only and a.only not in name:
            continue
        cfg = load_config({"model__path": model, "data_dir": str(data), "train__lr": str(a.lr),
                           "train__rollout_batch_size": "16", **flags, **extra}, env={})
        tr = Trainer(cfg, model, device="cpu")
        tok = tr.tokenizer
        batch = [make_sample(tok, q["question"], render_answer(q["answer"], "sentence"), -1.0, HINT)
                 for q in train_q[:15]]
        batch.append(make_sample(tok, train_q[15]["question"], train_q[15]["answer"], 1.0, None))
        kinds = [token_kinds(tok, s, q["answer"]) for s, q in zip(batch, train_q)]
        probes = [make_sample(tok, q["question"], q["answer"], 0.0, None) for q in probe_q]
        before = response_logprobs(tr, batch)
        probe_before = response_logprobs(tr, probes)
        # 1 + 2: advantages per token as the step computes them (old = the forward's own logprobs)
        hints = [s.hint for s in batch]
        teacher = tr.teacher_signals(batch, hints) if tr.use_opd else [None] * len(batch)
        scores, _ = tr.rl_scores(batch) if tr.use_rl else ([float("nan")] * len(batch), {})
        tr.reward_history.clear()  # the steps below start from the same history
        per_turn = []
        for s, t, sc, old, kind in zip(batch, teacher, scores, before, kinds):
            n = len(kind)
            tl = None if t is None else torch.tensor(t.logprobs[s.prompt_len:])[None]  # (1, n)
            agrees = None
            if t is not None and t.top1 is not None:
                agrees = torch.tensor(t.top1[s.prompt_len:])[None] == torch.tensor(s.tokens[s.prompt_len:])[None]
            adv, _ = combined_advantages(torch.tensor([sc if tr.use_rl else float("nan")]), tl, old[None],
                                         torch.ones(1, n), w_rl=cfg.train.w_rl if tr.use_rl else 0.0,
                                         w_opd=cfg.train.w_opd if tr.token_opd else 0.0,
                                         opd_clip=cfg.train.opd_clip or None, teacher_agrees=agrees)  # (1, n)
            per_turn.append({"tokens": [tok.decode([i]) for i in s.tokens[s.prompt_len:]], "kinds": kind,
                             "advantage": [round(float(x), 4) for x in adv[0]],
                             "student_lp": [round(float(x), 4) for x in old],
                             "teacher_lp": None if t is None else [round(x, 4) for x in t.logprobs[s.prompt_len:]],
                             "teacher_top1": None if t is None or t.top1 is None
                             else [tok.decode([i]) for i in t.top1[s.prompt_len:]]})
        # 3: train steps on the batch, then the change per token kind and on other questions' bare answers
        stats = {}
        for _ in range(a.steps):
            stats = tr.step([Sample(**{**s.__dict__}) for s in batch])
        after = response_logprobs(tr, batch)
        probe_after = response_logprobs(tr, probes)
        delta: dict[str, list[float]] = {"form": [], "digit": [], "end": []}
        for b, f, kind, s in zip(before[:15], after[:15], kinds[:15], batch[:15]):
            for k, x, y in zip(kind, b.tolist(), f.tolist()):
                delta[k].append(y - x)
        digit_probe = [float((pa - pb)[:-1].sum()) for pb, pa in zip(probe_before, probe_after)]
        rec = {"per_turn": per_turn,
               "mean_adv_by_kind_negatives": {k: _mean([x for t in per_turn[:15] for x, kk in
                                                        zip(t["advantage"], t["kinds"]) if kk == k])
                                              for k in ("form", "digit", "end")},
               "digit_student_lp": _mean([x for t in per_turn[:15] for x, k in zip(t["student_lp"], t["kinds"])
                                          if k == "digit"]),
               "digit_teacher_lp": (_mean([x for t in per_turn[:15] for x, k in zip(t["teacher_lp"], t["kinds"])
                                           if k == "digit"]) if per_turn[0]["teacher_lp"] else None),
               "delta_lp_negatives_by_kind": {k: _mean(v) for k, v in delta.items()},
               "delta_lp_positive_turn": float((after[15] - before[15]).sum()),
               "delta_lp_bare_answer_other_questions": _mean(digit_probe),
               "train_kl": stats.get("train/kl"), "train_entropy": stats.get("train/entropy")}
        result["objectives"][name] = rec
        print(f"{name:34s} adv(form/digit/end)="
              + "/".join(f"{rec['mean_adv_by_kind_negatives'][k]:+.3f}" for k in ("form", "digit", "end"))
              + f"  Δlp after {a.steps} steps (form/digit/end)="
              + "/".join(f"{rec['delta_lp_negatives_by_kind'][k]:+.3f}" for k in ("form", "digit", "end"))
              + f"  Δlp(+1 turn)={rec['delta_lp_positive_turn']:+.3f}"
              + f"  Δlp(bare right answer, other questions)={rec['delta_lp_bare_answer_other_questions']:+.3f}",
              flush=True)
        if rec["digit_teacher_lp"] is not None:
            print(f"{'':34s} digits: student lp {rec['digit_student_lp']:.3f}, hinted teacher lp "
                  f"{rec['digit_teacher_lp']:.3f}", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    png = plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {png}")
    print(json.dumps({"bench": "learning_diagnosis", "lr": a.lr, "steps": a.steps, **{
        f"{name}: bare right answers, other questions": round(rec["delta_lp_bare_answer_other_questions"], 3)
        for name, rec in result["objectives"].items()}}))
    return 0


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def plot(result: dict, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["objectives"])
    turns = [0, 1, 15]  # two -1 right-result/wrong-form turns, the +1 bare turn
    fig, axes = plt.subplots(len(turns), 1, figsize=(11, 2.6 * len(turns)), squeeze=False)
    for row, ti in enumerate(turns):
        ax = axes[row][0]
        first = result["objectives"][names[0]]["per_turn"][ti]
        n = len(first["tokens"])
        width = 0.8 / len(names)
        for k, name in enumerate(names):
            adv = result["objectives"][name]["per_turn"][ti]["advantage"]
            ax.bar([i + k * width for i in range(n)], adv, width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(n)])
        ax.set_xticklabels([repr(t)[1:-1] for t in first["tokens"]], fontsize=8)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylabel("advantage")
        ax.set_title(("-1, right result, wrong form" if ti < 15 else "+1, bare answer") + f" (turn {ti})", fontsize=9)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    return png


if __name__ == "__main__":
    raise SystemExit(main())
