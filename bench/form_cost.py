"""What does learning a persona's form cost the model's skills, per optimizer setting? (issue #27, RESULTS
"Why the loop made the model worse" 10.)

An offline copy of the persona evaluation's training, without the server: the real `Trainer` (the config's
defaults, rehearsal included), on-policy samples of the tiny model answering corpus questions at T=1
(token-exact ids from `gate.generate_rows`), the built-in user's verdict as the reward (+1: the right result
in the persona's form; -1 otherwise, recorded for the baseline, and trained on only as `negative_weight`
says), `--batch` samples with a signal per update. After `--updates` updates the model is measured on fresh
held-out questions (never in the corpus), 2 samples each at T=1: the form's share and the right results,
sums and facts apart. Each setting starts from the same weights and seeds; settings differ only in what is
named.

    .venv/bin/python bench/form_cost.py --style exclaim --settings default,eps1e-5,eps1e-4
    .venv/bin/python bench/form_cost.py --style bare --method combine --settings default,eps1e-4

Settings (comma separated; `+` joins several): `default`; `relX` (`--adam-eps-rel X`; `rel0` is torch's fixed 1e-8); `epsX` (a fixed AdamW eps X); `lrX`;
`rehearsal0` (no rehearsal); `sgd` (plain SGD at lr x 100, momentum 0.9); `b2X` (AdamW beta2 X);
`key=value` for any config key (`train__anchor_coef=0`).
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shutil
import sys
import tempfile
import time

import torch

from clawloop.config import load_config
from clawloop.records import Sample
from clawloop.tinymodel.corpus import extract_answer, fits_style, heldout_questions, sample_question
from clawloop.trainer.gate import Check, generate_rows



def _scratch(prefix: str) -> str:
    """A data dir for one trainer, removed when the process exits (the trainer writes nothing kept)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path

def _checks(qs: list[dict[str, str]]) -> list[Check]:
    return [Check("q", [{"role": "user", "content": q["question"]}], lambda r: 0.0, 24, str(i))
            for i, q in enumerate(qs)]


def measure(tr, qs: list[dict[str, str]], style: str, seed: int) -> dict[str, float]:
    asked = [q for q in qs for _ in range(2)]
    rows = generate_rows(tr.model, tr.tokenizer, _checks(asked), batch_size=64, temperature=1.0, seed=seed)
    out: dict[str, list[float]] = {"form": [], "correct": [], "sums": [], "facts": [], "correct_in_form": [],
                                   "seen_sums": []}
    for q, (text, _, _) in zip(asked, rows):
        right = float(extract_answer(text) == q["answer"].lower())
        if q.get("seen"):
            out["seen_sums"].append(right)
            continue
        fit = float(fits_style(text, style))
        out["form"].append(fit)
        out["correct"].append(right)
        out["facts" if q["skill"] == "fact" else "sums"].append(right)
        if fit:
            out["correct_in_form"].append(right)
    return {k: (sum(v) / len(v) if v else float("nan")) for k, v in out.items()} | {"in_form_n": len(out["correct_in_form"])}


def setting_flags(name: str) -> tuple[dict[str, str], dict[str, float]]:
    """Config values and optimizer overrides for one setting."""
    flags: dict[str, str] = {}
    opt: dict[str, float] = {}
    for part in [p for p in name.split("+") if p and p != "default"]:
        if "=" in part:
            k, v = part.split("=", 1)
            flags[k] = v
        elif part.startswith("eps"):  # a fixed eps: the relative one off
            opt["eps"] = float(part[3:])
            flags["train__adam_eps_rel"] = "0"
        elif part.startswith("rel"):
            flags["train__adam_eps_rel"] = part[3:]
        elif part.startswith("lr"):
            flags["train__lr"] = part[2:]
        elif part.startswith("b2"):
            flags["train__adam_beta2"] = part[2:]
        elif part == "rehearsal0":
            flags["train__rehearsal_rows"] = "0"
        elif part == "sgd":
            opt["sgd"] = 1.0
        else:
            raise SystemExit(f"unknown setting part {part!r}")
    return flags, opt


