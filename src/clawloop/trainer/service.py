"""`clawloop train`: the trainer alone, on a store (e.g. a GPU box reading the
store a serving box writes) or on a rollout buffer (`--source buffer`).

Without a serving engine in the process there is nothing to publish to: the
trained weights reach serving through checkpoints (`--save-interval`), which
`clawloop up --resume-from-checkpoint DIR` serves. SIGINT/SIGTERM stop after
the current step and write a checkpoint. With `--ray auto|local --trainer-workers
N` the steps run on a data-parallel group of Ray actors (`distributed.trainer_group`).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from clawloop.trainer import build_loop

log = logging.getLogger(__name__)


def run_trainer_service(cfg: Any, max_steps: int = 0, exit_when_idle: bool = False) -> int:
    """Train until interrupted, `max_steps` steps of this run (0: no limit), or, with `exit_when_idle`,
    until the source has nothing left to make a batch of."""
    store = None
    if cfg.train.source == "store":
        from clawloop.naming import open_store, store_path

        if not store_path(cfg).exists():
            from clawloop.config import ConfigError

            raise ConfigError(f"data_dir: no store at {store_path(cfg)} (start `clawloop up` or import data first)")
        store = open_store(cfg)
    ray_rt = None
    if cfg.ray.mode:  # `--ray auto|local --trainer-workers N`: the data-parallel group as Ray actors
        from clawloop.distributed.ray_runtime import RayRuntime

        ray_rt = RayRuntime(cfg)
    try:
        if ray_rt is not None and cfg.ray.trainer_workers > 0:
            from clawloop.distributed.trainer_group import build_ray_loop

            ray_rt.check_fit(engine=False, judge=False, train=True)
            tl = build_ray_loop(cfg, None, store)
            print(f"clawloop train: {ray_rt.describe(engine=False)}", flush=True)
        else:
            tl = build_loop(cfg, None, store)
    except BaseException:
        if ray_rt is not None:
            ray_rt.close()
        raise
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if cfg.train.threads:
        import torch

        torch.set_num_threads(cfg.train.threads)
    print(f"clawloop train: method={cfg.train.method} source={cfg.train.source} "
          f"lora={cfg.train.use_lora} checkpoints in {tl.save_dir}"
          + (f", resumed from {tl.resumed_from} (step {tl.trainer.step_count}, cursor {tl.cursor})"
             if tl.resumed_from else ""), flush=True)
    try:
        while not stop.is_set():
            if tl.run_once():
                s = tl.trainer.last
                print(f"step {tl.trainer.step_count}: v{tl.trainer.version} samples={s.get('train/samples', 0):.0f} "
                      f"loss={s.get('train/loss', 0):.4f} grad_norm={s.get('train/grad_norm', 0):.3f} "
                      f"stale_dropped={s.get('train/stale_dropped', 0):.0f}", flush=True)
                if max_steps and tl.counts["steps"] >= max_steps:
                    break
            elif exit_when_idle and (tl.fetch() or len(tl.pending) < cfg.train.rollout_batch_size):
                break  # (a step that dropped a stale batch is not idle: fetch again before deciding)
            else:
                stop.wait(1.0)
    finally:
        c = tl.stats()
        print(f"trained {tl.counts['steps']} step(s) this run: policy v{tl.trainer.version}, "
              f"{c['train/judged_seen']:.0f} judged read, {c['train/skipped_no_signal']:.0f} without signal, "
              f"{c['train/stale_dropped']:.0f} dropped as stale, {len(tl.pending)} waiting for a batch"
              + (f", cursor {tl.cursor}" if store is not None else ""), flush=True)
        try:
            if tl.trainer.step_count > 0:
                path = tl.checkpoint()
                print(f"checkpoint {path}", flush=True)
        finally:
            if store is not None:
                store.close()
            if ray_rt is not None:
                group = getattr(tl, "group", None)
                if group is not None:
                    group.shutdown()
                ray_rt.close()
    return 0
