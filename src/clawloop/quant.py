"""A 4-bit base model (QLoRA): `model.load_in_4bit` (--load-in-4bit) loads the policy's linear layers as
bitsandbytes NF4 for the trainer and the hf engine, so a 4 B model's weights take about 0.6 byte per parameter
instead of 2 (bf16) or 4 (float32); LoRA adapters train on top in float32 and are what gets published.

One loader for both sides, so serving and training compute the same thing from the same bytes:
- NF4 with double quantization off (the block scales stay float32: what the trainer differentiates through
  is what the engine serves), compute in the model's dtype (float32 on CPU, bfloat16 on CUDA), embeddings,
  norms and the output layer unquantized, in that dtype;
- on CPU, bitsandbytes 0.50 repacks a layer's weights for its AVX512-BF16 inference kernel the first time the
  layer runs in eval mode without grad, and from then on computes it in bfloat16 through a path autograd
  does not see (`matmul_4bit` returns the kernel's output with no backward). A trainer that scored a
  batch under no_grad would then fail in its next backward (a layer with a bias: an in-place add on a
  leaf) or pass no gradient below the layer (one without), and an engine so packed drifts from the
  trainer by 0.015 nat on average, 0.13 at most, on the tiny model (bench/RESULTS.md). `_keep_unpacked`
  switches that repack off on every 4-bit layer of both models.

bitsandbytes is an optional dependency (`pip install -e '.[qlora]'`; `.[dev]` has it): imported lazily,
a missing one is a ConfigError naming the extra.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

BNB_VERSION = "0.50.2"
"""The bitsandbytes release this path is tested with (pyproject's `qlora` extra pins it)."""


def require_bitsandbytes() -> Any:
    """The bitsandbytes module, or a ConfigError that says how to install it."""
    from clawloop.config import ConfigError

    # its CPU backend warns at import that the optional `kernels` package (a hub download) is missing;
    # that kernel serves the AVX512-BF16 repacked path `_keep_unpacked` switches off
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes  # heavy optional dependency
    except ImportError as e:
        raise ConfigError(f"model.load_in_4bit: needs bitsandbytes ({e}); install it with "
                          f"pip install -e '.[qlora]' (bitsandbytes=={BNB_VERSION})") from e
    return bitsandbytes


def nf4_config(compute_dtype: torch.dtype) -> Any:
    """transformers' quantization config for an NF4 base computing in `compute_dtype`."""
    require_bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False,
                              bnb_4bit_compute_dtype=compute_dtype)


def load_4bit(model_cls: Any, path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """`model_cls.from_pretrained(path)` with NF4 linear layers on `device` (bitsandbytes places them while
    loading: a 4-bit model cannot be moved with `.to` afterwards), everything else in `dtype`."""
    model = model_cls.from_pretrained(path, dtype=dtype, quantization_config=nf4_config(dtype),
                                      device_map={"": str(device)})
    _keep_unpacked(model)
    return model


def _keep_unpacked(model: torch.nn.Module) -> int:
    """Switch off bitsandbytes' CPU inference repack on every 4-bit layer (module docstring); returns how
    many layers are 4-bit."""
    bnb = require_bitsandbytes()
    n = 0
    for mod in model.modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            mod.support_avx512bf16_for_cpu = False
            n += 1
    return n


def is_4bit(model: torch.nn.Module) -> bool:
    """Whether `model` was loaded by `load_4bit` (transformers marks it)."""
    return bool(getattr(model, "is_loaded_in_4bit", False))


def shared_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of the module tree that shares every parameter and buffer (and the 4-bit layers' block
    scales) with `model`: a second set of LoRA wrappers over the same base bytes costs kilobytes, not
    another model. Nothing of `model` changes when the copy's modules are replaced."""
    import copy

    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        memo[id(t)] = t
        qs = getattr(t, "quant_state", None)
        if qs is not None:
            memo[id(qs)] = qs
    for mod in model.modules():
        qs = getattr(mod, "quant_state", None)
        if qs is not None:
            memo[id(qs)] = qs
    return copy.deepcopy(model, memo)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers as they sit in memory (4-bit layers: the packed bytes
    plus their float32 block scales)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
        qs = getattr(t, "quant_state", None)
        if qs is not None and id(qs) not in seen:
            seen.add(id(qs))
            total += qs.absmax.numel() * qs.absmax.element_size() + qs.code.numel() * qs.code.element_size()
    return total
