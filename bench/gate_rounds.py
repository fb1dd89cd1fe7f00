"""How does each of the publish gate's rounds read a model? (issue #27, RESULTS "Why the loop made the model
worse" 10.) The gate of the default config for the first model (`--gate-rotations` rounds of the built-in
checks, sampled as the gate samples, the same random numbers for every model), and each model's
arithmetic score on every round, beside the first's. A round on which a trained model falls much further
than on the others is a harder draw for it; one on which every trained model falls is where runs stall.

    .venv/bin/python bench/gate_rounds.py BASE_MODEL_DIR TRAINED_MODEL_DIR...

(a trained model: a `clawloop eval --data-dir D` persona's D/<persona>/checkpoints/step_N/model)
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawloop.config import load_config
from clawloop.trainer.gate import PublishGate, gate_checks



def _scratch(prefix: str) -> str:
    """A data dir for one trainer, removed when the process exits (the trainer writes nothing kept)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path

def main(paths: list[str]) -> None:
    torch.set_num_threads(2)
    base = paths[0]
    cfg = load_config({"model__path": base, "data_dir": _scratch("gate-rounds-"),
                       "serve__gc_freeze": "false"}, env={})
    gate = PublishGate.from_config(cfg, gate_checks(cfg, base))
    tok = AutoTokenizer.from_pretrained(base)
    first: list[float] = []
    print("model | " + " | ".join(f"round {i}" for i in range(len(gate.rounds))) + " | mean")
    for path in paths:
        holder = type("Model", (), {})()
        holder.model, holder.tokenizer = AutoModelForCausalLM.from_pretrained(path).eval(), tok
        row = [gate.score(holder, r)["arithmetic"] for r in gate.rounds]
        first = first or row
        cells = [f"{v:.3f}" + ("" if path == base else f" ({v - b:+.3f})") for v, b in zip(row, first)]
        print(f"{path} | " + " | ".join(cells) + f" | {sum(row) / len(row):.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
