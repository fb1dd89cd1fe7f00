"""The trainer composed: its loop over a store or a rollout buffer, in this process or as a Ray
data-parallel group, with the publish gate; and `clawloop train`, the trainer alone.

`clawloop train` reads a store (e.g. a GPU box reading the store a serving box writes) or a rollout
buffer (`--source buffer`). Without a serving engine in the process there is nothing to publish to:
the trained weights reach serving through checkpoints (`--save-interval`), which `clawloop up
--resume-from-checkpoint DIR` serves. SIGINT/SIGTERM stop after the current step and write a
checkpoint. With `--ray auto|local --trainer-workers N` the steps run on a data-parallel group of Ray
actors (`distributed.trainer_group`)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

from clawloop.config import Config, ConfigError
from clawloop.naming import judge_name, model_path, open_store, store_exists, store_path
from clawloop.store import Store
from clawloop.trainer import PublishGate, Trainer, TrainerLoop, resolve_train_device
from clawloop.trainer.gate import Check, gate_checks
from clawloop.trainer.rehearsal import Rehearsal

log = logging.getLogger(__name__)


def buffer_source(cfg: Config, tokenizer: Any) -> Any:
    """`--source buffer`: the rollout buffer's finished groups as samples (else None: the store)."""
    if cfg.train.source != "buffer":
        return None
    from clawloop.buffer.source import BufferSource

    return BufferSource(cfg.train.buffer_url, tokenizer, estimator=cfg.train.advantage_estimator)


def _continue_numbering(store: Store | None, current: int) -> int:
    """Standalone on a store: the weights it writes continue the store's numbering, so a version names
    one set of weights per store once `clawloop up --resume-from-checkpoint` serves them."""
    top = store.max_policy_version() if store is not None else None
    return current if top is None else max(current, top + 1)


def build_loop(cfg: Config, engine: Any, store: Store | None, *, loop: asyncio.AbstractEventLoop | None = None,
               checks: list[Check] | None = None) -> TrainerLoop:
    """The trainer and its loop, resumed. With an engine (something to publish to) and the gate on, a
    `PublishGate` over `checks` (default: `gate_checks(cfg)`) measures its baseline here, on the weights
    served at start."""
    device = resolve_train_device(cfg.train.device, cfg.train.train_gpus)
    path = model_path(cfg)
    trainer = Trainer(cfg, path, tokenizer=getattr(engine, "tokenizer", None), device=device)
    if checks is None and engine is not None:
        checks = gate_checks(cfg, path)
    gate = PublishGate.from_config(cfg, checks) if engine is not None and checks is not None else None
    tl = TrainerLoop(cfg, trainer, store, engine, judge_name(cfg), loop=loop,
                     buffer_source=buffer_source(cfg, trainer.tokenizer), gate=gate)
    tl.resume()
    if tl.resumed_from is None and engine is not None:
        trainer.version = engine.policy_version  # the next publish is one past what is served (continue_versions)
    elif tl.resumed_from is None:
        trainer.version = _continue_numbering(store, trainer.version)
    if gate is not None:
        gate.begin(trainer, path)  # the baseline and the first rollback point: what is served now
    trainer.rehearsal = Rehearsal.from_config(cfg, path)
    if trainer.rehearsal is not None:
        trainer.rehearsal.build(trainer)  # right answers of the weights served now
    return tl


def build_ray_loop(cfg: Config, engine: Any, store: Store | None, *, loop: Any = None, group: Any = None) -> Any:
    """The trainer as a data-parallel group of Ray actors and its loop, resumed like `build_loop`."""
    from clawloop.distributed.trainer_group import RayTrainerLoop, TrainerGroup  # ray: imported only under --ray

    group = group or TrainerGroup.from_config(cfg)
    try:
        tok = getattr(engine, "tokenizer", None)
        if tok is None and cfg.train.source == "buffer":
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(group.model_path)
        tl = RayTrainerLoop(cfg, group, store, engine, judge_name(cfg), loop=loop,
                            buffer_source=buffer_source(cfg, tok))
        tl.resume()
        if tl.resumed_from is None and engine is not None:
            group.set_version(engine.policy_version)  # the next publish is one past what is served
        elif tl.resumed_from is None:
            group.set_version(_continue_numbering(store, group.version))
    except BaseException:
        group.shutdown()
        raise
    return tl


def run_train(cfg: Config, max_steps: int = 0, exit_when_idle: bool = False) -> int:
    """Train until interrupted, `max_steps` steps of this run (0: no limit), or, with `exit_when_idle`,
    until the source has nothing left to make a batch of."""
    store = None
    if cfg.train.source == "store":
        if not store_exists(cfg):
            raise ConfigError(f"data_dir: no store at {store_path(cfg)} (start `clawloop up` or import data first, "
                              "or name a shared one with --store postgresql://...)")
        store = open_store(cfg)
    ray_rt = None
    if cfg.ray.mode:  # `--ray auto|local --trainer-workers N`: the data-parallel group as Ray actors
        from clawloop.distributed.ray_runtime import RayRuntime

        ray_rt = RayRuntime(cfg)
    try:
        if ray_rt is not None and cfg.ray.trainer_workers > 0:
            ray_rt.check_fit(engine=False, judge=False, train=True)
            tl = build_ray_loop(cfg, None, store)
            print(f"clawloop train: {ray_rt.describe(engine=False)}", flush=True)
        else:
            tl = build_loop(cfg, None, store)
    except BaseException:
        if store is not None:
            store.close()
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
    warn_if_judged_elsewhere(cfg, store)
    try:
        while not stop.is_set():
            if tl.run_once():
                s = tl.trainer.last
                print(f"step {tl.trainer.step_count}: v{tl.trainer.version} samples={s.get('train/samples', 0):.0f} "
                      f"loss={s.get('train/loss', 0):.4f} grad_norm={s.get('train/grad_norm', 0):.3f} "
                      f"stale_dropped={s.get('train/stale_dropped', 0):.0f}", flush=True)
                if max_steps and tl.counts["steps"] >= max_steps:
                    break
            elif tl.consumed:
                continue  # a batch dropped as stale: read on at once (a backlog is not idle)
            elif exit_when_idle and (tl.fetch() or len(tl.pending) < cfg.train.rollout_batch_size):
                break
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


def warn_if_judged_elsewhere(cfg: Config, store: Store | None) -> str:
    """A trainer reads judgements by its judge's name; a store judged only under other names (e.g.
    `clawloop judge --custom-rm-path X`, then `clawloop train` without it) would give it nothing to
    train on, silently. Say so, naming the flag. Returns the warning ("" when none)."""
    if store is None:
        return ""
    mine = judge_name(cfg)
    names = store.judge_names()
    if not names or mine in names:
        return ""
    msg = (f"the store holds judgements only under {', '.join(repr(n) for n in sorted(names))}, and this trainer "
           f"reads those of {mine!r}: it will find nothing to train on. Pass the judge that wrote them: "
           + "; ".join(_flag_for(n) for n in sorted(names)))
    log.warning(msg)
    print(f"clawloop train: warning: {msg}", flush=True)
    return msg


def _flag_for(name: str) -> str:
    if name.startswith("custom:"):
        return f"--custom-rm-path {name[len('custom:'):]}"
    if name.startswith("url:"):
        return f"--judge url --judge-url URL --judge-model {name[len('url:'):]} (for {name!r})"
    return f"--judge {name}"
