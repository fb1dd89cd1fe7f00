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


def anchor_positions(mask: torch.Tensor, scores: torch.Tensor, has_pre: torch.Tensor,
                     teacher_agrees: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) the positions OPD's anchor (`kl.anchor_kl_loss`) holds: where no learning signal names a
    token. Rows with an RL term (a finite non-zero score (B,), or advantages of their own, `has_pre`
    (B,)) are left to it; on the other rows, every valid position except each row's divergence point
    (the first position where `teacher_agrees` (B, T) is False: there the teacher said what to change).
    Same dtype as `mask`."""
    rl_rows = (torch.isfinite(scores) & (scores != 0)) | has_pre  # (B,) rows with an RL term
    amask = mask * ~rl_rows[:, None]  # (B, T)
    if teacher_agrees is not None:  # not where the teacher said what to change
        first = until_divergence(teacher_agrees, mask) & ~teacher_agrees.bool()  # (B, T)
        amask = amask * ~first
    return amask
