"""Inference engines behind the gateway: token ids in, (token id, logprob) out."""

from clawloop.engines.base import (Engine, EngineUnavailable, GenerationRequest, LoraAdapter, SamplingParams,
                                   TokenEvent)

__all__ = ["Engine", "EngineUnavailable", "GenerationRequest", "LoraAdapter", "SamplingParams", "TokenEvent",
           "make_engine"]


def make_engine(cfg) -> Engine:
    """Build the engine named by `cfg.model.backend` (imports lazily: vLLM is GPU-only)."""
    backend = cfg.model.backend
    if backend == "hf":
        from clawloop.engines.hf import HFEngine

        return HFEngine.from_config(cfg)
    if backend in ("vllm", "sglang"):
        raise RuntimeError(
            f"--backend {backend} is not available in this build: the {backend} engine needs a CUDA "
            "machine and is not implemented yet; use --backend hf"
        )
    raise ValueError(f"model.backend: unknown backend {backend!r}")
