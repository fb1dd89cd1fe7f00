"""On-policy distillation (OPD) from a hint-conditioned teacher, token-advantage target: the objective
of `--method opd --opd-target advantage` (the default target, top-K, is `distill.py`).

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
with Binary RL by adding advantages (`combine.py`). An optional `opd_clip`
bounds |A_t| because a hint can make single tokens wildly (un)likely, and
`teacher_agrees` cuts the advantage at the divergence point (`credit.py`).
The advantages are `advantages.combined_advantages` with no score.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from clawloop.losses.advantages import combined_advantages
from clawloop.losses.ppo import ppo_clip_loss


def opd_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    teacher_agrees: torch.Tensor | None = None,
    pre_advantages: torch.Tensor | None = None,
    has_pre: torch.Tensor | None = None,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] = ppo_clip_loss,
    **pg_knobs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss` (the PPO clip, or a custom loss) with A_t = w_opd * (teacher - old) per token.

    `teacher_logprobs` (B, T): NaN rows where a sample had no hint (advantage 0 there; None: no
    teacher in the batch). A row with `pre_advantages` (a rollout-buffer group, `has_pre` (B,))
    trains on them at full weight: OPD has no judge score, but the buffer's own advantage is the
    signal that sample came with. `pg_knobs` go to `policy_loss` (eps_clip, eps_clip_high,
    dual_clip, agg, denominator, is_weights). Stats: the advantages' and the policy loss's."""
    no_score = torch.full(mask.shape[:1], float("nan"), dtype=old_logprobs.dtype, device=old_logprobs.device)  # (B,)
    adv, adv_stats = combined_advantages(
        no_score, teacher_logprobs, old_logprobs, mask, w_rl=1.0, w_opd=w_opd, opd_clip=opd_clip,
        teacher_agrees=teacher_agrees, pre_advantages=pre_advantages, has_pre=has_pre)  # (B, T)
    loss, stats = policy_loss(logprobs, old_logprobs, adv, mask, **pg_knobs)
    return loss, {**adv_stats, **stats}
