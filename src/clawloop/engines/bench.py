"""The bench engine: tokens of the real tokenizer at a set pace, with no model behind them.

    clawloop serve --backend bench --model-path DIR [--model-bench-step-ms 20] [--model-bench-tokens-per-step 1]
                   [--model-bench-completion-tokens 0]

For load tests of everything but the model: the gateway (parsing, rendering, capture, streaming, the
store's writer), clients, balancers. It takes the model folder's tokenizer (and chat template) and no
weights; every request is answered with the ids of a fixed English passage, cycled, each with a
logprob (and top logprobs by id when asked), then the eos id -- or `length` at `max_tokens`. A step
emits `tokens_per_step` tokens to a request as one event list (`generate_chunks`, the shape a busy
vLLM's multi-token stream messages have) and then waits `step_ms`; 0 ms emits as fast as the event
loop lets it, so what is measured is the gateway alone.

What it honours: `max_tokens`, stop ids (one in the passage ends the completion), `top_logprobs`,
cancellation (a consumer that leaves stops its stream), `publish` (the version advances at once, the
weights are ignored). What it does not: sampling parameters, seeds, penalties, logit bias, grammar
constraints, images -- the ids do not depend on them (a constraint is refused, so no test believes a
grammar was followed).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from clawloop.engines.base import GenerationRequest, LoraAdapter, TokenEvent

PASSAGE = (
    "The gateway renders the messages with the chat template once, sends the ids to the engine, and "
    "streams back what it samples. Every main turn is captured token-exact: the ids, their logprobs and "
    "the version of the weights that produced them. The next request of the same session tells the judge "
    "how the turn was received, and the trainer learns from the score while the model keeps serving. "
    "Numbers like 12+7=19, names like Zoë and Ångström, and code like `def f(x): return x * 2` appear too. "
)
"""What every completion says (cycled): ordinary text with digits, non-ASCII letters and code, so
incremental detokenizing has multi-byte characters to get right."""


class BenchEngine:
    """The Engine protocol with no model: see the module docstring."""

    supports_images = False

    def __init__(self, model_path: str | Path, *, step_ms: float = 0.0, tokens_per_step: int = 1,
                 completion_tokens: int = 0, policy_version: int = 0):
        from transformers import AutoTokenizer

        if tokens_per_step < 1:
            raise ValueError(f"model.bench_tokens_per_step: {tokens_per_step} (at least 1)")
        if step_ms < 0 or completion_tokens < 0:
            raise ValueError("model.bench_step_ms and model.bench_completion_tokens: 0 or more")
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.step_s = step_ms / 1000.0
        self.tokens_per_step = tokens_per_step
        self.completion_tokens = completion_tokens
        self.eos_token_ids = frozenset([self.tokenizer.eos_token_id]) if self.tokenizer.eos_token_id is not None \
            else frozenset()
        self.vocab_size = len(self.tokenizer)
        self.passage = [t for t in self.tokenizer.encode(PASSAGE, add_special_tokens=False)
                        if t not in self.eos_token_ids]
        self._version = policy_version
        self._running = False
        self.requests = self.tokens = self.steps = self.publishes = self.active = 0

    @classmethod
    def from_config(cls, cfg: Any) -> "BenchEngine":
        from clawloop.naming import model_path

        path = model_path(cfg)
        if not Path(path).exists():
            raise FileNotFoundError(f"model.path: {path} does not exist (--backend bench reads its tokenizer)")
        m = cfg.model
        return cls(path, step_ms=m.bench_step_ms, tokens_per_step=m.bench_tokens_per_step,
                   completion_tokens=m.bench_completion_tokens)

    @property
    def policy_version(self) -> int:
        return self._version

    def relabel(self, version: int) -> None:
        self._version = int(version)

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False

    @staticmethod
    def logprob(k: int) -> float:
        """The logprob reported for the k-th response token (deterministic, varied, negative)."""
        return -0.05 - 0.01 * (k % 37)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        async for events in self.generate_chunks(request):
            for ev in events:
                yield ev

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[TokenEvent]]:
        """The events of each step as one list (the last event carries the finish reason)."""
        if not self._running:
            raise RuntimeError("engine is not started")
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        p = request.params
        if p.constraint is not None:
            raise ValueError("--backend bench does not follow grammar constraints (response_format, constrained "
                             "tool calls); use --backend hf or vllm, or --constrain-tool-calls false")
        if request.multimodal is not None:
            raise ValueError("images are not supported by --backend bench")
        stops = frozenset(p.stop_token_ids) | self.eos_token_ids
        eos = min(self.eos_token_ids) if self.eos_token_ids else None
        limit = max(0, p.max_tokens)
        says = self.completion_tokens or math.inf
        version, k = self._version, 0
        passage, n_passage = self.passage, len(self.passage)
        top_k = p.top_logprobs
        self.requests += 1
        self.active += 1
        try:
            while True:
                out: list[TokenEvent] = []
                finish = None
                for _ in range(self.tokens_per_step):
                    if k >= limit:
                        finish = "length"
                        break
                    tid = passage[k % n_passage] if k < says or eos is None else eos
                    lp = self.logprob(k)
                    top = None
                    if top_k:
                        top = [(tid, lp)] + [((tid + j) % self.vocab_size, lp - j) for j in range(1, top_k)]
                    out.append(TokenEvent(tid, lp, top, policy_version=version))
                    k += 1
                    if tid in stops:
                        finish = "stop"
                        break
                if finish is not None:
                    if out:
                        out[-1].finish_reason = finish
                    else:
                        out.append(TokenEvent(None, 0.0, finish_reason=finish, policy_version=version))
                self.tokens += len(out)
                self.steps += 1
                yield out
                if finish is not None:
                    return
                await asyncio.sleep(self.step_s)  # 0: one turn of the event loop, as a stream's await would
        finally:
            self.active -= 1

    async def publish(self, weights: Mapping[str, Any] | str | LoraAdapter, version: int) -> None:
        """The weights are ignored; requests that start after this returns report `version`."""
        self._version = int(version)
        self.publishes += 1

    def stats(self) -> dict[str, float]:
        return {"engine/active_rows": float(self.active), "engine/tokens_generated": float(self.tokens),
                "engine/decode_steps": float(self.steps), "engine/requests": float(self.requests),
                "engine/publishes": float(self.publishes), "engine/policy_version": float(self._version)}
