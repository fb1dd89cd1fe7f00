"""Custom losses (`--custom-loss-function-path`): three signatures users already have, one call.

What `load_custom_loss` returns is a policy loss: the trainer hands it, with this
micro-batch's inputs bound, to the method's objective (`binary_rl_loss`, `opd_loss`,
`combine_loss`, `distill_loss`) as its `policy_loss`, in place of `ppo_clip_loss`. The
objective builds the advantages and calls it once per micro-batch; the trainer adds the
anchor, KL and entropy terms itself:

    loss, stats = custom(logprobs, old_logprobs, advantages, mask,
                         eps_clip=..., eps_clip_high=..., dual_clip=..., agg=..., denominator=..., is_weights=...,
                         **custom_loss_inputs(batch, logits, train_config))

Which kind a function is, is read from its parameters when it is loaded (a
function that fits none fails then, showing all three signatures):

1. clawloop's own (the shape of `ppo_clip_loss`, which satisfies it):

       def my_loss(logprobs, old_logprobs, advantages, mask, **kwargs) -> (loss, stats):
           # logprobs      (B, T) float, requires grad: the policy's logprobs of the sampled tokens
           # old_logprobs  (B, T): the trainer's logprobs before this update (no grad)
           # advantages    (B, T): per-token advantages the chosen --method built (no grad)
           # mask          (B, T) bool: True on response tokens that train
           # **kwargs      the knobs `ppo_clip_loss` takes (CUSTOM_LOSS_KWARGS): eps_clip, eps_clip_high,
           #               dual_clip, agg, denominator (the step-wide one: use it, see aggregation.py),
           #               is_weights (TIS weights or None)
           return loss, stats   # scalar tensor with grad; dict[str, float]

   A parameter named like one of LOSS_INPUTS (scores, teacher_logprobs,
   ref_logprobs, rollout_logprobs, logits, tokens, config) receives that input
   too; `**kwargs` alone receives only the knobs.

2. The OpenClaw-RL README's example, pasted unchanged:

       def compute_loss(policy_logits, reference_logits, rewards, advantages, config) -> loss

   called with 1-D tensors over the micro-batch's trained tokens: `policy_logits`
   the policy's logprobs of the sampled tokens (with grad), `reference_logits`
   their logprobs before this update, `rewards` each token's sample reward (the
   judge's float, 0 where none), `advantages` what --method built, and `config`
   the train section as a dict plus `clip_range` (= eps_clip). Logprobs despite
   the names: the example takes exp(policy - reference) as the PPO ratio, which
   holds for logprobs only. Its `.mean()` is a mean over the micro-batch's
   tokens; clawloop scales it by the micro-batch's share of the step's
   denominator, so splitting a step into micro-batches changes nothing.

3. slime's `--custom-loss-function-path` (recognised by parameters named
   `args, batch` first):

       def loss_function(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)

   `logits` (B, L-1, V) with grad (row i, position t predicts token t+1 of
   `batch["unconcat_tokens"][i]`); `batch` holds per-sample lists over the
   response positions: unconcat_tokens, total_lengths, response_lengths,
   loss_masks, advantages (the judge-score part of what --method built, weight
   included: `w_rl * score`, or a rollout group's advantage; 0 under --method
   opd), log_probs (before this update), rollout_log_probs (the engine's),
   rewards, is_weights (TIS, clawloop's), plus teacher_log_probs under
   --method opd/combine (the old logprobs where a sample has no teacher, so
   teacher - old is 0 there) and ref_log_probs with --kl-coef. `args` carries
   slime's names (eps_clip, eps_clip_high, eps_clip_c, entropy_coef=0 and
   use_kl_loss=False since clawloop adds both itself, kl_loss_type, ...) and
   clawloop's (w_rl, w_opd, method, loss_agg). `sum_of_sample_mean(x)` reduces
   a concatenation of per-sample values with --loss-agg and the step-wide
   denominator, so a port that uses it aggregates exactly as the built-ins.
   `get_log_probs_and_entropy`, `compute_policy_loss` and `compute_approx_kl`
   below stand in for slime's helpers of those names: porting a slime loss is
   changing its imports (examples/plugins/openclaw_combine_loss.py).

With no `:fn` in the spec, `custom_loss` is used, else `compute_loss`. The
loader itself (file or module paths, errors) is `clawloop.plugins`.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clawloop.losses.aggregation import aggregate
from clawloop.losses.kl import kl_penalty
from clawloop.plugins import PluginError, accepts, check_signature, describe, load_callable, positional_names

__all__ = [
    "CUSTOM_LOSS_KWARGS", "CUSTOM_LOSS_PARAMS", "CUSTOM_LOSS_SIGNATURE", "LOSS_INPUTS", "PluginError",
    "check_signature", "compute_approx_kl", "compute_policy_loss", "custom_loss_inputs",
    "get_log_probs_and_entropy", "load_callable", "load_custom_loss",
]

CUSTOM_LOSS_PARAMS: tuple[str, ...] = ("logprobs", "old_logprobs", "advantages", "mask")
CUSTOM_LOSS_KWARGS: tuple[str, ...] = ("eps_clip", "eps_clip_high", "dual_clip", "agg", "denominator", "is_weights")
LOSS_INPUTS: tuple[str, ...] = ("scores", "teacher_logprobs", "ref_logprobs", "rollout_logprobs", "logits", "tokens",
                                "config")
"""What the trainer passes beside the knobs (`custom_loss_inputs`)."""
CUSTOM_LOSS_DEFAULT_NAMES = ("custom_loss", "compute_loss")
CUSTOM_LOSS_SIGNATURE = "fn(logprobs, old_logprobs, advantages, mask, **kwargs) -> (loss, stats)"
SEED_SIGNATURE = "compute_loss(policy_logits, reference_logits, rewards, advantages, config) -> loss"
SLIME_SIGNATURE = "fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)"
ACCEPTED = (f"accepted signatures:\n    {CUSTOM_LOSS_SIGNATURE}   (clawloop)\n    {SEED_SIGNATURE}   (OpenClaw-RL "
            f"README)\n    {SLIME_SIGNATURE}   (slime)")


def custom_loss_inputs(batch: Any, logits: torch.Tensor | None, train_config: Any) -> dict[str, Any]:
    """The LOSS_INPUTS of one trainer micro-batch (duck-typed: tokens, scores, teacher_lp, ref_lp,
    engine_lp / has_engine_lp of the trainer's batch). Scores are NaN where a sample has none or
    --method opd uses none; the teacher is None unless --method is opd or combine."""
    method = getattr(train_config, "method", "combine")
    token_opd = method in ("opd", "combine") and getattr(train_config, "opd_target", "advantage") == "advantage"
    scores = getattr(batch, "scores", None)
    if scores is not None and method == "opd":
        scores = torch.full_like(scores, float("nan"))
    engine_lp = getattr(batch, "engine_lp", None)
    has_engine = getattr(batch, "has_engine_lp", None)
    old = getattr(batch, "old", None)
    rollout = engine_lp
    if engine_lp is not None and has_engine is not None and old is not None:
        rollout = torch.where(has_engine[:, None], engine_lp, old)  # (B, T)
    return {
        "scores": scores,
        "teacher_logprobs": getattr(batch, "teacher_lp", None) if token_opd else None,
        "ref_logprobs": getattr(batch, "ref_lp", None),
        "rollout_logprobs": rollout,
        "logits": logits,
        "tokens": getattr(batch, "tokens", None),
        "config": train_config,
    }


# -- slime's helpers, for ports ---------------------------------------------------


def _response_slice(total: int, response: int) -> slice:
    """Positions of `logits[i]` / `logprobs[i]` that predict the response tokens of a sample."""
    return slice(total - response - 1, total - 1)


def get_log_probs_and_entropy(logits: torch.Tensor, *, args: Any = None, unconcat_tokens: Sequence[torch.Tensor],
                              total_lengths: Sequence[int], response_lengths: Sequence[int],
                              with_entropy: bool = False, **_: Any) -> tuple[None, dict[str, list[torch.Tensor]]]:
    """Per-sample logprobs of the response tokens (and entropies) from clawloop's (B, L-1, V) logits:
    `{"log_probs": [(R_i,)], "entropy": [(R_i,)]}`, with the gradient of `logits`. The name and keywords
    are slime's; the layout is clawloop's (row i is sample i, position t predicts token t+1)."""
    out: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": []}
    for i, (tokens, total, response) in enumerate(zip(unconcat_tokens, total_lengths, response_lengths)):
        sl = _response_slice(int(total), int(response))
        logp = torch.log_softmax(logits[i, sl].float(), dim=-1)  # (R, V)
        target = tokens[int(total) - int(response): int(total)].to(logits.device)  # (R,)
        out["log_probs"].append(logp.gather(-1, target[:, None]).squeeze(-1))  # (R,)
        if with_entropy:
            out["entropy"].append(-(logp.exp() * logp).sum(-1))  # (R,)
    return None, out


def compute_policy_loss(ppo_kl: torch.Tensor, advantages: torch.Tensor, eps_clip: float, eps_clip_high: float,
                        eps_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss and clip indicator from `ppo_kl` = old - new logprobs, as slime's
    helper of that name returns them; the arithmetic is `ppo_clip_loss`'s (log-ratio clamped to ±20)."""
    log_ratio = (-ppo_kl).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    if eps_clip_c:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * eps_clip_c), loss)
    return loss, (clipped > unclipped).float()


