"""Clipped policy-gradient surrogate (PPO), the loss Binary RL, OPD and Combine train with.

Per valid token, with ratio r = exp(logprobs - old_logprobs) and advantage A:

    loss_t = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_high))

then reduced by `aggregate`. The caller supplies the advantages; this function
does not know where they came from (judge score, teacher logprobs, both).

Departures from PPO (Schulman et al., 2017):
- Asymmetric clip ("clip-higher", DAPO): the upper bound 1 + eps_clip_high is
  looser than the lower one, so rare tokens with positive advantage can grow.
  `eps_clip_high=None` gives the symmetric paper version.
- Optional dual clip (Ye et al., 2020): for A < 0 the loss is also capped at
  -A * dual_clip (dual_clip > 1), so one token whose ratio has exploded cannot
  dominate the step. No effect on A >= 0. `None` or 0 turns it off (the
  config's "0: off").
- `is_weights` multiplies the per-token loss (truncated importance sampling
  between the rollout engine and the trainer, see `offpolicy.py`); they are
  treated as constants.
- No value function and no entropy bonus (`kl.py` has one); the log-ratio is
  clamped to [-20, 20] before exp so a corrupted logprob gives a large finite
  loss, not inf.
- Inputs are zeroed on padding before any arithmetic, so NaN or inf in padded
  positions reaches neither the loss nor the gradient.
- `train/approx_kl` is the k3 estimate mean((r - 1) - log r) of KL(old || new).
"""

from __future__ import annotations

import torch

from clawloop.losses.aggregation import aggregate, masked_max_float, masked_mean_float

LOG_RATIO_CLAMP = 20.0


def _zero_pad(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped loss over (B, T) token tensors; returns (scalar loss, stats).

    `logprobs` carries the gradient; `old_logprobs`, `advantages` and
    `is_weights` are detached here. `denominator` is passed to `aggregate` as
    `fixed_denominator` (use the step-wide count when micro-batching).

    Stats: train/pg_loss, train/clip_frac (tokens where the clipped term won),
    train/dual_clip_frac, train/approx_kl, train/ratio_mean, train/ratio_max,
    train/valid_tokens.
    """
    if not 0.0 <= eps_clip < 1.0:
        raise ValueError(f"eps_clip must be in [0, 1), got {eps_clip}")
    if eps_clip_high is not None and eps_clip_high < 0.0:
        raise ValueError(f"eps_clip_high must be >= 0, got {eps_clip_high}")
    if dual_clip is not None and dual_clip != 0 and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None / 0 for off), got {dual_clip}")
    shapes = {tuple(t.shape) for t in (logprobs, old_logprobs, advantages, mask)}
    if is_weights is not None:
        shapes.add(tuple(is_weights.shape))
    if len(shapes) != 1:
        raise ValueError(f"ppo_clip_loss: tensors must share one (B, T) shape, got {sorted(shapes)}")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    valid = mask.bool()  # (B, T)
    adv = _zero_pad(advantages.detach(), valid)  # (B, T)

    log_ratio = _zero_pad(logprobs - old_logprobs.detach(), valid)  # (B, T) 0 on padding: r = 1
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + high)  # (B, T)
    per_token = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)

    dual_active = torch.zeros_like(valid)  # (B, T)
    if dual_clip:
        dual_bound = -adv * dual_clip  # (B, T) positive where adv < 0
        negative = adv < 0  # (B, T)
        dual_active = negative & (per_token > dual_bound)  # (B, T)
        per_token = torch.where(negative, torch.minimum(per_token, dual_bound), per_token)  # (B, T)

    if is_weights is not None:
        per_token = per_token * _zero_pad(is_weights.detach(), valid)  # (B, T)

    loss = aggregate(per_token, valid, agg, fixed_denominator=denominator)

    with torch.no_grad():
        clipped = (pg_clipped > pg_unclipped).float()  # (B, T)
        k3 = (ratio - 1.0) - log_ratio  # (B, T)
        stats = {
            "train/pg_loss": float(loss.detach().item()),
            "train/clip_frac": masked_mean_float(clipped, valid),
            "train/dual_clip_frac": masked_mean_float(dual_active.float(), valid),
            "train/approx_kl": masked_mean_float(k3, valid),
            "train/ratio_mean": masked_mean_float(ratio, valid),
            "train/ratio_max": masked_max_float(ratio, valid),
            "train/valid_tokens": float(valid.sum().item()),
        }
    return loss, stats
