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
