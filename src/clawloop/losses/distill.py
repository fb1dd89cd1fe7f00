"""OPD with a distribution target: the objective of `--method opd` / `combine` under `--opd-target topk`
(the default) or `nucleus`.

The hinted teacher reports its K most likely tokens at each response position; the student learns

    L = w_opd * D(student, teacher top-K)       topk:    reverse KL over K + 1 buckets (`topk.py`)
                                                nucleus: -log of the student's mass on the teacher's
                                                         top-p nucleus (`nucleus.py`)
      + the policy-gradient term                 `binary_rl_loss`: w_rl * score under combine, and
                                                 a rollout group's own advantages (any method)

D covers a hinted row's positions up to the divergence point when `teacher_agrees` is given
(`--opd-credit divergence`, `credit.py`): after the first token the teacher would not have
written, its view is conditioned on a prefix it would never produce; with `teacher_trusted`
(`--opd-trust surer`) only the positions where the teacher is the surer of the two count
(`credit.teacher_trust`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from clawloop.losses.binary import binary_rl_loss
from clawloop.losses.credit import until_divergence
from clawloop.losses.nucleus import nucleus_mass_loss
from clawloop.losses.ppo import ppo_clip_loss
from clawloop.losses.topk import topk_distill_loss

DISTILL_TARGETS: tuple[str, ...] = ("topk", "nucleus")


def distill_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    teacher_topk_ids: torch.Tensor | None,
    teacher_topk_logprobs: torch.Tensor | None,
    has_topk: torch.Tensor | None = None,
    teacher_agrees: torch.Tensor | None = None,
    teacher_trusted: torch.Tensor | None = None,
    target: str = "topk",
    top_p: float = 0.9,
    w_opd: float = 1.0,
    scores: torch.Tensor | None = None,
    pre_advantages: torch.Tensor | None = None,
    has_pre: torch.Tensor | None = None,
    w_rl: float = 1.0,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] = ppo_clip_loss,
    **pg_knobs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy-gradient term (when `scores` or `pre_advantages` are given) plus w_opd x the target's loss.

    `logits` (B, T, V) carry the gradient of the target's term, `logprobs` (B, T) that of the
    policy-gradient term; `teacher_topk_ids` / `teacher_topk_logprobs` (B, T, K), most likely
    first (None: no hinted row in the batch), `has_topk` (B,) the rows the teacher saw a hint for
    (None: all), `teacher_trusted` (B, T) the positions the target may teach (None: all; the caller
    passes `teacher_agrees` with the others counted as agreed). `scores` (B,) NaN where none; `pg_knobs` go to `policy_loss`. Stats: the
    policy-gradient term's, the target's, train/topk_loss (the weighted top-K term) and
    train/opd_after_divergence_frac (share of the hinted positions past the divergence point)."""
    if target not in DISTILL_TARGETS:
        raise ValueError(f"distill target must be one of {DISTILL_TARGETS}, got {target!r}")
    if (teacher_topk_ids is None) != (teacher_topk_logprobs is None):
        raise ValueError("teacher_topk_ids and teacher_topk_logprobs come together")
    if teacher_topk_ids is None and scores is None and pre_advantages is None:
        raise ValueError("distill_loss: no teacher top-K, no score and no advantage: nothing to train on")
    stats: dict[str, float] = {}
    terms: list[torch.Tensor] = []
    if scores is not None or pre_advantages is not None:
        if scores is None:  # OPD has no judge score; a rollout group's own advantages still train
            scores = torch.full(mask.shape[:1], float("nan"), dtype=old_logprobs.dtype,
                                device=old_logprobs.device)  # (B,)
        pg, s = binary_rl_loss(logprobs, old_logprobs, scores, mask, pre_advantages=pre_advantages,
                               has_pre=has_pre, w_rl=w_rl, policy_loss=policy_loss, agg=agg,
                               denominator=denominator, **pg_knobs)
        terms.append(pg)
        stats.update(s)
    if teacher_topk_ids is not None:
        kmask = mask if has_topk is None else mask * has_topk[:, None]  # (B, T) rows the teacher saw a hint for
        if teacher_agrees is not None:  # opd_credit divergence: where the teacher's view is evidence
            kept = until_divergence(teacher_agrees, kmask)  # (B, T)
            stats["train/opd_after_divergence_frac"] = (
                1.0 - float(kept.sum()) / float(kmask.sum()) if float(kmask.sum()) else 0.0)
            kmask = kmask * kept
        if teacher_trusted is not None:  # --opd-trust surer: only where the teacher is the surer of the two
            hinted = float(kmask.sum())
            kmask = kmask * teacher_trusted
            stats["train/opd_unsure_frac"] = 1.0 - float(kmask.sum()) / hinted if hinted else 0.0
        if target == "nucleus":
            tk, s = nucleus_mass_loss(logits, teacher_topk_ids, teacher_topk_logprobs, kmask, top_p=top_p,
                                      agg=agg, denominator=denominator)
        else:
            tk, s = topk_distill_loss(logits, teacher_topk_ids, teacher_topk_logprobs, kmask, agg=agg,
                                      denominator=denominator)
            stats["train/topk_loss"] = float(w_opd * tk.detach())
        terms.append(w_opd * tk)
        stats.update(s)
    return sum(terms[1:], terms[0]), stats
