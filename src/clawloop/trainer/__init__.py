"""The trainer: Binary RL, OPD and Combine over judged turns or rollout groups,
full or LoRA, with checkpoints, a publish gate and hitless weight publishing.

`Trainer` (core.py) steps; `TrainerLoop` (loop.py) feeds it from a store or a
rollout buffer and publishes; `PublishGate` (gate.py) checks a version before it
is served. How they are built and deployed (beside serving, alone on a store, as
a Ray group) is composed in `clawloop.apps`."""

from __future__ import annotations

from clawloop.trainer.core import Trainer, teacher_messages
from clawloop.trainer.device import resolve_train_device
from clawloop.trainer.gate import PublishGate
from clawloop.trainer.loop import TrainerLoop

__all__ = ["PublishGate", "Trainer", "TrainerLoop", "resolve_train_device", "teacher_messages"]
