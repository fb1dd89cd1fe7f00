"""Replay a persona run's real judged turns through the trainer from the base weights, once per setting,
and measure what each costs the arithmetic (issue #27: which term of the objective moves the digits).

A `clawloop eval --data-dir D` run leaves each persona's store in D/<persona>/clawloop.db. This reads its
judged turns in order, keeps those with a learning signal for the method (`trainer.loop.has_signal`), and
trains on them in batches of `--batch` from the base weights: the same samples for every setting. Every 4
steps: the change of the right digits' logprob of held-out sums answered "The answer is 61!" (teacher-forced,
questions never in the corpus) and of that answer's "!" (the teacher persona's form).

    .venv/bin/clawloop eval --personas teacher --lr 5e-4 --train-updates 16 --problems 32 --data-dir /tmp/run
    .venv/bin/python bench/anchor_replay.py /tmp/run/teacher --steps 12 --lr 5e-4
"""

from __future__ import annotations

import argparse
import json

import torch

from clawloop.config import Config, load_config
from clawloop.naming import model_path, open_store
from clawloop.records import Sample
from clawloop.tinymodel.corpus import heldout_questions, render_answer
from clawloop.trainer import Trainer
from clawloop.trainer.loop import has_signal

SETTINGS = {
    "combine, --anchor-rl": {"train__anchor_rl": "true"},
    "combine, --anchor-coef 0": {"train__anchor_coef": "0"},
    "combine (defaults: the anchor on corrected answers)": {},
    "binary, --anchor-rl": {"train__method": "binary", "train__anchor_rl": "true"},
    "binary (defaults: no anchor)": {"train__method": "binary"},
    "opd (defaults)": {"train__method": "opd"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="A persona's data folder of a clawloop eval run (holds clawloop.db).")
    ap.add_argument("--model-path", default="", help="Base weights (default: the tiny model clawloop serves).")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", default="5e-4")
    ap.add_argument("--scratch", default="/tmp/clawloop-anchor-replay", help="The trainer's data dir.")
    ap.add_argument("--out", default="")
    ap.add_argument("--setting", action="append", default=[],
                    help="NAME=key:value,key:value (config keys as train__lr), repeatable: these settings instead "
                         "of the built-in six; a train__lr here overrides --lr.")
    a = ap.parse_args()
    settings = SETTINGS
    if a.setting:
        settings = {}
        for spec in a.setting:
            name, _, kv = spec.partition("=")
            settings[name] = dict(item.split(":", 1) for item in kv.split(",") if item)
    torch.set_num_threads(1)
    base = a.model_path or str(model_path(Config()))
    store = open_store(load_config({"model__path": base, "data_dir": a.run}, env={}))
    rows = store.judged_turns("offline", 0, 1_000_000)
    qs = [q for q in heldout_questions(300, seed=7) if q["skill"] in ("add", "sub")][:48]
    results = {}
    for name, flags in settings.items():
        cfg = load_config({"model__path": base, "data_dir": a.scratch, "serve__gc_freeze": "false",
                           "train__lr": a.lr, "train__rollout_batch_size": str(a.batch), **flags}, env={})
        tr = Trainer(cfg, base, device="cpu")
        tok = tr.tokenizer
        probes = []
        for q in qs:
            prompt = tok.apply_chat_template([{"role": "user", "content": q["question"]}], add_generation_prompt=True,
                                             tokenize=False)
            probes.append((tok.encode(prompt, add_special_tokens=False),
                           tok.encode(render_answer(q["answer"], "exclaim"), add_special_tokens=False)))
        digit = [[tok.decode([t]).strip().isdigit() for t in r] for _, r in probes]

        def measure() -> tuple[float, float]:
            scored = tr.score_responses(tr.model, probes)
            d = [float(lp) for s, m in zip(scored, digit) for lp, is_d in zip(s["lp"], m) if is_d]
            return sum(d) / len(d), sum(float(s["lp"][-1]) for s in scored) / len(scored)

        d0, b0 = measure()
        pending: list[Sample] = []
        curve = []
        steps = 0
        for _, turn, judgement in rows:
            if not turn.response_ids:
                continue
            s = Sample.from_turn(turn, judgement)
            tr.observe_reward(s)
            if has_signal(s, cfg.train.method, cfg.train.negative_weight):
                pending.append(s)
            if len(pending) >= a.batch:
                tr.step(pending[:a.batch])
                pending = pending[a.batch:]
                steps += 1
                if steps % 4 == 0:
                    d, b = measure()
                    curve.append({"steps": steps, "digits": d - d0, "bang": b - b0})
                if steps >= a.steps:
                    break
        results[name] = curve
        print(f"| {name} | " + " | ".join(f"{c['digits']:+.2f} / {c['bang']:+.2f}" for c in curve) + " |", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"run": a.run, "lr": a.lr, "batch": a.batch, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
