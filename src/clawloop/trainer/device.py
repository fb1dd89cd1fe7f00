"""Where the trainer runs and how fast it learns by default: `train.device` / TRAIN_GPUS to one torch
device, and `train.lr` 0 to a rate by model size. Pure functions; `Trainer` calls them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)


def resolve_train_device(device: str = "auto", train_gpus: Sequence[Any] = ()) -> torch.device:
    """The trainer's device from `train.device` and `train.train_gpus` (TRAIN_GPUS).

    auto: cuda when torch sees a CUDA device, else cpu. auto or cuda with TRAIN_GPUS: cuda:<first
    id>; with several ids only the first is used until data-parallel training exists. Plain cuda
    without TRAIN_GPUS is cuda:0. cuda:N names the device itself (a TRAIN_GPUS that disagrees is
    ignored, with a warning). Ids count the GPUs this process sees, so CUDA_VISIBLE_DEVICES
    renumbers them. Asking for cuda where torch sees none is a ConfigError, not a silent CPU run.
    """
    from clawloop.config import ConfigError

    dev = str(device).strip().lower()
    gpus = [str(g).strip() for g in train_gpus if str(g).strip()]
    if dev not in ("auto", "cpu", "cuda") and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        raise ConfigError(f"train.device: must be auto, cpu, cuda or cuda:N, got {device!r}")
    bad = [g for g in gpus if not g.isdigit()]
    if bad:
        raise ConfigError(f"train.train_gpus: must be GPU ids like 0,1, got {bad[0]!r}")
    if dev == "cpu":
        if gpus:
            log.warning("train.device is cpu: TRAIN_GPUS=%s ignored", ",".join(gpus))
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if dev != "auto":
            raise ConfigError(f"train.device: {dev} asked for, but torch sees no CUDA device "
                              "(use --train-device cpu or auto)")
        if gpus:
            log.warning("TRAIN_GPUS=%s, but torch sees no CUDA device: the trainer runs on cpu", ",".join(gpus))
        return torch.device("cpu")
    key = "train.device"
    if dev.startswith("cuda:"):
        index = int(dev[5:])
        if gpus and int(gpus[0]) != index:
            log.warning("train.device %s and TRAIN_GPUS=%s disagree: the trainer uses %s", dev, ",".join(gpus), dev)
    elif gpus:
        key, index = "train.train_gpus", int(gpus[0])
        if len(gpus) > 1:
            log.warning("TRAIN_GPUS=%s: the trainer uses cuda:%d only (no data-parallel training yet)",
                        ",".join(gpus), index)
    else:
        index = 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{key}: cuda:{index} does not exist, torch sees {count} CUDA device(s)")
    return torch.device("cuda", index)


def auto_lr(n_params: int, lora: bool) -> float:
    """`train.lr` 0: a LoRA adapter 1e-4; full fine-tuning 5e-4 under 10 M parameters (the shipped 1.1 M tiny
    model, which 1e-5 leaves unchanged over the persona evaluation's 16 updates and 2e-4 teaches a persona's
    form too slowly; with the publish gate's backoff a step that costs skill is retried shorter), else 1e-5,
    the usual rate for online RL on a real model. A rate the user sets is used as it is."""
    if lora:
        return 1e-4
    return 5e-4 if n_params < 10_000_000 else 1e-5
