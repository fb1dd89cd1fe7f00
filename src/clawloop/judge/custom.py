"""Custom reward functions (`--custom-rm-path`): three signatures users already have.

Which kind a plugin is, is read from it when the judge is built; one that fits
none fails then, showing all three:

1. clawloop's:   def reward(turn: clawloop.records.Turn) -> float | clawloop.records.Judgement
   (or `async def`). Gets the stored Turn: messages, response text and tool
   calls, token ids, next_state.

2. The OpenClaw-RL README's reward model (a function named `get_reward_model`):

       def get_reward_model(config) -> obj   # obj.score(prompt, response, next_state) -> float

   `get_reward_model` is called once, when the judge starts, with a dict:
   `prm_model_path` and `judge_model_path` (both --judge-model, i.e.
   PRM_MODEL_PATH / JUDGE_MODEL_PATH), `model_path` (the policy), `data_dir`,
   `majority_vote_n`, `majority_vote_threshold`. `obj.score` gets the last user
   message, the assistant's reply (text, then its tool calls) and the next
   state's text, as strings; it runs in a worker thread.

3. slime's:      async def reward_func(args, sample, **kwargs) -> float | {"score": float}
   (recognised by two positional parameters; a sync function is fine too).
   `sample` is a `RewardSample` with slime's field names (`prompt` = the
   request's messages, `response`, `tokens`, `response_length`, `label`,
   `metadata` with `next_state`, `session_id`, `turn_index`, `tool_calls`,
   `policy_version`); `args` a namespace of the same values as case 2's config.

Spellings of the spec are `clawloop.plugins`'s (file.py:fn, pkg.module:fn,
slime's pkg.module.fn, or a file / module alone: then `reward`, else
`get_reward_model`).

Values: a finite number is the reward. It is stored as is (`Judgement.reward`,
what Binary RL trains on, so 0.3 stays 0.3) and its sign is the verdict
(`Judgement.score`, for votes, metrics and the collapse check). A returned
Judgement keeps its votes and hint (its turn id and judge name are set by
clawloop). Anything else (None, NaN, a string) raises `JudgeUnavailable`: the
turn stays pending and the error is logged, rather than a wrong score stored.
Sync functions run in a worker thread, possibly `num_workers` at once.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from clawloop.config import ConfigError
from clawloop.judge.base import JudgeUnavailable, last_user_message, response_of, text_of
from clawloop.plugins import PluginError, accepts, describe, is_async, load_callable
from clawloop.records import Judgement, Turn

FLAG = "--custom-rm-path"
DEFAULT_NAMES = ("reward", "get_reward_model")
FACTORY_NAME = "get_reward_model"
EXPECTED = ("def reward(turn: clawloop.records.Turn) -> float | clawloop.records.Judgement   (or `async def`)\n"
            "    def get_reward_model(config) -> obj with obj.score(prompt, response, next_state) -> float   "
            "(OpenClaw-RL)\n"
            "    async def reward_func(args, sample, **kwargs) -> float   (slime)")


@dataclass
class RewardSample:
    """A stored turn under slime's `Sample` field names, for slime-style reward functions."""

    prompt: list[dict[str, Any]]
    response: str
    tokens: list[int] = field(default_factory=list)
    response_length: int = 0
    label: Any = None
    reward: Any = None
    rollout_log_probs: list[float] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    status: str = "completed"

    @classmethod
    def from_turn(cls, turn: Turn) -> "RewardSample":
        return cls(prompt=list(turn.messages), response=response_of(turn),
                   tokens=list(turn.prompt_ids) + list(turn.response_ids), response_length=len(turn.response_ids),
                   rollout_log_probs=list(turn.response_logprobs), index=turn.id,
                   metadata={"next_state": turn.next_state, "session_id": turn.session_id, "turn_index": turn.index,
                             "tool_calls": turn.tool_calls, "policy_version": turn.policy_version})


def plugin_config(cfg: Any) -> dict[str, Any]:
    """What a reward model factory (and slime's `args`) gets: the judge's model and votes, the policy."""
    j = getattr(cfg, "judge", cfg)
    model = getattr(cfg, "model", None)
    return {"prm_model_path": j.model, "judge_model_path": j.model,
            "model_path": getattr(model, "path", "") if model is not None else "",
            "data_dir": getattr(cfg, "data_dir", ""), "majority_vote_n": j.majority_vote_n,
            "majority_vote_threshold": j.majority_vote_threshold, "custom_rm_path": j.custom_rm_path}


