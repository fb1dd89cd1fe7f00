"""The trainer: Binary RL, OPD and Combine over judged turns or rollout groups,
full or LoRA, with checkpoints and hitless weight publishing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from clawloop.trainer.core import Trainer, resolve_train_device, teacher_messages
from clawloop.trainer.loop import TrainerLoop

log = logging.getLogger(__name__)

__all__ = ["Trainer", "TrainerLoop", "attach_trainer", "judge_name_of", "resolve_train_device", "teacher_messages"]


def judge_name_of(cfg: Any) -> str:
    """The name the judge loop writes its verdicts under (what the trainer reads)."""
    from clawloop.naming import judge_name

    return judge_name(cfg)


def model_path_of(cfg: Any) -> str:
    if cfg.model.path:
        return cfg.model.path
    from clawloop.tinymodel.build import default_model_dir

    return str(default_model_dir())


def build_loop(cfg: Any, engine: Any, store: Any, *, loop: asyncio.AbstractEventLoop | None = None) -> TrainerLoop:
    device = resolve_train_device(cfg.train.device, cfg.train.train_gpus)
    trainer = Trainer(cfg, model_path_of(cfg), tokenizer=getattr(engine, "tokenizer", None), device=device)
    source = None
    if cfg.train.source == "buffer":
        from clawloop.buffer import BufferSource

        source = BufferSource(cfg.train.buffer_url, trainer.tokenizer, estimator=cfg.train.advantage_estimator)
    tl = TrainerLoop(cfg, trainer, store, engine, judge_name_of(cfg), loop=loop, buffer_source=source)
    tl.resume()
    if tl.resumed_from is None and engine is not None:
        trainer.version = engine.policy_version  # the next publish is one past what is served (runtime.continue_versions)
    elif tl.resumed_from is None and store is not None and hasattr(store, "max_policy_version"):
        # standalone on a store: the weights it writes continue the store's numbering, so a version
        # names one set of weights per store once `clawloop up --resume-from-checkpoint` serves them
        top = store.max_policy_version()
        if top is not None:
            trainer.version = max(trainer.version, top + 1)
    return tl


def attach_trainer(cfg: Any, engine: Any, store: Any, parts: dict[str, Any],
                   stats: list[Callable[[], dict[str, float]]], background: list[Callable[[], Any]]) -> None:
    """Wire the trainer into `clawloop up`: built and resumed at startup, its
    thread runs beside serving; at shutdown it stops and writes a checkpoint."""
    holder: dict[str, TrainerLoop] = {}

    def trainer_stats() -> dict[str, float]:
        tl = holder.get("loop")
        return tl.stats() if tl is not None else {}

    async def run() -> None:
        aloop = asyncio.get_running_loop()
        tl = await aloop.run_in_executor(None, lambda: build_loop(cfg, engine, store, loop=aloop))
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
