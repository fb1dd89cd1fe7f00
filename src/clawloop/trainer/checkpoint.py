"""Atomic checkpoints: HF weights (or the peft adapter), optimizer, trainer state
and the store cursor, written to a temp dir and renamed into place, then
`latest` is replaced atomically. A kill mid-write leaves the previous
checkpoint and `latest` intact. Checkpoints do not depend on where the trainer
ran: everything is loaded onto the CPU first and then into the trainer's
model and optimizer, wherever those live (a CUDA run resumes on a CPU box, an
offloaded optimizer's state stays in CPU memory).

    save_dir/
      step_000012/  model/ (or adapter/), optimizer.pt, trainer_state.json,
                    pending_samples.jsonl (rollout-buffer samples read, not yet trained)
      latest        "step_000012"

The cursor saved is the trainer loop's committed one (see `trainer/loop.py`),
so a resume reads again exactly what was read and not yet trained.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from clawloop.records import Sample

log = logging.getLogger(__name__)
KEEP = 3
PENDING = "pending_samples.jsonl"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(trainer: Any, save_dir: str | Path, *, cursor: int, extra: dict | None = None,
                    pending: list[Sample] | None = None) -> Path:
    """Write a checkpoint of `trainer` (and the samples still `pending`, when given) atomically."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    name = f"step_{trainer.step_count:06d}"
    final = save_dir / name
    tmp = save_dir / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if trainer.use_lora:
        trainer.model.save_pretrained(tmp / "adapter")
    else:
        trainer.model.save_pretrained(tmp / "model")
        trainer.tokenizer.save_pretrained(tmp / "model")
    torch.save(trainer.opt.state_dict(), tmp / "optimizer.pt")
    state = {
        "step": trainer.step_count, "policy_version": trainer.version, "cursor": int(cursor),
        "use_lora": trainer.use_lora, "method": trainer.tc.method, "base_model": trainer.model_path,
        "tokens_trained": trainer.tokens_trained, "saved_at": time.time(),
        "reward_history": list(getattr(trainer, "reward_history", [])),  # the mean baseline's window
        "eps_state": list(getattr(trainer, "eps_state", [0.0, 0])),  # the relative eps's gradient scale
        "torch_rng": torch.get_rng_state().tolist(), "py_rng": repr(random.getstate()),
        **(extra or {}),
    }
    if trainer.device.type == "cuda":  # LoRA dropout draws from the device's generator
        state["cuda_rng"] = torch.cuda.get_rng_state(trainer.device).tolist()
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    if pending:
        with (tmp / PENDING).open("w") as f:
            for smp in pending:
                f.write(json.dumps(dataclasses.asdict(smp)) + "\n")
    _fsync_dir(tmp)
    if final.exists():  # same step saved twice (e.g. interval + shutdown): replace
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = save_dir / f".latest-{os.getpid()}"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, save_dir / "latest")
    _fsync_dir(save_dir)
    steps = sorted(p for p in save_dir.glob("step_*") if p.is_dir())
    for old in steps[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s (policy v%d, cursor %d)", final, trainer.version, cursor)
    return final


def resolve_checkpoint(spec: str, save_dir: str | Path) -> Path | None:
    """`latest` (or empty: latest if any) -> the dir `latest` names; a path -> itself."""
    if spec and spec != "latest":
        p = Path(spec)
        if p.is_dir() and (p / "latest").exists() and not (p / "trainer_state.json").exists():
            p = p / (p / "latest").read_text().strip()
        if not (p / "trainer_state.json").exists():
            from clawloop.config import ConfigError

            raise ConfigError(f"train.resume_from_checkpoint: {spec} is not a checkpoint (no trainer_state.json)")
        return p
    latest = Path(save_dir) / "latest"
    if not latest.exists():
        if spec == "latest":
            log.warning("--resume-from-checkpoint latest: no checkpoint in %s yet; starting fresh", save_dir)
        return None
    return Path(save_dir) / latest.read_text().strip()


def load_checkpoint(trainer: Any, path: Path) -> dict[str, Any]:
    """Restore weights, optimizer and counters into `trainer`; returns the state."""
    state = json.loads((path / "trainer_state.json").read_text())
    if bool(state.get("use_lora")) != trainer.use_lora:
        from clawloop.config import ConfigError

        raise ConfigError(f"train.use_lora: checkpoint {path} was trained with use_lora={state.get('use_lora')}, "
                          f"this run has use_lora={trainer.use_lora}")
    if trainer.use_lora:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        f = path / "adapter" / "adapter_model.safetensors"
        res = set_peft_model_state_dict(trainer.model, load_file(str(f)))
        unexpected = getattr(res, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"checkpoint {path}: adapter keys do not match ({unexpected[:3]})")
    else:
        from clawloop.engines.hf import load_state_dict_from_dir

        if getattr(trainer, "images", None) is not None:  # a VLM saves other names than its modules hold
            sd = type(trainer.model).from_pretrained(str(path / "model"), dtype=torch.float32).state_dict()
        else:
            sd = load_state_dict_from_dir(path / "model")
        missing, unexpected = trainer.model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint {path}: weights do not match (missing={missing[:3]}, "
                             f"unexpected={unexpected[:3]})")
    trainer.reload_masters()
    # load_state_dict moves each state tensor to its parameter's device: the GPU, or CPU masters
    trainer.opt.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    trainer.step_count = int(state["step"])
    trainer.version = int(state["policy_version"])
    trainer.tokens_trained = int(state.get("tokens_trained", 0))
    if hasattr(trainer, "reward_history"):
        trainer.reward_history.clear()
        trainer.reward_history.extend(float(x) for x in state.get("reward_history", []))
    if hasattr(trainer, "eps_state") and "eps_state" in state:
        trainer.eps_state[:] = [float(state["eps_state"][0]), int(state["eps_state"][1])]
    if "torch_rng" in state:
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    if "cuda_rng" in state and trainer.device.type == "cuda":
        torch.cuda.set_rng_state(torch.tensor(state["cuda_rng"], dtype=torch.uint8), trainer.device)
    return state


def load_pending_samples(path: Path) -> list[Sample]:
    """The samples a checkpoint says were read and not yet trained ([] when none)."""
    f = Path(path) / PENDING
    if not f.exists():
        return []
    with f.open() as fh:
        return [Sample(**json.loads(line)) for line in fh if line.strip()]


def weights_fingerprint(sd: dict[str, torch.Tensor]) -> float:
    """A cheap checksum to compare served and trained weights."""
    total = 0.0
    for k in sorted(sd):
        v = sd[k]
        if v.is_floating_point():
            total += float(v.double().sum()) + 1e-3 * float(v.double().abs().sum())
    return total
