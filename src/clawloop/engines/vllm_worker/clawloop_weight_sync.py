"""clawloop's vLLM worker extension: load published weights from a shared-memory image.

Runs *inside vLLM's workers* (the vLLM environment's Python, which does not have clawloop
installed): clawloop starts the servers it owns with

    PYTHONPATH=<this folder> ... --worker-extension-cls clawloop_weight_sync.WeightSync

and calls `clawloop_load_weights` through vLLM's `/collective_rpc` with one JSON string (the
endpoint passes strings only). The trainer side (`engines/vllm_publish.py`) has already copied
the weights into one file under /dev/shm; this reads them in place (a private mapping: no copy
until a tensor is loaded) and loads only the groups the manifest names:

- every group: vLLM's own in-place `reload_weights` with the tensors as an iterator (its
  layerwise reload re-runs the CPU GEMM packing and any other post-load processing);
- some groups ("send only what changed": a group is a decoder layer, the embedding, the final
  norm, the head): the same layerwise reload scoped to those submodules, so layers that did not
  change are neither touched nor warned about.

Returns what it did (tensors, bytes, seconds), so the trainer side can report the load's share
of a publish. Imports nothing from clawloop.
"""

from __future__ import annotations

import json
import mmap
import time

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
           "int64": "int64", "int32": "int32", "int8": "int8", "uint8": "uint8", "bool": "bool"}


def _views(path: str, tensors: list) -> tuple[list, object]:
    """(name, tensor view) for each manifest entry [name, dtype, shape, offset, nbytes], and the mapping."""
    import torch

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable for torch, never written back
    buf = torch.frombuffer(mm, dtype=torch.uint8) if len(mm) else torch.empty(0, dtype=torch.uint8)
    out = []
    for name, dtype, shape, offset, nbytes in tensors:
        if dtype not in _DTYPES:
            raise ValueError(f"clawloop_load_weights: {name}: unsupported dtype {dtype}")
        t = buf[offset:offset + nbytes].view(getattr(torch, _DTYPES[dtype])).view(shape)
        out.append((name, t))
    return out, mm


class WeightSync:
    """Mixed into vLLM's worker class (`--worker-extension-cls`); `self` is the worker."""

    def clawloop_load_weights(self, manifest: str) -> dict:
        from vllm.config import set_current_vllm_config

        m = json.loads(manifest)
        t0 = time.perf_counter()
        views, mm = _views(m["path"], m["tensors"])
        nbytes = sum(e[4] for e in m["tensors"])
        t1 = time.perf_counter()
        scopes = m.get("scopes")  # None: every group (the whole model)
        if scopes is None:
            self.reload_weights(weights_iterator=iter(views), is_checkpoint_format=True)
        else:
            from vllm.model_executor.model_loader.reload.layerwise import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )

            runner = self.model_runner
            model = runner.get_model()
            subs = [model.get_submodule(s) for s in scopes]  # raises for a name that is not a module
            with set_current_vllm_config(self.vllm_config):
                for s in subs:
                    initialize_layerwise_reload(s)
                try:
                    model.load_weights(iter(views))
                finally:
                    for s in subs:
                        finalize_layerwise_reload(s, self.vllm_config.model_config)
            for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
                if hasattr(runner, reset):  # what vLLM's reload_weights resets after a reload
                    getattr(runner, reset)()
        t2 = time.perf_counter()
        del views
        try:
            mm.close()
        except BufferError:  # a view is still referenced somewhere: the mapping goes with it
            pass
        return {"tensors": len(m["tensors"]), "bytes": nbytes, "map_s": t1 - t0, "load_s": t2 - t1}
