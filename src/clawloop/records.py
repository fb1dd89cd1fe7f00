"""The one record family that crosses every boundary: Turn, Judgement, Sample.

The gateway writes Turns, the judge writes Judgements, the trainer eats Samples.
Token ids are captured at serve time and carried through unchanged; nothing
downstream re-tokenizes text.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

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
    """The answer's content (a thinking model's reasoning is in `reasoning`, not here)."""
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
    tenant: str = ""
    """The API key's tenant name that served this turn ("" when the server has no keys)."""
    sampling: dict[str, Any] | None = None
    """How the response was sampled: `temperature`, `top_p`, `seed`, and `logprobs` (the convention of
    `response_logprobs`: "raw" = the unmodified distribution at temperature 1)."""
    request_id: str = ""
    choice_index: int = 0
    reasoning: str | None = None
    """A thinking model's reasoning as the client got it (`reasoning_content`); None: the reply had none."""
    reasoning_end: int | None = None
    """How many of `response_ids` are reasoning, its closing marker (`</think>`) included; the answer
    starts there. `len(response_ids)` when the reply ended still reasoning; None without reasoning.
    The ids themselves are all sampled ones, and all of them train."""
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
    hint_candidates: list[str] | None = None
    """Every usable hint the votes produced, `hint` among them (the trainer's `--hint-selection overlap`
    picks one); None: `hint` is the only one."""
    judge: str = "offline"
    """Name of the judge configuration; a turn is judged once per name."""
    latency_s: float = 0.0
    malformed: int = 0
    created_at: float = field(default_factory=time.time)
    reward: float | None = None
    """The continuous reward behind `score`, when the judge has one (a custom reward model's 0.3, a
    PRM's probability); `score` is then its sign, for votes and metrics. None: the reward is `score`.
    `Sample.from_turn` carries it to `Sample.reward`, what Binary RL trains on."""

    @property
    def value(self) -> float:
        """The reward to train on: `reward` when the judge gave one, else `score`."""
        return float(self.score if self.reward is None else self.reward)

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
    """Scalar score (Binary RL), any finite float (a judge's +1 / -1, a custom reward's 0.3); None when the
    sample has no usable score."""
    advantages: list[float] | None = None
    """Optional per-token advantages, aligned with tokens."""
    teacher_logprobs: list[float] | None = None
    """OPD teacher logprobs of the sampled tokens, aligned with tokens."""
    hint: str | None = None
    hint_candidates: list[str] | None = None
    """Hints to choose from (`Judgement.hint_candidates`); None: `hint` is the only one."""
    policy_version: int = 0
    """The OLDEST version among the response tokens (what the staleness histogram counts)."""
    sampling: dict[str, Any] | None = None
    """How the response was sampled (`Turn.sampling`): temperature / top_p other than 1 make the
    behaviour policy differ from the raw logprobs in `rollout_logprobs`; the trainer corrects for it."""
    rollout_versions: list[int] | None = None
    """Version of the weights behind each token, aligned with tokens (prompt positions hold the first
    response token's version); None: every token is `policy_version`. Differs within a sample only when
    the engine swapped weights mid-response; the trainer applies the staleness bound per token."""
    group_id: str | None = None
    """Samples sharing a group id were drawn for the same prompt (n > 1)."""
    rl_weight: float = 1.0
    """Scales the RL score (`Trainer.rl_scores`); the loop sets `train.retry_weight` on an answer given after
    a correction (`trainer/loop.py`). The reward still counts for the mean baseline."""
    turn_id: int | None = None
    messages: list[dict[str, Any]] | None = None
    """The prompt messages (needed to build the OPD teacher prompt)."""
    tools: list[dict[str, Any]] | None = None

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def response_versions(self) -> list[int]:
        """One version per response token (`policy_version` repeated when `rollout_versions` is None)."""
        if self.rollout_versions is None:
            return [self.policy_version] * (len(self.tokens) - self.prompt_len)
        return list(self.rollout_versions[self.prompt_len :])

    @property
    def mixed_versions(self) -> bool:
        """True when the response was produced by more than one policy version."""
        return len(set(self.response_versions)) > 1

    @classmethod
    def from_turn(cls, turn: Turn, judgement: Judgement | None = None) -> "Sample":
        tokens = list(turn.prompt_ids) + list(turn.response_ids)
        n_prompt = len(turn.prompt_ids)
        mask = [0] * n_prompt + [1] * len(turn.response_ids)
        resp_lps = list(turn.response_logprobs)
        if len(resp_lps) != len(turn.response_ids):  # imported without engine logprobs: none to correct with
            resp_lps = [0.0] * len(turn.response_ids)
        lps = [0.0] * n_prompt + resp_lps
        versions, oldest = _token_versions(turn)
        return cls(
            tokens=tokens,
            loss_mask=mask,
            rollout_logprobs=lps,
            prompt_len=n_prompt,
            reward=judgement.value if judgement is not None else None,
            hint=judgement.hint if judgement is not None else None,
            hint_candidates=judgement.hint_candidates if judgement is not None else None,
            policy_version=oldest,
            rollout_versions=versions,
            sampling=turn.sampling,
            turn_id=turn.id,
            messages=turn.messages,
            tools=turn.tools,
        )


def _token_versions(turn: Turn) -> tuple[list[int] | None, int]:
    """(versions aligned with prompt + response, the oldest response version) of a turn.

    A `response_versions` list of the wrong length cannot be aligned with the tokens: every token
    is then given the oldest version the turn names, which can only make the staleness bound
    stricter, never label a token newer than it is."""
    rv = turn.response_versions
    if rv is None or not turn.response_ids:
        return None, int(turn.policy_version)
    if len(rv) != len(turn.response_ids):
        oldest = min([int(turn.policy_version), *map(int, rv)])
        log.warning("turn %s: %d response_versions for %d response ids; every token counted as v%d",
                    turn.id, len(rv), len(turn.response_ids), oldest)
        return None, oldest
    versions = [int(v) for v in rv]
    return [versions[0]] * len(turn.prompt_ids) + versions, min(versions)