def run(model: str, style: str, method: str, setting: str, updates: int, batch: int, seed: int,
        probe: list[dict[str, str]]) -> dict[str, object]:
    from clawloop.trainer import Trainer
    from clawloop.trainer.rehearsal import Rehearsal

    flags, opt = setting_flags(setting)
    values = {"model__path": model, "data_dir": _scratch("form-cost-"), "serve__gc_freeze": "false",
              "train__method": method, "train__rollout_batch_size": str(batch), **flags}
    cfg = load_config(values, env={})
    torch.manual_seed(seed)
    tr = Trainer(cfg, model, device="cpu")
    if "eps" in opt:
        for g in tr.opt.param_groups:
            g["eps"] = opt["eps"]
    if "sgd" in opt:
        tr.opt = torch.optim.SGD([p for p in tr.model.parameters() if p.requires_grad], lr=tr.lr * 100, momentum=0.9)
    tr.rehearsal = Rehearsal.from_config(cfg, model)
    if tr.rehearsal is not None:
        tr.rehearsal.build(tr)
    from clawloop.judge.offline import _STYLE_FALLBACK

    hint = _STYLE_FALLBACK[style]  # the offline judge's hint for a correction towards the style
    rng = random.Random(seed)
    t0 = time.time()
    before = measure(tr, probe, style, seed=1000 + seed)
    generated = 0
    curve = []
    for u in range(updates):
        keep: list[Sample] = []
        while len(keep) < batch:
            qs = [sample_question(rng) for _ in range(32)]
            rows = generate_rows(tr.model, tr.tokenizer, _checks(qs), batch_size=32, temperature=1.0,
                                 seed=rng.randrange(1 << 30))
            for q, (text, prompt, resp) in zip(qs, rows):
                generated += 1
                good = extract_answer(text) == q["answer"].lower() and fits_style(text, style)
                msgs = [{"role": "user", "content": q["question"]}]
                s = Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                           rollout_logprobs=[0.0] * (len(prompt) + len(resp)), prompt_len=len(prompt),
                           reward=1.0 if good else -1.0, hint=None if good else hint, messages=msgs)
                tr.observe_reward(s)
                if good or tr.use_opd or tr.tc.negative_weight > 0:
                    keep.append(s)
        stats = tr.step(keep[:batch])
        if u in (0, updates - 1):
            per = []
            for p in tr.model.parameters():
                st = tr.opt.state.get(p, {})
                if "exp_avg_sq" in st:
                    bc2 = 1 - tr.tc.adam_beta2 ** float(st["step"])
                    per.append((st["exp_avg_sq"] / bc2).sqrt().flatten())
            if per:
                allv = torch.cat(per)
                print(f"  update {u + 1}: sqrt(v_hat) rms {allv.pow(2).mean().sqrt():.2e} median {allv.median():.2e} "
                      f"p90 {allv.quantile(0.9) if allv.numel() < 16_000_000 else float('nan'):.2e}", flush=True)
        if (u + 1) % max(1, updates // 4) == 0:
            m = measure(tr, probe, style, seed=1000 + seed)
            curve.append({"update": u + 1, **m, "kl": stats.get("train/kl_ref", float("nan"))})
            print(f"  {setting} u{u + 1}: form {m['form']:.2f} correct {m['correct']:.2f} sums {m['sums']:.2f} "
                  f"facts {m['facts']:.2f} seen sums {m['seen_sums']:.2f} in-form right {m['correct_in_form']:.2f}", flush=True)
    after = curve[-1]
    return {"setting": setting, "before": before, "after": after, "curve": curve, "generated": generated,
            "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    from clawloop.tinymodel.build import default_model_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_dir()))
    ap.add_argument("--style", default="exclaim", help="the persona's form: exclaim (teacher) or bare (student)")
    ap.add_argument("--method", default="binary")
    ap.add_argument("--settings", default="rel0,default", help="comma separated (module docstring); the default "
                    "compares AdamW's fixed eps with the relative one, side by side")
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe", type=int, default=128, help="held-out questions measured (3/4 sums, 1/4 facts)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from clawloop.tinymodel.corpus import _question

    rng = random.Random("seen-77")
    seen = [_question(rng, ("add", "add", "sub")[i % 3], heldout=False, canonical=True) | {"seen": "1"}
            for i in range(a.probe // 2)]
    probe = heldout_questions(a.probe, seed=77) + seen
    results = []
    for setting in a.settings.split(","):
        r = run(a.model, a.style, a.method, setting, a.updates, a.batch, a.seed, probe)
        b, f = r["before"], r["after"]
        print(f"{setting}: form {b['form']:.2f} -> {f['form']:.2f} | correct {b['correct']:.2f} -> {f['correct']:.2f} "
              f"| sums {b['sums']:.2f} -> {f['sums']:.2f} | facts {b['facts']:.2f} -> {f['facts']:.2f} "
              f"| seen sums {b['seen_sums']:.2f} -> {f['seen_sums']:.2f} | {r['generated']} generated, {r['seconds']} s", flush=True)
        results.append(r)
    print(json.dumps({"bench": "form_cost", "style": a.style, "method": a.method, "updates": a.updates,
                      "settings": {r["setting"]: {"before": r["before"], "after": r["after"]} for r in results}}))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"args": vars(a), "results": results}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