def compute_approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_loss_type: str = "low_var_kl",
                      **_: Any) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate (clawloop's `kl_penalty`), slime's name."""
    return kl_penalty(log_probs, ref_log_probs, kl_loss_type)


class _SlimeArgs(argparse.Namespace):
    """slime's `args` for a ported loss; an argument clawloop does not have is a clear error."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        have = ", ".join(sorted(vars(self)))
        raise AttributeError(f"args.{name}: clawloop does not provide this slime argument to custom losses "
                             f"(it has: {have})")


# -- the adapters -------------------------------------------------------------------


def _style(fn: Callable[..., Any]) -> str | None:
    names = positional_names(fn)
    if names[:2] == ["args", "batch"] and accepts(fn, 4):
        return "slime"
    if accepts(fn, 4, CUSTOM_LOSS_KWARGS):
        return "clawloop"
    if accepts(fn, 5) and not accepts(fn, 4):
        return "seed"
    return None


def _config_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        from clawloop.config import TrainConfig

        cfg = TrainConfig()
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))


def _slime_args(cfg: dict[str, Any], knobs: dict[str, Any]) -> _SlimeArgs:
    agg = knobs.get("agg") or cfg["loss_agg"]
    return _SlimeArgs(
        eps_clip=knobs.get("eps_clip", cfg["eps_clip"]),
        eps_clip_high=knobs.get("eps_clip_high", cfg["eps_clip_high"]) or knobs.get("eps_clip", cfg["eps_clip"]),
        eps_clip_c=knobs.get("dual_clip", cfg["dual_clip"] or None) or None,
        entropy_coef=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type=cfg["kl_type"],
        use_rollout_logprobs=False, advantage_estimator="grpo", use_tis=False, use_opsm=False,
        calculate_per_token_loss=agg == "token-mean", loss_agg=agg, method=cfg["method"],
        w_rl=float(cfg["w_rl"]), w_opd=float(cfg["w_opd"]), lr=cfg["lr"],
    )


