"""`clawloop train`: the trainer alone, on a store (e.g. a GPU box reading the
store a serving box writes) or on a rollout buffer (`--source buffer`).

Without a serving engine in the process there is nothing to publish to: the
trained weights reach serving through checkpoints (`--save-interval`), which
`clawloop up --resume-from-checkpoint DIR` serves. SIGINT/SIGTERM stop after
the current step and write a checkpoint.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from clawloop.trainer import build_loop

log = logging.getLogger(__name__)


def run_trainer_service(cfg: Any, max_steps: int = 0) -> int:
    store = None
    if cfg.train.source == "store":
        from clawloop.runtime import open_store, store_path

        if not store_path(cfg).exists():
            from clawloop.config import ConfigError

            raise ConfigError(f"data_dir: no store at {store_path(cfg)} (start `clawloop up` or import data first)")
        store = open_store(cfg)
    tl = build_loop(cfg, None, store)
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if cfg.train.threads:
        import torch

        torch.set_num_threads(cfg.train.threads)
    print(f"clawloop train: method={cfg.train.method} source={cfg.train.source} "
          f"lora={cfg.train.use_lora} checkpoints in {tl.save_dir}", flush=True)
    try:
        while not stop.is_set():
            if tl.run_once():
                s = tl.trainer.last
                print(f"step {tl.trainer.step_count}: samples={s.get('train/samples', 0):.0f} "
                      f"loss={s.get('train/pg_loss', 0):.4f} grad_norm={s.get('train/grad_norm', 0):.3f}", flush=True)
                if max_steps and tl.trainer.step_count >= max_steps:
                    break
            else:
                stop.wait(1.0)
    finally:
        if tl.trainer.step_count > 0:
            path = tl.checkpoint()
            print(f"checkpoint {path}", flush=True)
        if store is not None:
            store.close()
    return 0
