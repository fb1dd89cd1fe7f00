"""The one record family that crosses every boundary: Turn, Judgement, Sample.

The gateway writes Turns, the judge writes Judgements, the trainer eats Samples.
Token ids are captured at serve time and carried through unchanged; nothing
downstream re-tokenizes text.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

TURN_MAIN = "main"
TURN_SIDE = "side"


@dataclass
class Turn:
    """One assistant completion as the engine produced it."""

    session_id: str
    index: int
    """Position of this turn among the session's turns (main and side)."""
    type: str = TURN_MAIN
    """`main` turns train; `side` turns (heartbeats, utility calls) are stored only."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The request's messages, as the client sent them (session fields stripped)."""
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] = field(default_factory=list)
    """Prompt token ids exactly as rendered by the chat template (tools included)."""
    response_ids: list[int] = field(default_factory=list)
    """Token ids the engine sampled, stop/eos token included when one was sampled."""
    response_logprobs: list[float] = field(default_factory=list)
    """Logprob of each sampled id under the serving policy; one per response id."""
    response_text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str = "stop"
    policy_version: int = 0
    """The version that produced the first response token (the oldest, when a publish fell mid-response)."""
    response_versions: list[int] | None = None
    """Version of the weights that produced each response id (one per id); None: all `policy_version`.
    Differs within a turn only when an engine swapped weights mid-response (vLLM pause/reload/resume)."""
    next_state: dict[str, Any] | None = None
    """`{"role", "content"}` of what followed: the user's reply or the tool result."""
    final: bool = False
    """True when the session closed after this turn (judge it without a next state)."""
    trainable: bool = True
    request_id: str = ""
    choice_index: int = 0
    created_at: float = field(default_factory=time.time)
    next_state_at: float | None = None
    id: int | None = None
    """Row id in the store; None until stored."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Judgement:
    """A judge's verdict on one turn."""

    turn_id: int
    score: int
    """+1 (success / progress), -1 (correction, redo, error), 0 (ambiguous)."""
    votes: list[int | None] = field(default_factory=list)
    """Individual votes; None for a malformed vote."""
    hint: str | None = None
    """For on-policy distillation: what the assistant should have done."""
    judge: str = "offline"
    """Name of the judge configuration; a turn is judged once per name."""
    latency_s: float = 0.0
    malformed: int = 0
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Sample:
    """What the trainer eats: one sequence with its loss mask and signals."""

    tokens: list[int]
    """prompt_ids + response_ids."""
    loss_mask: list[int]
    """1 on response tokens that train, 0 elsewhere; len == len(tokens)."""
    rollout_logprobs: list[float]
    """Engine logprobs aligned with tokens (0.0 where loss_mask is 0)."""
    prompt_len: int
    reward: float | None = None
    """Scalar score (Binary RL); None when the sample has no usable score."""
    advantages: list[float] | None = None
    """Optional per-token advantages, aligned with tokens."""
    teacher_logprobs: list[float] | None = None
    """OPD teacher logprobs of the sampled tokens, aligned with tokens."""
    hint: str | None = None
    policy_version: int = 0
    group_id: str | None = None
    """Samples sharing a group id were drawn for the same prompt (n > 1)."""
    turn_id: int | None = None
    messages: list[dict[str, Any]] | None = None
    """The prompt messages (needed to build the OPD teacher prompt)."""
    tools: list[dict[str, Any]] | None = None

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @classmethod
    def from_turn(cls, turn: Turn, judgement: Judgement | None = None) -> "Sample":
        tokens = list(turn.prompt_ids) + list(turn.response_ids)
        n_prompt = len(turn.prompt_ids)
        mask = [0] * n_prompt + [1] * len(turn.response_ids)
        resp_lps = list(turn.response_logprobs)
        if len(resp_lps) != len(turn.response_ids):  # imported without engine logprobs: none to correct with
            resp_lps = [0.0] * len(turn.response_ids)
        lps = [0.0] * n_prompt + resp_lps
        return cls(
            tokens=tokens,
            loss_mask=mask,
            rollout_logprobs=lps,
            prompt_len=n_prompt,
            reward=float(judgement.score) if judgement is not None else None,
            hint=judgement.hint if judgement is not None else None,
            policy_version=turn.policy_version,
            turn_id=turn.id,
            messages=turn.messages,
            tools=turn.tools,
        )
