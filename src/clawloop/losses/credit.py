"""Where a teacher's view of a response is evidence: up to its divergence point.

A hinted teacher scores a response the student already wrote. Up to the first
token the teacher would not pick itself (its top-1 differs from the sampled
id), the response is on the teacher's own path and its view of each position
is an informed one. From the token after that on, the teacher is conditioned
on a prefix it would never have written ("The answer is" under "Answer with
just the number."), and what it says there is not evidence about those
tokens: on the tiny model its top-1 digit after such a prefix is wrong for 4
of 6 sums (bench/RESULTS.md "Why the loop made the model worse").
Speculative decoding draws the same line: tokens are accepted until the first
rejection.

    until_divergence(agrees, mask)   (B, T) bool: positions up to and including
                                      the first disagreement on each row
    teacher_trust(...)               (B, T) bool: where the teacher's view counts
                                      (`--opd-trust surer`)
    trusted_agreement(agrees, trusted, has_teacher)  agreement with the untrusted
                                      positions counted as agreed (no divergence there)

A hint can make the teacher *less* sure of what the hint does not concern: on the
tiny model, "End your answer with an exclamation mark." after the question takes
the teacher's logprob of the right digits from -0.11 (the student's) to -1.12, and
its top-1 digit is the right one only 55 % of the time. Distilled there, the
teacher pulls the student's digits flat, and a digit it gets wrong becomes the
divergence point, so the correction the hint was about (the "!") is never reached
(`bench/opd_trust.py`). With `--opd-trust surer` (the default) the teacher's view
counts only where it is the surer of the two (`teacher_trust`: where it agrees,
surer of the token than the student is of its own top token; where it disagrees,
preferring its token over the written one more strongly than the student prefers
the written one over its token); elsewhere the anchor holds the student, and a
disagreement there is not a divergence.
    anchor_positions(mask, scores, ...)  (B, T): where no signal names a token (the anchor's)
"""

from __future__ import annotations

import torch


def until_divergence(agrees: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the valid positions of each row up to and including its first valid position where
    `agrees` (B, T) is False; every valid position of a row that never disagrees. Off the mask: False."""
    if agrees.shape != mask.shape:
        raise ValueError(f"agrees {tuple(agrees.shape)} and mask {tuple(mask.shape)} differ in shape")
    valid = mask.bool()  # (B, T)
    disagree = valid & ~agrees.bool()  # (B, T)
    seen = torch.cumsum(disagree.long(), dim=-1)  # (B, T) disagreements so far, this one included
    return valid & ((seen == 0) | (disagree & (seen == 1)))  # (B, T)


def rl_term_rows(scores: torch.Tensor, has_pre: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the rows with an RL term, a finite non-zero score (B,) or advantages of their own (`has_pre`)."""
    return (torch.isfinite(scores) & (scores != 0)) | has_pre.bool()


def anchor_positions(mask: torch.Tensor, scores: torch.Tensor, has_pre: torch.Tensor,
                     teacher_agrees: torch.Tensor | None = None, *, rl_rows: bool = False) -> torch.Tensor:
    """(B, T) the positions the anchor (`kl.anchor_kl_loss`) holds: where no learning signal names a token.
    Rows with an RL term (a finite non-zero score (B,), or advantages of their own, `has_pre` (B,)) are
    left to it unless `rl_rows` (`--anchor-rl`): then every valid position of theirs is held too, a
    KL-regularised policy gradient (where the sampled token was a choice the gradient outweighs the
    anchor; where it was near-certain, the digits of an accepted answer, the anchor keeps the base
    distribution). On the other rows, every valid position except each row's divergence point (the first
    position where `teacher_agrees` (B, T) is False: there the teacher said what to change).
    Same dtype as `mask`."""
    rl = rl_term_rows(scores, has_pre)  # (B,)
    amask = mask if rl_rows else mask * ~rl[:, None]  # (B, T)
    if teacher_agrees is not None:  # not where the teacher said what to change (its rows have no RL term)
        first = until_divergence(teacher_agrees, mask) & ~teacher_agrees.bool() & ~rl[:, None]  # (B, T)
        amask = amask * ~first
    return amask


def teacher_trust(agrees: torch.Tensor, teacher_lp: torch.Tensor, teacher_top1: torch.Tensor,
                  teacher_top1_lp: torch.Tensor, logprobs: torch.Tensor, logits: torch.Tensor,
                  has_teacher: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the positions of the teacher rows (`has_teacher` (B,)) where the hinted teacher's view counts.

    Where the teacher would write the sampled token (`agrees`), it counts if the teacher is surer of it than
    the student is of its own top token (else distilling it would only make the student less sure). Where the
    teacher would write another token z, it counts if the teacher's preference for z over the sampled y is
    stronger than the student's for y over z: lp_t(z) - lp_t(y) > lp_s(y) - lp_s(z), i.e. the product of the
    two distributions also picks z. A style hint rejects a wrong opener by ~8 nats where the student barely
    preferred it, and counts; an unsure teacher's other digit (its top-1 at -0.9, the right digit at -2.6)
    against a student sure of the right one (-0.2) does not.

    `teacher_lp` (B, T) the teacher's logprob of the sampled tokens, `teacher_top1` / `teacher_top1_lp` (B, T)
    its most likely token and that token's logprob, `logprobs` (B, T) the student's logprob of the sampled
    tokens, `logits` (B, T, V) the student's (no gradient is taken)."""
    with torch.no_grad():
        z = logits.detach().float()  # (B, T, V)
        lse = torch.logsumexp(z, dim=-1)  # (B, T)
        s_top = z.max(dim=-1).values - lse  # (B, T) the student's own top-1 logprob
        s_z = z.gather(-1, teacher_top1.clamp(min=0).unsqueeze(-1)).squeeze(-1) - lse  # (B, T)
        s_y = logprobs.detach().float()  # (B, T)
        t_z, t_y = teacher_top1_lp.float(), teacher_lp.float()  # (B, T)
        surer = t_z > s_top  # (B, T)
        convinced = (t_z + s_z) > (t_y + s_y)  # (B, T) NaN (no teacher) compares False
        return torch.where(agrees.bool(), surer, convinced) & has_teacher.bool()[:, None]  # (B, T)


def trusted_agreement(agrees: torch.Tensor, trusted: torch.Tensor, has_teacher: torch.Tensor) -> torch.Tensor:
    """`agrees` (B, T) with every position of a teacher row (`has_teacher` (B,)) the teacher is not trusted at
    (`trusted` (B, T), `teacher_trust`) counted as agreed: a disagreement there is no divergence point."""
    return agrees.bool() | (has_teacher.bool()[:, None] & ~trusted.bool())  # (B, T)
