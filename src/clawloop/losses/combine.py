"""Combine: Binary RL and OPD in one advantage.

    A_t = w_rl * score + w_opd * (teacher_logprob_t - old_logprob_t)

then the PPO clipped surrogate. A judged turn often has only one of the two
signals: a score but no hint (nothing to distil), or a hint whose vote was
ambiguous. Such a turn still trains on the signal it has; the other term is
left out for that sample, not read as 0 from a filler value.

Which signals a sample has is given per sample by `has_score` / `has_teacher`
(B,) bool. When omitted they are inferred: a score is present where it is
finite (NaN marks "no score"), a teacher where `teacher_logprobs` is given and
finite on every valid token of the row.

Rows with neither signal get advantage 0 but keep their tokens in the
denominator; drop them before batching (`train/combine_no_signal_frac` says
how many there were).

`teacher_agrees` (B, T) bool marks the tokens the teacher would have picked
itself (its top-1 is the sampled id). With it the OPD term is cut to the
*divergence point* (`credit.until_divergence`): every token up to the first
one the teacher would not pick keeps its teacher - old advantage, except that
an agreed token is never pushed down; the first disagreement gets its
advantage (the correction's blame lands there); every later token gets 0.
Why, and how it departs from OPD as published: `credit.py`.
"""

from __future__ import annotations

import torch

from clawloop.losses.aggregation import masked_mean_float
from clawloop.losses.credit import until_divergence
from clawloop.losses.ppo import ppo_clip_loss


def combined_advantages(
    scores: torch.Tensor,
    teacher_logprobs: torch.Tensor | None,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    has_score: torch.Tensor | None = None,
    has_teacher: torch.Tensor | None = None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    teacher_agrees: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages (B, T), detached, 0 off the mask; plus stats.

    `scores` (B,), `teacher_logprobs` / `old_logprobs` / `mask` (B, T).
    `opd_clip` bounds |teacher - old| per token before weighting.
    Stats: train/combine_rl_frac, train/combine_opd_frac, train/combine_both_frac,
    train/combine_no_signal_frac (fractions of samples), train/combine_adv_mean,
    train/combine_zero_adv_frac (valid tokens whose advantage is exactly 0).
    """
    if opd_clip is not None and opd_clip <= 0:
        raise ValueError(f"opd_clip must be > 0, got {opd_clip}")
    if scores.dim() != 1 or mask.dim() != 2 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must be (B,) and mask (B, T); got {tuple(scores.shape)} and {tuple(mask.shape)}")
    if old_logprobs.shape != mask.shape or (teacher_logprobs is not None and teacher_logprobs.shape != mask.shape):
        raise ValueError("old_logprobs, teacher_logprobs and mask must share one (B, T) shape")
    valid = mask.bool()  # (B, T)
    s = scores.detach().to(old_logprobs.dtype)  # (B,)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)

    if has_score is None:
        has_score = torch.isfinite(s)  # (B,)
    has_score = has_score.bool().to(valid.device)  # (B,)
    if teacher_logprobs is None:
        if has_teacher is not None and bool(has_teacher.any()):
            raise ValueError("has_teacher marks samples with a teacher but teacher_logprobs is None")
        has_teacher = torch.zeros_like(has_score)  # (B,)
        diff = torch.zeros_like(old_logprobs)  # (B, T)
    else:
        diff = (teacher_logprobs - old_logprobs).detach()  # (B, T)
        if has_teacher is None:
            has_teacher = (torch.isfinite(diff) | ~valid).all(dim=-1)  # (B,)
        has_teacher = has_teacher.bool().to(valid.device)  # (B,)
    if bool((has_score & ~torch.isfinite(s)).any()):
        raise ValueError("combined_advantages: has_score marks a sample whose score is not finite")

    rl_term = torch.where(has_score, s, zero)  # (B,)
    opd_rows = valid & has_teacher[:, None]  # (B, T)
    opd_term = torch.where(opd_rows, diff, zero)  # (B, T)
    if not bool(torch.isfinite(opd_term).all()):
        raise ValueError("combined_advantages: teacher or old logprobs are not finite on a teacher row")
    if opd_clip is not None:
        opd_term = opd_term.clamp(-opd_clip, opd_clip)  # (B, T)
    cut = 0.0
    if teacher_agrees is not None:
        if teacher_agrees.shape != mask.shape:
            raise ValueError("teacher_agrees and mask must share one (B, T) shape")
        agrees = teacher_agrees.bool()
        keep = until_divergence(agrees, opd_rows)  # (B, T)
        spared = opd_rows & ((agrees & (opd_term < 0)) | ~keep)  # (B, T)
        cut = masked_mean_float((opd_rows & ~keep).float(), opd_rows) if bool(opd_rows.any()) else 0.0
        opd_term = torch.where(spared, zero, opd_term)  # (B, T)

    adv = w_rl * rl_term[:, None] + w_opd * opd_term  # (B, T)
    adv = torch.where(valid, adv, zero)  # (B, T)

    n = max(int(s.numel()), 1)
    stats = {
        "train/combine_rl_frac": float(has_score.sum().item()) / n,
        "train/combine_opd_frac": float(has_teacher.sum().item()) / n,
        "train/combine_both_frac": float((has_score & has_teacher).sum().item()) / n,
        "train/combine_no_signal_frac": float((~has_score & ~has_teacher).sum().item()) / n,
        "train/combine_adv_mean": masked_mean_float(adv, valid),
        "train/combine_zero_adv_frac": masked_mean_float((adv == 0).float(), valid),
        "train/opd_after_divergence_frac": cut,
    }
    return adv, stats


def combine_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    scores: torch.Tensor,
    teacher_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    has_score: torch.Tensor | None = None,
    has_teacher: torch.Tensor | None = None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`ppo_clip_loss` on `combined_advantages(...)`; see the module docstring."""
    adv, adv_stats = combined_advantages(
        scores, teacher_logprobs, old_logprobs, mask,
        has_score=has_score, has_teacher=has_teacher, w_rl=w_rl, w_opd=w_opd, opd_clip=opd_clip,
    )
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
