"""Trainer memory on one long sample, before and after the loss window and chunked logprobs
(issue #28 item 3), side by side in one run.

    .venv/bin/python bench/trainer_long_sample.py                  # 28 242 + 256 tokens, tiny and wide models
    .venv/bin/python bench/trainer_long_sample.py --prompt 7125 --models tiny

One train step (`Trainer.step`, CPU, float32) on one sample: an OpenClaw-sized prompt (28 242 tokens,
its default system prompt and tools with the tiny tokenizer) and a 256-token answer, the answer
trained (loss mask 1), as a captured agent turn is. Two models: the shipped tiny model (vocabulary
1 182: its logits are small beside its activations) and a random Qwen2 of the same shape with a
16 384-entry output layer (`--wide-vocab`; the logits of 28 k positions are 1.9 GB of float32 each
time they exist; a 32 k vocabulary doubles that, past what this shared machine can spare for the
"before" run). Objectives: `binary` (judge score as advantage) and, on the tiny model, the default
`combine` (which also keeps the base weights' logits for OPD's anchor KL).

"Before" is the trainer at BEFORE (the commit before the window: whole-row logits, a whole-tensor
log_softmax), run from `git archive` of it; "after" is this working tree. Every (variant, model,
method) runs in a child process of its own; peak memory is the child's max RSS
(`resource.getrusage`), with the RSS it had before the step beside it, so the step's own peak is
the difference. Loss and gradient norm are printed to show both compute the same step.

Prints a table and, last, one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from revision import unpack_source  # bench/revision.py (this folder is sys.path[0])

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "713ced4dcff1cb8dc96dc67f28bf344d48c5b943"
"""The last commit whose trainer took logits of every position and one whole-tensor log_softmax."""


def build_wide(out: Path, vocab: int) -> Path:
    """The shipped model's shape and tokenizer with a `vocab`-row output layer (ids past the tokenizer's
    are never sampled; they are what makes the logits as big as a real model's)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from clawloop.tinymodel.build import _save, load_tokenizer

    tok = load_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    _save(Qwen2ForCausalLM(cfg), tok, out)
    return out


def worker(model_dir: str, data_dir: str, method: str, prompt: int, answer: int) -> dict:
    """One step on one long sample with whichever clawloop is on sys.path; max RSS before and after."""
    import random
    import resource

    import torch

    from clawloop.config import load_config
    from clawloop.records import Sample
    from clawloop.trainer import Trainer

    torch.manual_seed(0)
    cfg = load_config({"model__path": model_dir, "data_dir": data_dir, "train__method": method,
                       "train__lr": "1e-5"}, env={})
    trainer = Trainer(cfg, model_dir, device="cpu")
    rng = random.Random(0)
    n_tok = len(trainer.tokenizer)
    tokens = [rng.randrange(3, n_tok) for _ in range(prompt + answer)]
    sample = Sample(tokens=tokens, loss_mask=[0] * prompt + [1] * answer,
                    rollout_logprobs=[0.0] * prompt + [-2.0] * answer, prompt_len=prompt, reward=1.0,
                    advantages=[0.0] * prompt + [1.0] * answer)

    def rss_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    before = rss_mb()
    t0 = time.perf_counter()
    stats = trainer.step([sample])
    return {"rss_before_step_mb": before, "peak_rss_mb": rss_mb(), "step_s": time.perf_counter() - t0,
            "loss": stats.get("train/loss"), "grad_norm": stats.get("train/grad_norm"),
            "pg_loss": stats.get("train/pg_loss")}


def run(src: Path, model_dir: Path, method: str, args, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import trainer_long_sample as b; "
            f"print(json.dumps(b.worker({str(model_dir)!r}, {str(tmp / 'data')!r}, {method!r}, "
            f"{args.prompt}, {args.answer})))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"failed": p.returncode, "stderr": p.stderr[-1500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=28_242)
    ap.add_argument("--answer", type=int, default=256)
    ap.add_argument("--models", default="tiny,wide")
    ap.add_argument("--methods", default="binary,combine", help="objectives on the tiny model")
    ap.add_argument("--wide-methods", default="binary", help="objectives on the wide model (before's combine "
                    "keeps ~5 copies of its (L, V) logits: past a small machine's memory)")
    ap.add_argument("--wide-vocab", type=int, default=16_384)
    ap.add_argument("--before", default=BEFORE, help="git revision whose trainer is 'before'")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trainer-long-"))
    unpack_source(args.before, tmp / "before")
    models = {}
    for m in args.models.split(","):
        tiny = ROOT / "src/clawloop/tinymodel/tiny-chat-v1"
        models[m] = tiny if m == "tiny" else build_wide(tmp / "wide", args.wide_vocab)
    rows = []
    for name, mdir in models.items():
        for method in (args.methods if name == "tiny" else args.wide_methods).split(","):
            for variant, src in (("before", tmp / "before" / "src"), ("after", ROOT / "src")):
                r = run(src, mdir, method, args, tmp)
                rows.append({"model": name, "method": method, "variant": variant, **r})
                print(json.dumps(rows[-1])[:300], file=sys.stderr, flush=True)
    print(f"one step, one sample: {args.prompt}-token prompt + {args.answer}-token answer (trained); CPU, float32")
    print("| model | method | before: peak RSS (step's own) | after: peak RSS (step's own) | ratio (step's own) "
          "| loss before / after | grad norm before / after | step s before / after |")
    print("|---|---|---|---|---|---|---|---|")
    for i in range(0, len(rows), 2):
        b, a = rows[i], rows[i + 1]
        if "failed" in b or "failed" in a:
            print(f"| {b['model']} | {b['method']} | {b.get('failed', '')} | {a.get('failed', '')} | | | | |")
            continue
        own_b, own_a = b["peak_rss_mb"] - b["rss_before_step_mb"], a["peak_rss_mb"] - a["rss_before_step_mb"]
        print(f"| {b['model']} | {b['method']} | {b['peak_rss_mb']:,.0f} MB ({own_b:,.0f}) | "
              f"{a['peak_rss_mb']:,.0f} MB "
              f"({own_a:,.0f}) | {own_b / max(own_a, 1):.1f}x | {b['loss']:.6g} / {a['loss']:.6g} | "
              f"{b['grad_norm']:.6g} / {a['grad_norm']:.6g} | {b['step_s']:.1f} / {a['step_s']:.1f} |")
    print(json.dumps({"bench": "trainer_long_sample", "prompt": args.prompt, "answer": args.answer,
                      "before_rev": args.before, "rows": rows}))


if __name__ == "__main__":
    main()
