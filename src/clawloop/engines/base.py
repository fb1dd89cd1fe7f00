"""The Engine protocol: what the gateway, the judge and the trainer need from an
inference engine, shaped so vLLM and SGLang fit it as well as the in-process
transformers engine.

Token ids in, a stream of `TokenEvent`s out. The last event of a stream carries
`finish_reason`. Logprobs are those of the sampled ids under the *unmodified*
model distribution (temperature 1, no top-p), which is what the trainer
recomputes; temperature, top-p, penalties and logit bias only shape sampling.
The one exception is a grammar constraint (`SamplingParams.constraint`): tokens
the grammar forbids were never possible, so logprobs are renormalised over the
allowed ones.

`publish(weights, version)` swaps the served weights without refusing or
interrupting anything: requests in flight finish on the weights they started
with, requests that arrive after the call returns get `version`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    """Generation ends after one of these is sampled (the eos id is always added)."""
    seed: int | None = None
    top_logprobs: int = 0
    """How many alternatives per position to report (0: none)."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    """OpenAI's penalties over the tokens generated so far (not the prompt), as vLLM applies them:
    logit -= presence * [count > 0] + frequency * count. They shape sampling only."""
    logit_bias: dict[int, float] | None = None
    """Added to the logits of these ids before sampling (sampling only, like the penalties)."""
    min_tokens: int = 0
    """The stop ids (eos and `stop_token_ids`) cannot be sampled before this many tokens were generated
    (vLLM's `min_tokens`; sampling only, like the penalties: the reported logprobs are the model's)."""
    constraint: dict[str, Any] | None = None
    """A structural tag (xgrammar's format: `{"type": "structural_tag", "format": {...}}`) every
    sampled token must keep valid; vLLM takes the same object as `structured_outputs.structural_tag`.
    Under a constraint the reported logprobs are those of the constrained distribution: the model's
    at temperature 1 renormalised over the tokens the grammar allows (what vLLM reports too)."""
    close_within: int = 0
    """Under a constraint, in the last this-many tokens of max_tokens while the output is inside an
    unclosed JSON value, choose the likeliest allowed token that closes it (`"`, `}`, `]`) so the
    JSON ends within the budget (engines/grammar.py); 0: never. The hf engine honours it."""


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    session_id: str | None = None
    """Routing key: engines with several replicas keep a session on one (warm prefix cache)."""
    multimodal: Any = None
    """Pixel inputs for the image placeholders in `prompt_ids`, as the engine's own `prepare_images`
    made them (opaque to everyone else); None for text-only prompts."""
    stream: bool = True
    """False: the caller wants the whole response only (a client that did not ask for a stream); an
    engine may then produce it in one piece (vLLM: one non-streamed call, no per-token messages)."""


@dataclass
class TokenEvent:
    token_id: int | None
    """None only on a closing event that carries no token (e.g. max_model_len hit)."""
    logprob: float
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None
    """`stop` (eos / stop id) or `length` on the last event; None before."""
    policy_version: int = 0
    """The version of the weights that produced this token (as far as known when it is emitted)."""
    version_spans: list[tuple[int, int, int]] | None = None
    """On the last event only, from engines that swap weights under running requests (vLLM):
    authoritative `(start, end, version)` spans over the response's token indexes; they override
    the per-event `policy_version`s."""


@dataclass
class LoraAdapter:
    """A LoRA adapter to publish as is (engines that hot-load adapters: vLLM); other engines get
    the merged full weights instead. `state_dict` uses peft's saved names; `config` is peft's
    `adapter_config.json` content."""

    state_dict: Mapping[str, Any]
    config: dict[str, Any]


class EngineUnavailable(RuntimeError):
    """No replica can take the request right now (starting, crashed, restarting). The gateway
    answers 503 with `Retry-After`; nothing is captured for the request."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ImageInputError(ValueError):
    """An image the engine could not use (`prepare_images`): `index` is its position in the list given."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


@runtime_checkable
class Engine(Protocol):
    tokenizer: Any
    """A HF tokenizer with a chat template (used by the gateway to render prompts)."""

    @property
    def policy_version(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Stream the sampled tokens. Cancelling the consumer aborts the request."""
        ...

    async def publish(self, weights: Mapping[str, Any] | str | LoraAdapter, version: int) -> None:
        """Serve `weights` (a state dict of full weights, a HF folder path, or a `LoraAdapter`
        where `accepts_lora_adapters` is true) as `version`."""
        ...

    def stats(self) -> dict[str, float]: ...


# -- optional capabilities ------------------------------------------------------------------------
# What only some engines can do, each a Protocol, so a caller asks `isinstance(engine, Relabels)`
# by name instead of probing attributes, and a new engine knows what it may offer.


@runtime_checkable
class Relabels(Protocol):
    """Can rename the served weights' version without a publish (a fresh start on a store whose turns
    already go past the base weights' number: `apps.serve.continue_versions`)."""

    def relabel(self, version: int) -> None: ...


@runtime_checkable
class StreamsChunks(Protocol):
    """`generate_chunks` yields the events that are ready together as one list (a vLLM stream message
    carrying several tokens, one step of a batch): the gateway then records them, detokenizes and
    sends the client one chunk per list instead of one per token. Same events, same order, as
    `generate`."""

    def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[TokenEvent]]: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """Several replicas or actors: `health()` is /health's body part (each one's state, restarts)."""

    def health(self) -> dict[str, Any]: ...


@runtime_checkable
class HasActors(Protocol):
    """A router over Ray actors: /health lists `actor_sources`' actors beside its own, and the cluster's
    state from `cluster_info`."""

    actor_sources: list[Any]
    cluster_info: Any


@runtime_checkable
class AcceptsLora(Protocol):
    """`accepts_lora_adapters` True: `publish` takes a `LoraAdapter` as is (vLLM hot-loads it); else the
    trainer sends merged full weights."""

    accepts_lora_adapters: bool


@runtime_checkable
class HoldsWeights(Protocol):
    """The weights live in this process: `state_dict()` is what is served now (the publish gate's
    rollback point, without a copy from disk)."""

    def state_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class ReadsObjectStore(Protocol):
    """Engine actors that fetch published weights from Ray's object store themselves (`weights_ref`)."""

    weights_ref: Any


@runtime_checkable
class TakesImages(Protocol):
    """A vision-language model served: see `prepare_images` below."""

    supports_images: bool

    def prepare_images(self, prompt_ids: list[int], images: list[Any]) -> tuple[list[int], Any]: ...


# Engines that take images (the in-process HF engine serving a vision-language model) also have:
#
#     supports_images: bool
#         True when the served model takes image inputs. An engine without the attribute takes none
#         (the gateway refuses image parts for it).
#     prepare_images(prompt_ids, images) -> (prompt_ids, multimodal)
#         Thread-safe and blocking (the gateway runs it off the event loop). `prompt_ids` is the rendered
#         prompt with one image placeholder id per image (as the chat template writes it), `images` the
#         encoded image files (bytes) in the same order. Returns the prompt with each placeholder expanded
#         as the model's processor expands it -- the ids the engine sees and capture stores -- and the
#         pixel inputs to pass as `GenerationRequest.multimodal`. Raises `ImageInputError` for an image
#         it cannot use and ValueError when placeholders and images do not match.
