"""What the publish gate (issue 27) costs per publish, beside the publish itself.

On the embedded tiny model, in this process, on the CPU with the trainer's
default one torch thread: the trainer (full fine-tuning, then LoRA) takes a
real train step on tiny-model replies to held-out sums, then per candidate we
time, `--repeats` times each:

- check:    the gate scoring the candidate on the default set (64 held-out
            arithmetic, the corpus's 50 facts, 64 style-instruction checks,
            <= 24 tokens; each sampled 4 times at T=1 by default, and greedy
            once as `--samples 0` asks: both rows are printed), on the
            trainer's model, in the trainer thread;
- keep:     the CPU copy of weights + AdamW state taken after a publish (the
            rollback point);
- rollback: restoring that copy (only on a refusal);
- publish:  the publish itself (`TrainerLoop._publish`: merged weights out of
            the trainer, loaded into the hf engine's spare model, swapped in);
- step:     one train step of 8 samples, for scale.

The baseline (one check at start) is timed once. Serving is not blocked by any
of these: they run in the trainer thread while the engine serves the last
published version (the engine's own swap is inside `publish`).

    .venv/bin/python bench/publish_gate.py [--repeats 5] [--checks 64]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def samples(tok, n=8):
    from clawloop.gateway.render import render_prompt
    from clawloop.records import Sample
    from clawloop.tinymodel.corpus import heldout_questions

    out = []
    for i, q in enumerate([q for q in heldout_questions(4 * n, seed=5) if q["skill"] != "fact"][:n]):
        prompt = render_prompt(tok, [{"role": "user", "content": q["question"]}], None)
        right = i % 2 == 0
        resp = tok.encode(f"The answer is {int(q['answer']) + (0 if right else 3)}.", add_special_tokens=False)
        resp.append(tok.eos_token_id)
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-0.5] * len(resp), prompt_len=len(prompt),
                          reward=1.0 if right else -1.0))
    return out


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def run(lora: bool, repeats: int, checks_per_group: int, data: str, gate_samples: int = 4) -> dict:
    import torch

    from clawloop.config import load_config
    from clawloop.engines.hf import HFEngine
    from clawloop.tinymodel.build import default_model_dir
    from clawloop.trainer import PublishGate, Trainer, TrainerLoop
    from clawloop.trainer.gate import gate_checks

    torch.set_num_threads(1)  # train.threads' default: what the trainer thread runs with in `clawloop up`
    md = default_model_dir()
    flags = {"model__path": str(md), "data_dir": data, "train__device": "cpu", "train__method": "binary",
             "gate__builtin_checks": str(checks_per_group), "gate__samples": str(gate_samples)}
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="8")
    cfg = load_config(flags, env={})
    trainer = Trainer(cfg, str(md))
    engine = HFEngine(md, device="cpu", dtype="float32", threads=1)
    checks = gate_checks(cfg, md)
    gate = PublishGate.from_config(cfg, checks)
    tl = TrainerLoop(cfg, trainer, None, engine, "offline", gate=gate)
    t0 = time.perf_counter()
    gate.begin(trainer)
    baseline_s = time.perf_counter() - t0
    batch = samples(trainer.tokenizer)

    async def main() -> dict:
        await engine.start()
        try:
            def measure() -> dict:
                step_s, _ = timed(lambda: trainer.step(batch), repeats)
                check_s, check_all = timed(lambda: gate.score(trainer), repeats)
                keep_s, _ = timed(lambda: gate.keep(trainer), repeats)
                rollback_s, _ = timed(lambda: gate.roll_back(trainer), repeats)

                def publish() -> None:
                    trainer.version += 1
                    tl._publish()

                publish_s, _ = timed(publish, repeats)
                return {"step_s": step_s, "check_s": check_s, "check_min_s": min(check_all), "keep_s": keep_s, "rollback_s": rollback_s,
                        "publish_s": publish_s, "engine_swap_s": engine.stats().get("engine/last_publish_s", 0.0)}

            return await asyncio.get_running_loop().run_in_executor(None, measure)
        finally:
            await engine.stop()

    r = asyncio.run(main())
    r.update(mode=("lora" if lora else "full") + f" s{gate_samples}", checks=len(checks) * max(1, gate_samples),
             baseline_s=baseline_s,
             baseline={k: round(v, 3) for k, v in gate.baseline.items()},
             trainable_params=sum(p.numel() for p in trainer.params))
    return r


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checks", type=int, default=64, help="built-in checks per group (gate.builtin_checks)")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="clawloop-gate-bench-") as d:
        for lora in (False, True):
            for samples in (0, 4):  # greedy, and the default's 4 samples a check
                rows.append(run(lora, a.repeats, a.checks, d, samples))
    print(f"medians of {a.repeats}; check min in brackets; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"{'mode':8} {'replies':>7} {'baseline':>9} {'check':>17} {'keep':>8} {'rollback':>9} {'publish':>8} "
          f"{'step':>8}  check/publish")
    for r in rows:
        print(f"{r['mode']:8} {r['checks']:7d} {r['baseline_s']:8.3f}s {r['check_s']:7.3f}s ({r['check_min_s']:.3f}s) "
              f"{r['keep_s']:7.4f}s {r['rollback_s']:8.4f}s {r['publish_s']:7.3f}s {r['step_s']:7.3f}s  "
              f"{r['check_s'] / r['publish_s']:.0f}x")
    for r in rows[:2]:
        print(f"baseline scores ({r['mode']}): {r['baseline']}")
    print(json.dumps({"bench": "publish_gate", "repeats": a.repeats, "threads": 1,
                      "load_average": round(os.getloadavg()[0], 2),
                      "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                               for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
