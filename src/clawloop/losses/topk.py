"""Top-K distillation: reverse KL from the student to the teacher over K + 1 buckets.

The teacher engine returns, for each response position, its K most likely
token ids and their logprobs (what vLLM / SGLang return as top logprobs). The
student's full distribution is folded onto the same K + 1 buckets, the
teacher's K tokens plus one tail bucket holding the rest of the mass:

    p_s(k) = softmax(student_logits)[id_k]          k = 1..K
    p_s(tail) = 1 - sum_k p_s(k)                     likewise for the teacher
    KL_t = sum_{b in K+tail} p_s(b) * (log p_s(b) - log p_t(b))

and KL_t is reduced by `aggregate`. Reverse KL (student first) is mode-seeking:
the student is pushed off tokens the teacher finds unlikely, and the tail
bucket stops it from hiding mass outside the teacher's top K.

Departures: the tail probabilities are floored at `tail_floor` (1e-8) on both
sides, because the teacher's K logprobs can sum to 1 in float precision and
log 0 would make the loss inf; where the floor is hit the tail gradient is 0.
Padded positions are replaced by a harmless uniform teacher before any
arithmetic so that NaN, -inf or a padding id of -1 there reach neither the
loss nor the gradient. The teacher is a constant (detached).
"""

from __future__ import annotations

import math

import torch

from clawloop.losses.aggregation import aggregate, masked_mean_float


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Maechler 2012)."""
    near_zero = x > -math.log(2.0)
    # Each branch only sees inputs it is finite on: torch.where passes a zero
    # gradient to the unused branch, and 0 * inf there would still be NaN.
    safe = torch.full_like(x, -1.0)
    x_near = torch.where(near_zero, x, safe)
    x_far = torch.where(near_zero, safe, x)
    return torch.where(near_zero, torch.log(-torch.expm1(x_near)), torch.log1p(-torch.exp(x_far)))


def _tail_logprob(topk_logprobs: torch.Tensor, tail_floor: float) -> torch.Tensor:
    """log(1 - sum_k exp(topk_logprobs)) over the last dim, floored at log(tail_floor)."""
    mass = torch.logsumexp(topk_logprobs, dim=-1)  # (B, T) log of the top-K mass
    mass = mass.clamp(max=math.log1p(-tail_floor))  # keep 1 - mass >= tail_floor
    return _log1mexp(mass)


def topk_distill_loss(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    tail: bool = True,
    tail_floor: float = 1e-8,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    merged: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reverse KL(student || teacher) over the teacher's top-K tokens (+ tail), per token.

    `merged` (B, T, K) bool: the top-K tokens of each position that count as one bucket (their summed
    probability on both sides), so mass moves freely among them and only to or from the other buckets
    costs (rehearsal's choosing positions, `trainer/rehearsal.py`). None, or no merged token at a
    position: every token its own bucket. Needs `tail`.

    `student_logits` (B, T, V) carries the gradient; `teacher_topk_ids` (B, T, K)
    long and `teacher_topk_logprobs` (B, T, K) are the teacher's top-K at each
    response position, aligned with `mask` (B, T). `tail=False` drops the tail
    bucket and renormalises both sides over the K tokens instead.

    Stats: train/topk_kl, train/topk_teacher_mass, train/topk_student_mass
    (mean probability the top-K tokens hold).
    """
    if not 0.0 < tail_floor < 1.0:
        raise ValueError(f"tail_floor must be in (0, 1), got {tail_floor}")
    if student_logits.dim() != 3 or teacher_topk_ids.shape != teacher_topk_logprobs.shape:
        raise ValueError(f"student_logits must be (B, T, V) and the teacher's ids / logprobs (B, T, K); got "
                         f"{tuple(student_logits.shape)}, {tuple(teacher_topk_ids.shape)}, "
                         f"{tuple(teacher_topk_logprobs.shape)}")
    if student_logits.shape[:2] != mask.shape or teacher_topk_ids.shape[:2] != mask.shape:
        raise ValueError(f"leading (B, T) dims differ from mask {tuple(mask.shape)}")
    k = teacher_topk_ids.shape[-1]
    valid = mask.bool()  # (B, T)
    vk = valid[..., None]  # (B, T, 1)
    ids = torch.where(vk, teacher_topk_ids.long(), torch.zeros((), dtype=torch.long, device=valid.device))  # (B, T, K)
    uniform = -math.log(k + 1) if tail else -math.log(k)
    t_top = torch.where(vk, teacher_topk_logprobs.detach().to(student_logits.dtype),
                        torch.full((), uniform, dtype=student_logits.dtype, device=valid.device))  # (B, T, K)
    if not bool(torch.isfinite(t_top).all()):
        raise ValueError("topk_distill_loss: teacher top-K logprobs are not finite on valid tokens")

    s_logp = torch.log_softmax(student_logits, dim=-1)  # (B, T, V)
    s_top = torch.gather(s_logp, -1, ids)  # (B, T, K)

    if tail:
        s_logq = torch.cat([s_top, _tail_logprob(s_top, tail_floor)[..., None]], dim=-1)  # (B, T, K+1)
        t_logq = torch.cat([t_top, _tail_logprob(t_top, tail_floor)[..., None]], dim=-1)  # (B, T, K+1)
    else:
        s_logq = torch.log_softmax(s_top, dim=-1)  # (B, T, K)
        t_logq = torch.log_softmax(t_top, dim=-1)  # (B, T, K)

    if merged is not None and tail:
        m = merged.bool() & vk  # (B, T, K)
        if tuple(m.shape) != tuple(ids.shape):
            raise ValueError(f"merged {tuple(merged.shape)} must match the top-K ids {tuple(ids.shape)}")
        each = torch.cat([~m, torch.ones_like(m[..., :1])], dim=-1)  # (B, T, K+1) tokens kept as buckets, tail
        terms = torch.where(each, s_logq.exp() * (s_logq - t_logq), torch.zeros((), dtype=s_logq.dtype,
                                                                                  device=valid.device))
        floor = torch.full((), -1e4, dtype=s_top.dtype, device=valid.device)  # finite: no NaN gradient
        s_m = torch.logsumexp(torch.where(m, s_top, floor), dim=-1)  # (B, T) the merged bucket
        t_m = torch.logsumexp(torch.where(m, t_top, floor), dim=-1)  # (B, T)
        bucket = torch.where(m.any(-1), s_m.exp() * (s_m - t_m), torch.zeros((), dtype=s_m.dtype,
                                                                              device=valid.device))  # (B, T)
        kl = terms.sum(dim=-1) + bucket  # (B, T)
    else:
        kl = (s_logq.exp() * (s_logq - t_logq)).sum(dim=-1)  # (B, T)
    loss = aggregate(kl, valid, agg, fixed_denominator=denominator)

    with torch.no_grad():
        stats = {
            "train/topk_kl": masked_mean_float(kl, valid),
            "train/topk_teacher_mass": masked_mean_float(t_top.exp().sum(-1), valid),
            "train/topk_student_mass": masked_mean_float(s_top.exp().sum(-1), valid),
        }
    return loss, stats
