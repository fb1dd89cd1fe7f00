"""Data-parallel training on Ray: step time with 1 vs 2 trainer actors, and what Ray itself costs.

    .venv/bin/python bench/ray_scale.py                       # the numbers in the report (2 shared cores)
    .venv/bin/python bench/ray_scale.py --layers 8 --hidden 512 --steps 6

A private local Ray cluster (`--ray local`: loopback, no dashboard, its own temp dir), a randomly
initialised Qwen2 of `--layers` x `--hidden` with the tiny model's tokenizer, and one fixed batch of
`--batch` binary-reward samples of prompt + response. Measured, median over `--steps` steps after one
warm-up step:

- single process: `Trainer.step` in this process (the no-Ray baseline);
- 1 and 2 trainer actors (`TrainerGroup`, gloo): the driver's wall time per step (what the trainer
  loop waits for), the step time inside the actors, and the all-reduce time inside the step;
- serving: one greedy request on the shipped tiny model, the in-process engine vs the router to one
  engine actor (what the Ray hop adds per request);
- Ray's own costs: an actor call round trip (a no-op method), `ray.put` of the batch, the driver-side
  overhead of a step (driver wall - step inside the actor), one all-reduce of the model's gradient
  size and of one float (latency), and fetching the published weights (rank 0 packs its state dict
  into the object store; the driver gets it back as the engine actors do).

Every trainer actor runs torch with 1 thread (as `--train-threads 1`), so 2 actors use 2 cores where
1 actor uses one. On a 2-core machine that is shared with the driver, Ray's own processes and
anything else, a speed-up below 2x is the expected result, not a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def samples(tok, n: int, seed: int = 0):
    import random

    from clawloop.gateway.render import render_prompt
    from clawloop.records import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        prompt = render_prompt(tok, [{"role": "user", "content": f"What is {a}+{b}? Explain the steps."}], None)
        text = " ".join(f"{a}+{b} is {a + b}, step {k}." for k in range(rng.randint(4, 9)))
        resp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-3.0] * len(resp), prompt_len=len(prompt),
                          reward=1.0 if i % 2 == 0 else -1.0))
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1000.0


def serving(n: int) -> dict:
    """Latency of one request (greedy, 16 tokens, the shipped tiny model) from the in-process engine vs
    through the router to one engine actor: what the Ray hop costs a request (the streamed batches of
    tokens, the object store, the actor's event loop). Sequential requests, p50 in ms."""
    import asyncio

    from clawloop.distributed.router import RayEngine
    from clawloop.engines.base import GenerationRequest, SamplingParams
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.tinymodel.build import default_model_dir

    path = str(default_model_dir())

    async def run(engine) -> list[float]:
        await engine.start()
        prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 12+7?"}], None)
        out, tokens = [], 0
        try:
            for i in range(n + 2):
                t0 = time.perf_counter()
                async for ev in engine.generate(GenerationRequest(list(prompt), SamplingParams(
                        temperature=0.0, max_tokens=16), session_id=f"s{i}")):
                    tokens += ev.token_id is not None
                if i >= 2:  # two warm-up requests
                    out.append(time.perf_counter() - t0)
        finally:
            await engine.stop()
        return out

    kw = dict(device="cpu", threads=1)
    direct = asyncio.run(run(HFEngine(path, **kw)))
    routed = asyncio.run(run(RayEngine(path, replicas=1, engine_kwargs=kw, num_cpus=1.0)))
    return {"requests": n, "direct_p50_ms": med(direct), "ray_actor_p50_ms": med(routed),
            "added_p50_ms": med(routed) - med(direct), "ratio_p50": med(routed) / med(direct)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40, help="Sequential requests per engine in the serving part.")
    ap.add_argument("--out", default="", help="Also write the results as JSON here.")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    import ray

    from clawloop.config import load_config
    from clawloop.distributed.ray_runtime import connect
    from clawloop.distributed.trainer_group import TrainerGroup
    from clawloop.tinymodel.build import build_random_model
    from clawloop.trainer.core import Trainer

    work = Path(tempfile.mkdtemp(prefix="clawloop-ray-bench-", dir="/tmp"))
    model = build_random_model(work / "model", layers=a.layers, hidden=a.hidden, seed=0)
    cfg = load_config({"model__path": str(model), "data_dir": str(work / "data"), "train__method": "binary",
                       "train__lr": "1e-4", "train__threads": "1", "train__micro_batch_tokens": "8192",
                       "ray__mode": "local", "ray__num_cpus": "2", "ray__object_store_mb": "256",
                       "ray__temp_dir": str(work / "ray")}, env={})
    res: dict = {"model": {"layers": a.layers, "hidden": a.hidden}, "batch": a.batch, "steps": a.steps,
                 "machine": f"{os.cpu_count()} cores", "torch_threads_per_trainer": 1}
    try:
        # the baseline: one process, no Ray
        single = Trainer(cfg, str(model), device="cpu")
        batch = samples(single.tokenizer, a.batch)
        n_params = sum(p.numel() for p in single.params)
        res["model"]["params"] = n_params
        res["batch_tokens"] = sum(len(s.tokens) for s in batch)
        single.step(list(batch))
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            single.step(list(batch))
            times.append(time.perf_counter() - t0)
        res["single_process_step_ms"] = med(times)
        del single

        connect(cfg)
        for world in (1, 2):
            group = TrainerGroup(cfg, str(model), workers=world, num_cpus=1.0)
            try:
                group.step(list(batch))  # warm-up
                wall, inside, comm, puts = [], [], [], []
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    s = group.step(list(batch))
                    wall.append(time.perf_counter() - t0)
                    inside.append(s["train/step_s"])
                    comm.append(s.get("train/allreduce_s", 0.0))
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    ray.put(list(batch))
                    puts.append(time.perf_counter() - t0)
                r = {"driver_step_ms": med(wall), "actor_step_ms": med(inside),
                     "allreduce_in_step_ms": med(comm),
                     "driver_overhead_ms": med([w - i for w, i in zip(wall, inside)]),
                     "ray_put_batch_ms": med(puts)}
                w0 = group.workers[0]
                ray.get(w0.noop.remote())
                rt = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    ray.get(w0.noop.remote())
                    rt.append(time.perf_counter() - t0)
                r["actor_call_roundtrip_ms"] = med(rt)
                fetch = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    payload = ray.get(group.served_weights_ref())
                    fetch.append(time.perf_counter() - t0)
                from clawloop.distributed.weights import nbytes

                r["weights_mb"] = nbytes(payload) / 2**20
                r["publish_weights_via_object_store_ms"] = med(fetch)
                if world > 1:
                    r["allreduce_grad_size_ms"] = ray.get([w.bench_allreduce.remote(n_params, 10)
                                                           for w in group.workers])[0]
                    r["allreduce_1_float_ms"] = ray.get([w.bench_allreduce.remote(1, 200)
                                                         for w in group.workers])[0]
                res[f"workers_{world}"] = r
            finally:
                group.shutdown()
        res["speedup_2_vs_1_workers"] = res["workers_1"]["driver_step_ms"] / res["workers_2"]["driver_step_ms"]
        res["serving"] = serving(a.requests)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    w1, w2 = res["workers_1"], res["workers_2"]
    print(f"\nstep time, {a.batch} samples / {res['batch_tokens']} tokens, {n_params / 1e6:.1f} M params:\n"
          f"  single process         {res['single_process_step_ms']:8.1f} ms\n"
          f"  1 trainer actor        {w1['driver_step_ms']:8.1f} ms  (in the actor {w1['actor_step_ms']:.1f})\n"
          f"  2 trainer actors       {w2['driver_step_ms']:8.1f} ms  (in the actors {w2['actor_step_ms']:.1f}, "
          f"all-reduce {w2['allreduce_in_step_ms']:.1f})  speed-up {res['speedup_2_vs_1_workers']:.2f}x\n"
          f"Ray overhead: actor call round trip {w1['actor_call_roundtrip_ms']:.2f} ms, per-step driver overhead "
          f"{w1['driver_overhead_ms']:.1f} / {w2['driver_overhead_ms']:.1f} ms (1 / 2 actors), ray.put(batch) "
          f"{w1['ray_put_batch_ms']:.2f} ms,\n  all-reduce of the gradient ({n_params * 4 / 2**20:.1f} MiB) "
          f"{w2['allreduce_grad_size_ms']:.1f} ms, of one float {w2['allreduce_1_float_ms']:.3f} ms, weights "
          f"through the object store ({w1['weights_mb']:.1f} MiB) {w1['publish_weights_via_object_store_ms']:.1f} ms")
    sv = res["serving"]
    print(f"serving, one greedy 16-token request on the tiny model: in-process engine p50 {sv['direct_p50_ms']:.1f} ms, "
          f"through the router to an engine actor {sv['ray_actor_p50_ms']:.1f} ms (+{sv['added_p50_ms']:.1f} ms, "
          f"{sv['ratio_p50']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
