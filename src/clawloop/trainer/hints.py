"""Which hint the OPD teacher sees (`train.hint_selection`).

A judge that votes N times can extract several hints for one turn
(`Judgement.hint_candidates`, carried to `Sample.hint_candidates`).

- longest: the longest hint, the judge's own choice (OpenClaw-RL keeps the
  longest non-trivial positive hint).
- overlap: the hint under which the teacher's next-token distribution puts the
  most probability on the student's own top-K tokens, averaged over the
  response positions. A hint that drags the teacher far from anything the
  student would say makes `teacher - old` huge on every token, and a student
  cannot follow that in one step; the hint that changes the distribution the
  least while still being a correction gives the most usable signal.
  Ties go to the longer hint. It costs one teacher forward per candidate and
  one student forward, on the samples that have more than one candidate only.

Pure functions here; the trainer runs the forwards (`Trainer.choose_hints`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clawloop.records import Sample


def hint_candidates(s: Sample) -> list[str]:
    """The sample's distinct non-empty hints, `hint` first, in order."""
    out: list[str] = []
    for h in [s.hint, *(s.hint_candidates or [])]:
        h = (h or "").strip()
        if h and h not in out:
            out.append(h)
    return out


def longest_hint(candidates: Sequence[str]) -> str | None:
    """The longest candidate (the first among equals); None for none."""
    best: str | None = None
    for h in candidates:
        if best is None or len(h) > len(best):
            best = h
    return best


def topk_overlap(teacher_logprobs_at_student_topk: torch.Tensor) -> float:
    """Mean over response positions of the teacher's probability mass on the student's top-K ids.

    `teacher_logprobs_at_student_topk` (n, K): the teacher's log-probabilities, at each of the n
    response positions, of the K tokens the student ranks highest there. 0.0 for n = 0."""
    if teacher_logprobs_at_student_topk.dim() != 2:
        raise ValueError(f"expected (n, K), got {tuple(teacher_logprobs_at_student_topk.shape)}")
    if teacher_logprobs_at_student_topk.shape[0] == 0:
        return 0.0
    mass = teacher_logprobs_at_student_topk.float().exp().sum(dim=-1)  # (n,)
    return float(mass.mean())


def pick_by_overlap(candidates: Sequence[str], overlaps: Sequence[float]) -> int:
    """Index of the candidate with the highest overlap; ties (within 1e-9) go to the longer hint."""
    if not candidates or len(candidates) != len(overlaps):
        raise ValueError("one overlap per candidate, at least one candidate")
    return max(range(len(candidates)), key=lambda i: (round(overlaps[i], 9), len(candidates[i]), -i))
