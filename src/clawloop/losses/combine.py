"""Combine: Binary RL and OPD in one advantage, the objective of `--method combine --opd-target advantage`.

    A_t = w_rl * score + w_opd * (teacher_logprob_t - old_logprob_t)

(`advantages.combined_advantages`, which every policy-gradient objective uses) then the PPO
clipped surrogate, or the custom loss in its place. With `--opd-target topk` / `nucleus` (the
default) the OPD term is a distribution target instead: `distill.py`. A judged turn often has only one of the two
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

from collections.abc import Callable
from typing import Any

import torch

from clawloop.losses.advantages import combined_advantages
from clawloop.losses.ppo import ppo_clip_loss


def combine_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    scores: torch.Tensor,
    teacher_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    teacher_agrees: torch.Tensor | None = None,
    pre_advantages: torch.Tensor | None = None,
    has_pre: torch.Tensor | None = None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] = ppo_clip_loss,
    **pg_knobs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss` (the PPO clip, or a custom loss) on `combined_advantages(...)`; see the module docstring.

    `scores` (B,) NaN where a sample has none, `teacher_logprobs` (B, T) NaN rows where it has no
    teacher (None: no teacher in the batch). `pg_knobs` go to `policy_loss` (eps_clip, eps_clip_high,
    dual_clip, agg, denominator, is_weights). Stats: the advantages' and the policy loss's."""
    adv, adv_stats = combined_advantages(
        scores, teacher_logprobs, old_logprobs, mask, w_rl=w_rl, w_opd=w_opd, opd_clip=opd_clip,
        teacher_agrees=teacher_agrees, pre_advantages=pre_advantages, has_pre=has_pre)  # (B, T)
    loss, stats = policy_loss(logprobs, old_logprobs, adv, mask, **pg_knobs)
    return loss, {**adv_stats, **stats}
