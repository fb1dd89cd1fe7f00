"""On-policy distillation (OPD) from a hint-conditioned teacher.

After a turn is judged, the judge writes a hint. The teacher is the same model
(or a stronger one) re-scoring the student's OWN sampled response tokens with
the hint added to the prompt. `teacher_logprobs[b, t]` is therefore
log p_teacher(y_t | hint + prompt, y_<t) for the token y_t the student sampled,
not a teacher sample and not a distribution. The per-token advantage is

    A_t = teacher_logprobs_t - old_logprobs_t

positive where the hint makes the sampled token more likely (do more of it),
negative where the hint argues against it.

Departures from on-policy distillation as usually written (a per-token reverse
KL minimised directly, Agarwal et al. 2024 / Thinking Machines 2025): we feed
the per-token log-ratio to the PPO clipped surrogate as a per-token advantage
with no discounting, so old-policy reuse is clipped like RL and OPD combines
with Binary RL by adding advantages (`combine.py`). An optional `clip` bounds
|A_t| because a hint can make single tokens wildly (un)likely.
"""

from __future__ import annotations

import torch

from clawloop.losses.aggregation import masked_mean_float
from clawloop.losses.ppo import ppo_clip_loss


def opd_advantages(
    teacher_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantage teacher - old (B, T), zero off the mask, detached; plus stats.

    Stats: train/opd_adv_mean, train/opd_adv_abs_mean, train/opd_clipped_frac,
    train/opd_positive_frac.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    if teacher_logprobs.shape != old_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(f"teacher {tuple(teacher_logprobs.shape)}, old {tuple(old_logprobs.shape)} and "
                         f"mask {tuple(mask.shape)} must share one (B, T) shape")
    valid = mask.bool()  # (B, T)
    raw = (teacher_logprobs - old_logprobs).detach()  # (B, T)
    raw = torch.where(valid, raw, torch.zeros((), dtype=raw.dtype, device=raw.device))  # (B, T)
    if not bool(torch.isfinite(raw).all()):
        raise ValueError("opd_advantages: teacher or old logprobs are not finite on valid tokens")
    adv = raw if clip is None else raw.clamp(-clip, clip)  # (B, T)
    stats = {
        "train/opd_adv_mean": masked_mean_float(adv, valid),
        "train/opd_adv_abs_mean": masked_mean_float(adv.abs(), valid),
        "train/opd_clipped_frac": masked_mean_float((adv != raw).float(), valid),
        "train/opd_positive_frac": masked_mean_float((adv > 0).float(), valid),
    }
    return adv, stats


def opd_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    adv_clip: float | None = None,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`ppo_clip_loss` on `opd_advantages(teacher_logprobs, old_logprobs, mask, clip=adv_clip)`."""
    adv, adv_stats = opd_advantages(teacher_logprobs, old_logprobs, mask, clip=adv_clip)
    loss, stats = ppo_clip_loss(
        logprobs,
        old_logprobs,
        adv,
        mask,
        eps_clip=eps_clip,
        eps_clip_high=eps_clip_high,
        dual_clip=dual_clip,
        agg=agg,
        denominator=denominator,
        is_weights=is_weights,
    )
    return loss, {**stats, **adv_stats}
