"""Weights as object-store payloads.

A state dict goes into Ray's object store once per publish (`ray.put`, or as the return value of
the rank-0 trainer actor's `served_weights`, which the driver then owns) and every engine replica
reads it from there: on the same node through shared memory without a copy (numpy buffers are
zero-copy in Ray; torch tensors are pickled), across nodes by one transfer per node. bfloat16 has
no numpy dtype, so such tensors travel as their raw 16-bit pattern and are viewed back on arrival.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np
import torch

MARK = "__clawloop_packed__"
_VIEWED = {torch.bfloat16: torch.int16}


def pack(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """{name: numpy array} (+ a marker and the dtypes numpy cannot hold) from CPU tensors."""
    out: dict[str, Any] = {MARK: {}}
    for k, v in sd.items():
        t = v.detach().to("cpu").contiguous()
        if t.dtype in _VIEWED:
            out[MARK][k] = str(t.dtype).removeprefix("torch.")
            t = t.view(_VIEWED[t.dtype])
        out[k] = t.numpy()
    return out


def is_packed(obj: Any) -> bool:
    return isinstance(obj, dict) and MARK in obj


def unpack(obj: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors over the payload's buffers (read-only object-store memory: load them into a model,
    which copies, and never modify them in place)."""
    dtypes = obj.get(MARK, {})
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # torch warns that the buffers are not writable: they are only read
        warnings.simplefilter("ignore", UserWarning)
        for k, v in obj.items():
            if k == MARK:
                continue
            t = torch.from_numpy(np.asarray(v))
            out[k] = t.view(getattr(torch, dtypes[k])) if k in dtypes else t
    return out


def nbytes(obj: Mapping[str, Any]) -> int:
    return int(sum(np.asarray(v).nbytes for k, v in obj.items() if k != MARK))
