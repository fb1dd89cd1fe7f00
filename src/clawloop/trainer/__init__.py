"""The trainer: Binary RL, OPD and Combine over judged turns or rollout groups,
full or LoRA, with checkpoints, a publish gate and hitless weight publishing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from clawloop.naming import judge_name, model_path
from clawloop.trainer.core import Trainer, teacher_messages
from clawloop.trainer.device import resolve_train_device
from clawloop.trainer.gate import Check, PublishGate, gate_checks
from clawloop.trainer.loop import TrainerLoop

log = logging.getLogger(__name__)

__all__ = ["PublishGate", "Trainer", "TrainerLoop", "attach_trainer", "resolve_train_device", "teacher_messages"]


def build_loop(cfg: Any, engine: Any, store: Any, *, loop: asyncio.AbstractEventLoop | None = None,
               checks: list[Check] | None = None) -> TrainerLoop:
    """The trainer and its loop, resumed. With an engine (something to publish to) and the gate on, a
    `PublishGate` over `checks` (default: `gate_checks(cfg)`) measures its baseline here, on the weights
    served at start."""
    device = resolve_train_device(cfg.train.device, cfg.train.train_gpus)
    trainer = Trainer(cfg, model_path(cfg), tokenizer=getattr(engine, "tokenizer", None), device=device)
    if checks is None and engine is not None:
        checks = gate_checks(cfg, model_path(cfg))
    gate = PublishGate.from_config(cfg, checks) if engine is not None and checks is not None else None
    source = None
    if cfg.train.source == "buffer":
        from clawloop.buffer import BufferSource

        source = BufferSource(cfg.train.buffer_url, trainer.tokenizer, estimator=cfg.train.advantage_estimator)
    tl = TrainerLoop(cfg, trainer, store, engine, judge_name(cfg), loop=loop, buffer_source=source, gate=gate)
    tl.resume()
    if tl.resumed_from is None and engine is not None:
        trainer.version = engine.policy_version  # the next publish is one past what is served (runtime.continue_versions)
    elif tl.resumed_from is None and store is not None and hasattr(store, "max_policy_version"):
        # standalone on a store: the weights it writes continue the store's numbering, so a version
        # names one set of weights per store once `clawloop up --resume-from-checkpoint` serves them
        top = store.max_policy_version()
        if top is not None:
            trainer.version = max(trainer.version, top + 1)
    if gate is not None:
        gate.begin(trainer, model_path(cfg))  # the baseline and the first rollback point: what is served now
    return tl


def attach_trainer(cfg: Any, engine: Any, store: Any, parts: dict[str, Any],
                   stats: list[Callable[[], dict[str, float]]], background: list[Callable[[], Any]]) -> None:
    """Wire the trainer into `clawloop up`: built and resumed at startup, its
    thread runs beside serving; at shutdown it stops and writes a checkpoint.
    The publish gate's checks are loaded here, before serving starts, so a bad
    --regression-set stops `clawloop up` with a config error."""
    holder: dict[str, TrainerLoop] = {}
    checks = gate_checks(cfg, model_path(cfg))

    def trainer_stats() -> dict[str, float]:
        tl = holder.get("loop")
        return tl.stats() if tl is not None else {}

    async def run() -> None:
        aloop = asyncio.get_running_loop()
        tl = await aloop.run_in_executor(None, lambda: build_loop(cfg, engine, store, loop=aloop, checks=checks))
        holder["loop"] = tl
        parts["trainer"] = tl
        if tl.resumed_from:
            await aloop.run_in_executor(None, tl.publish_resumed)
        tl.start()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(aloop.run_in_executor(None, tl.stop))

    stats.append(trainer_stats)
    background.append(run)
