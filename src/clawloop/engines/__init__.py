"""Inference engines behind the gateway: token ids in, (token id, logprob) out."""

from clawloop.engines.base import (Engine, EngineUnavailable, GenerationRequest, LoraAdapter, SamplingParams,
                                   TokenEvent)

__all__ = ["Engine", "EngineUnavailable", "GenerationRequest", "LoraAdapter", "SamplingParams", "TokenEvent",
           "make_engine"]


def make_engine(cfg) -> Engine:
    """Build the engine named by `cfg.model.backend` (imports lazily)."""
    backend = cfg.model.backend
    if backend == "hf":
        from clawloop.engines.hf import HFEngine

        return HFEngine.from_config(cfg)
    if backend == "vllm":
        from clawloop.engines.vllm import VLLMEngine

        return VLLMEngine.from_config(cfg)
    if backend == "bench":
        from clawloop.engines.bench import BenchEngine

        return BenchEngine.from_config(cfg)
    raise ValueError(f"model.backend: unknown backend {backend!r}")