def to_reward(value: Any) -> float | None:
    """A returned reward as a float; None when it is not a finite number. slime's `{"score": x}` too."""
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    if hasattr(value, "item") and callable(value.item):  # a one-element tensor or array
        try:
            return to_reward(value.item())
        except (TypeError, ValueError):
            return None
    return None


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _kind(fn: Any, name: str) -> str | None:
    if name == FACTORY_NAME:
        return "factory" if accepts(fn, 1) else None
    if accepts(fn, 1):
        return "turn"
    if accepts(fn, 2):
        return "slime"
    return None


class CustomJudge:
    """A user reward plugin as a Judge; see the module docstring."""

    def __init__(self, spec: str, cfg: Any = None):
        self.spec = spec
        self.name = f"custom:{spec}"
        fn = load_callable(spec, default_name=DEFAULT_NAMES, what=FLAG)
        fn_name = getattr(fn, "__name__", "")
        self.kind = _kind(fn, fn_name)
        if self.kind is None:
            raise PluginError(f"{FLAG} {spec}: {describe(fn)} fits no accepted signature; expected one of:\n"
                              f"    {EXPECTED}")
        self.config = plugin_config(cfg) if cfg is not None else {}
        if self.kind == "turn" and self.config.get("prm_model_path"):
            raise ConfigError(
                f"judge.model: --judge-model / PRM_MODEL_PATH / JUDGE_MODEL_PATH is "
                f"{self.config['prm_model_path']!r}, but {FLAG} {spec} is `reward(turn)`, which receives no model: "
                f"define get_reward_model(config) instead (it gets config['prm_model_path']), or unset it")
        self.fn: Callable[..., Any] = fn
        if self.kind == "factory":
            self.fn = self._build_model(fn)
        self.args = argparse.Namespace(**self.config)
        self._is_async = is_async(self.fn)

    def _build_model(self, factory: Callable[..., Any]) -> Callable[..., Any]:
        try:
            model = factory(dict(self.config))
        except Exception as e:
            raise ConfigError(f"{FLAG} {self.spec}: get_reward_model(config) failed: {type(e).__name__}: {e} "
                              f"(config['prm_model_path'] = {self.config.get('prm_model_path')!r}: "
                              f"set PRM_MODEL_PATH or --judge-model)") from e
        score = getattr(model, "score", None)
        if not callable(score) or not accepts(score, 3):
            raise PluginError(f"{FLAG} {self.spec}: get_reward_model(config) returned {type(model).__name__}, "
                              f"which has no score(prompt, response, next_state) method")
        return score

    def _call(self, turn: Turn) -> Any:
        if self.kind == "turn":
            return self.fn(turn)
        if self.kind == "slime":
            return self.fn(self.args, RewardSample.from_turn(turn))
        return self.fn(last_user_message(turn.messages) or "", response_of(turn),
                       text_of((turn.next_state or {}).get("content")))

    async def judge(self, turn: Turn) -> Judgement:
        t0 = time.perf_counter()
        if self._is_async:
            out = await self._call(turn)
        else:
            out = await asyncio.to_thread(self._call, turn)
            if inspect.isawaitable(out):
                out = await out
        turn_id = turn.id if turn.id is not None else -1
        latency = time.perf_counter() - t0
        if isinstance(out, Judgement):
            value = to_reward(out.value)
            if value is None:
                raise JudgeUnavailable(f"custom reward {self.spec}: Judgement.score={out.score!r} "
                                       f"reward={out.reward!r} is not a number")
            out.turn_id, out.judge = turn_id, self.name
            out.score = sign(value)
            out.reward = value if value != out.score else None
            out.votes = out.votes or [out.score]
            out.latency_s = out.latency_s or latency
            return out
        value = to_reward(out)
        if value is None:
            raise JudgeUnavailable(f"custom reward {self.spec} returned {out!r}; expected a finite number "
                                   f"(signatures:\n    {EXPECTED})")
        score = sign(value)
        return Judgement(turn_id=turn_id, score=score, votes=[score], judge=self.name, latency_s=latency,
                         reward=value if value != score else None)

    async def close(self) -> None:
        return None
