"""What rehearsal (`trainer/rehearsal.py`, issue #27) costs: its build at start and a train step with it
beside the same step without it, full fine-tuning and LoRA, on the embedded tiny model, CPU, one torch
thread (the trainer's default `train.threads`).

The step is 8 samples (tiny-model answers to held-out sums, half scored +1, half -1); rehearsal adds
`--rehearsal-rows` (8, the default) replayed rows per optimizer update, with the choosing positions
(`--rehearsal-choices`, off by default; this bench's 2026-11-28 figures had it at 0.05). The two steps alternate, `--repeats` times
each, from the same weights (restored between steps), so load on the machine hits both alike.

    .venv/bin/python bench/rehearsal_cost.py [--repeats 7]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(__file__))
from publish_gate import samples  # noqa: E402


def run(lora: bool, repeats: int, data: str) -> dict:
    import torch

    from clawloop.config import load_config
    from clawloop.tinymodel.build import default_model_dir
    from clawloop.trainer import Trainer
    from clawloop.trainer.rehearsal import Rehearsal

    torch.set_num_threads(1)
    md = default_model_dir()
    flags = {"model__path": str(md), "data_dir": data, "train__device": "cpu", "train__method": "binary"}
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="8")
    cfg = load_config(flags, env={})
    trainer = Trainer(cfg, str(md))
    reh = Rehearsal.from_config(cfg, str(md))
    t0 = time.perf_counter()
    reh.build(trainer)
    build_s = time.perf_counter() - t0
    batch = samples(trainer.tokenizer)
    start = copy.deepcopy(trainer.model.state_dict())
    opt_state = copy.deepcopy(trainer.opt.state_dict())
    off, on = [], []
    for _ in range(repeats):
        for use, out in ((None, off), (reh, on)):
            trainer.model.load_state_dict(start)
            trainer.opt.load_state_dict(opt_state)
            trainer.rehearsal = use
            t0 = time.perf_counter()
            trainer.step(list(batch))
            out.append(time.perf_counter() - t0)
    return {"mode": "lora" if lora else "full", "build_s": build_s, "rows": reh.info["rehearsal/rows"],
            "held_positions": reh.info["rehearsal/held_positions"], "step_s": statistics.median(off),
            "step_rehearsal_s": statistics.median(on)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clawloop-rehearsal-bench-") as d:
        rows = [run(lora, a.repeats, d) for lora in (False, True)]
    print(f"medians of {a.repeats}, alternating; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'mode':5} {'build':>7} {'rows':>5} {'held':>5} {'step':>8} {'with rehearsal':>15}  ratio")
    for r in rows:
        print(f"{r['mode']:5} {r['build_s']:6.2f}s {r['rows']:5.0f} {r['held_positions']:5.0f} {r['step_s']:7.3f}s "
              f"{r['step_rehearsal_s']:14.3f}s  {r['step_rehearsal_s'] / r['step_s']:.2f}x")
    print(json.dumps({"bench": "rehearsal_cost", "repeats": a.repeats, "threads": 1,
                      "load_average": round(os.getloadavg()[0], 2),
                      "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