def _rows(x: torch.Tensor | None, spans: list[slice]) -> list[torch.Tensor] | None:
    return None if x is None else [x[i, sl] for i, sl in enumerate(spans)]


class CustomLoss:
    """What `load_custom_loss` returns: callable like `ppo_clip_loss`, plus the LOSS_INPUTS keywords."""

    def __init__(self, fn: Callable[..., Any], spec: str, style: str):
        self.fn = fn
        self.spec = spec
        self.style = style
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        names = set(positional_names(fn))
        try:
            names |= set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            pass
        self._named_inputs = [k for k in LOSS_INPUTS if k in names]

    @property
    def needs_logits(self) -> bool:
        return self.style == "slime" or "logits" in self._named_inputs

    def __repr__(self) -> str:
        return f"CustomLoss({self.spec!r}, style={self.style})"

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
        unknown = set(kwargs) - set(CUSTOM_LOSS_KWARGS) - set(LOSS_INPUTS)
        if unknown:
            raise TypeError(f"custom loss: unexpected keyword(s) {sorted(unknown)}")
        knobs = {k: v for k, v in kwargs.items() if k in CUSTOM_LOSS_KWARGS}
        inputs = {k: v for k, v in kwargs.items() if k in LOSS_INPUTS}
        if self.style == "clawloop":
            out = self.fn(logprobs, old_logprobs, advantages, mask, **knobs,
                          **{k: inputs.get(k) for k in self._named_inputs if k in inputs})
            return self._check_pair(out)
        if self.style == "seed":
            return self._call_seed(logprobs, old_logprobs, advantages, mask, knobs, inputs)
        return self._call_slime(logprobs, old_logprobs, advantages, mask, knobs, inputs)

    # -- clawloop -------------------------------------------------------------
    def _check_pair(self, out: Any, what: str = CUSTOM_LOSS_SIGNATURE) -> tuple[torch.Tensor, dict[str, float]]:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise PluginError(f"custom loss {self.spec!r} returned {type(out).__name__}; expected {what}")
        loss, stats = out
        self._check_scalar(loss)
        if not isinstance(stats, dict):
            raise PluginError(f"custom loss {self.spec!r}: stats must be a dict[str, float], got "
                              f"{type(stats).__name__}")
        try:
            return loss, {str(k): float(v) for k, v in stats.items()}
        except (TypeError, ValueError) as e:
            raise PluginError(f"custom loss {self.spec!r}: stats values must be numbers ({e})") from None

    def _check_scalar(self, loss: Any) -> None:
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise PluginError(f"custom loss {self.spec!r}: loss must be a scalar tensor, got {shape}")

    # -- the OpenClaw-RL README's compute_loss ------------------------------
    def _call_seed(self, lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                   knobs: dict[str, Any], inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = _config_dict(inputs.get("config"))
        valid = mask.bool()  # (B, T)
        n_tokens = int(valid.sum())
        if n_tokens == 0:
            return lp.sum() * 0.0, {}
        scores = inputs.get("scores")
        if scores is None:
            raise PluginError(f"custom loss {self.spec!r}: {SEED_SIGNATURE} needs the samples' rewards "
                              "(the trainer passed no `scores`)")
        rewards = torch.nan_to_num(scores.detach().to(lp.dtype), nan=0.0)[:, None].expand_as(lp)  # (B, T)
        config = {**cfg, "clip_range": knobs.get("eps_clip", cfg["eps_clip"])}
        loss = self.fn(lp[valid], old.detach()[valid], rewards[valid], adv.detach()[valid], config)  # (N,) each
        self._check_scalar(loss)
        agg = knobs.get("agg") or cfg["loss_agg"]
        denom = knobs.get("denominator")
        if denom is not None:
            count = n_tokens if agg in ("token-mean", "fixed-denominator") else int((valid.sum(-1) > 0).sum())
            loss = loss * (count / float(denom))
        return loss, {"train/pg_loss": float(loss.detach())}

    # -- slime ---------------------------------------------------------------
    def _call_slime(self, lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                    knobs: dict[str, Any], inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        logits, tokens = inputs.get("logits"), inputs.get("tokens")
        if logits is None or tokens is None:
            raise PluginError(f"custom loss {self.spec!r}: {SLIME_SIGNATURE} needs the logits and tokens "
                              "(the trainer passed none)")
        cfg = _config_dict(inputs.get("config"))
        args = _slime_args(cfg, knobs)
        valid = mask.bool()  # (B, T)
        batch, spans = slime_batch(valid, old, adv, tokens, scores=inputs.get("scores"),
                                   teacher_logprobs=inputs.get("teacher_logprobs"),
                                   ref_logprobs=inputs.get("ref_logprobs"),
                                   rollout_logprobs=inputs.get("rollout_logprobs"),
                                   is_weights=knobs.get("is_weights"), w_opd=args.w_opd,
                                   opd_clip=cfg.get("opd_clip") or None)
        agg, denom = args.loss_agg, knobs.get("denominator")
        lengths = [sl.stop - sl.start for sl in spans]
        loss_rows = batch["loss_masks"]

        def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
            """Reduce a concatenation of per-sample values (over response positions) with --loss-agg."""
            if x.dim() != 1 or x.shape[0] != sum(lengths):
                raise PluginError(f"custom loss {self.spec!r}: sum_of_sample_mean expects the concatenated "
                                  f"per-sample values ({sum(lengths)},), got {tuple(x.shape)}")
            width = max(lengths, default=0)
            vals = x.new_zeros((len(lengths), width))  # (B, R)
            m = torch.zeros((len(lengths), width), dtype=torch.bool, device=x.device)  # (B, R)
            for i, part in enumerate(torch.split(x, lengths)):
                vals[i, : lengths[i]] = part
                m[i, : lengths[i]] = loss_rows[i].bool()
            return aggregate(vals, m, agg, fixed_denominator=denom)

        out = self.fn(args, batch, logits, sum_of_sample_mean)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise PluginError(f"custom loss {self.spec!r} returned {type(out).__name__}; expected {SLIME_SIGNATURE}")
        loss, metrics = out
        self._check_scalar(loss)
        stats: dict[str, float] = {}
        for k, v in dict(metrics or {}).items():
            try:
                stats[str(k) if "/" in str(k) else f"train/{k}"] = float(v)
            except (TypeError, ValueError) as e:
                raise PluginError(f"custom loss {self.spec!r}: metric {k!r} is not a number ({e})") from None
        return loss, stats


def slime_batch(valid: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, tokens: torch.Tensor, *,
                scores: torch.Tensor | None, teacher_logprobs: torch.Tensor | None,
                ref_logprobs: torch.Tensor | None, rollout_logprobs: torch.Tensor | None,
                is_weights: torch.Tensor | None, w_opd: float,
                opd_clip: float | None = None) -> tuple[dict[str, Any], list[slice]]:
    """slime's per-sample `batch` from clawloop's (B, T) tensors (the keys are in the module docstring),
    and each row's response span over T. A row's response runs from its first trained position to
    its last token; positions inside it that do not train are 0 in `loss_masks`."""
    B = valid.shape[0]
    spans: list[slice] = []
    for i in range(B):
        idx = valid[i].nonzero()
        if len(idx):
            start, stop = int(idx[0]), int(idx[-1]) + 1
        else:
            start = stop = 0
        spans.append(slice(start, stop))
    old = old.detach()
    zero = torch.zeros((), dtype=old.dtype, device=old.device)
    opd = torch.zeros_like(old)  # (B, T)
    teacher_rows = None
    if teacher_logprobs is not None:
        diff = teacher_logprobs - old  # (B, T)
        has_teacher = (torch.isfinite(diff) | ~valid).all(dim=-1)  # (B,) as combined_advantages reads it
        opd = torch.where(valid & has_teacher[:, None], diff, zero)  # (B, T)
        if opd_clip:
            opd = opd.clamp(-opd_clip, opd_clip)  # as combined_advantages bounded it
        teacher_rows = torch.where(has_teacher[:, None] & valid, teacher_logprobs, old)  # (B, T)
    rl_adv = torch.where(valid, adv.detach() - w_opd * opd, zero)  # (B, T) the judge-score part
    rewards = [0.0] * B
    if scores is not None:
        rewards = [float(s) if math.isfinite(float(s)) else 0.0 for s in scores.detach().cpu()]
    lengths = [sl.stop - sl.start for sl in spans]
    batch: dict[str, Any] = {
        "unconcat_tokens": [tokens[i, : sl.stop + 1] for i, sl in enumerate(spans)],
        "total_lengths": [sl.stop + 1 for sl in spans],
        "response_lengths": lengths,
        "loss_masks": [valid[i, sl].to(old.dtype) for i, sl in enumerate(spans)],
        "advantages": _rows(rl_adv, spans),
        "log_probs": _rows(old, spans),
        "rollout_log_probs": _rows(rollout_logprobs if rollout_logprobs is not None else old, spans),
        "rewards": rewards,
        "is_weights": _rows(is_weights.detach() if is_weights is not None else torch.ones_like(old), spans),
    }
    if teacher_rows is not None:
        batch["teacher_log_probs"] = _rows(teacher_rows.detach(), spans)
    if ref_logprobs is not None:
        batch["ref_log_probs"] = _rows(ref_logprobs.detach(), spans)
    return batch, spans


def load_custom_loss(spec: str) -> CustomLoss:
    """Load a custom loss, tell which kind it is (module docstring) and check its signature.

    The returned callable also checks what the function returns, so a wrong return type fails on
    the first step with a message instead of deep inside `backward()`.
    """
    what = "--custom-loss-function-path"
    fn = load_callable(spec, default_name=CUSTOM_LOSS_DEFAULT_NAMES, what=what)
    style = _style(fn)
    if style is None:
        try:
            check_signature(fn, CUSTOM_LOSS_PARAMS, f"custom loss {spec!r}", keywords=CUSTOM_LOSS_KWARGS)
        except PluginError as e:
            raise PluginError(f"{e}; {ACCEPTED}") from None
        raise PluginError(f"custom loss {spec!r}: {describe(fn)} fits no accepted signature; {ACCEPTED}")
    return CustomLoss(fn, spec, style)
