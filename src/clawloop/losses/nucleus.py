"""Nucleus distillation: the teacher says which tokens are acceptable, the student keeps its own
preferences among them.

At each position the teacher's nucleus is the smallest set of its most likely tokens whose
probability reaches `top_p` (its top-1 always, at most K from its top-K). The loss is

    L_t = -log sum_{v in nucleus_t} p_student(v)

so the gradient moves the student's mass into the nucleus and shares it out by the student's own
probabilities (its favourite gains most); the teacher's order inside the nucleus plays no part (the
gradient depends on the nucleus as a set). OPD's other targets copy the teacher's distribution
(token advantages teacher - old, or a KL to its top-K); that is right when the teacher knows
more, and wrong when the hint that makes it the teacher also makes it worse at the task: on the
tiny model, "Answer with just the number." appended as a hint moves 99 % of the first token's
mass to digits, as wanted, but the right first digit's share among them falls from 0.73 to 0.33
(bench/RESULTS.md "Why the loop made the model worse"). A hint is about what the user wants;
the student's own knowledge of the rest is what must not be lost. Here the hint vetoes (the
sentence opener "The" is outside the nucleus), and the student's arithmetic chooses among digits.

    nucleus_mass_loss(student_logits, teacher_topk_ids, teacher_topk_logprobs, mask, top_p=...)
"""

from __future__ import annotations

import torch

from clawloop.losses.aggregation import aggregate, masked_mean_float


def teacher_nucleus(teacher_topk_logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, T, K) bool: which of the teacher's top-K (sorted, most likely first) are in its top-p nucleus:
    each token whose predecessors hold less than `top_p` of the mass (so the top-1 always is)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = teacher_topk_logprobs.detach().float().exp()  # (B, T, K)
    before = torch.cumsum(probs, dim=-1) - probs  # (B, T, K) mass of the better-ranked tokens
    return before < top_p


def nucleus_mass_loss(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    top_p: float = 0.9,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-log of the student's mass on the teacher's top-p nucleus, per valid position, aggregated.

    `student_logits` (B, T, V) carries the gradient; `teacher_topk_ids` / `teacher_topk_logprobs`
    (B, T, K), most likely first, are the teacher's top-K at each position; `mask` (B, T).
    Stats: train/nucleus_loss, train/nucleus_student_mass, train/nucleus_size."""
    if student_logits.dim() != 3 or teacher_topk_ids.shape != teacher_topk_logprobs.shape:
        raise ValueError(f"student_logits must be (B, T, V) and the teacher's ids / logprobs (B, T, K); got "
                         f"{tuple(student_logits.shape)}, {tuple(teacher_topk_ids.shape)}")
    if student_logits.shape[:2] != mask.shape or teacher_topk_ids.shape[:2] != mask.shape:
        raise ValueError(f"leading (B, T) dims differ from mask {tuple(mask.shape)}")
    valid = mask.bool()  # (B, T)
    ids = torch.where(valid[..., None], teacher_topk_ids.long(), torch.zeros_like(teacher_topk_ids.long()))  # (B,T,K)
    lp = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, ids)  # (B, T, K)
    inside = teacher_nucleus(teacher_topk_logprobs, top_p) & valid[..., None]  # (B, T, K)
    # a duplicate id cannot occur (top-K ids are distinct), so the log-sum-exp is the set's mass
    mass_lp = torch.logsumexp(torch.where(inside, lp, torch.full_like(lp, -1e30)), dim=-1)  # (B, T)
    values = torch.where(valid, -mass_lp, torch.zeros_like(mass_lp))  # (B, T)
    loss = aggregate(values, mask, agg, fixed_denominator=denominator)
    stats = {"train/nucleus_loss": float(loss.detach()),
             "train/nucleus_student_mass": masked_mean_float(mass_lp.detach().exp(), valid),
             "train/nucleus_size": masked_mean_float(inside.sum(-1).float(), valid)}
    return loss, stats
