"""A step's samples as tensors: the teacher's signal per sample, one micro-batch (`MicroBatch`), and how a
step is cut (mini-batches by `split_even`, micro-batches under the token budget by `budget_groups`).

Every (B, L-1) tensor is aligned with the *predicted* positions: column t is about token t + 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from clawloop.records import Sample


@dataclass
class TeacherSignal:
    """What the teacher said about one sample's sampled response, given the hinted prompt."""

    logprobs: list[float]
    """The teacher's logprob of each sampled token, aligned with `Sample.tokens` (0.0 on the prompt)."""
    topk_ids: torch.Tensor | None = None
    """(n_response, K) the teacher's K most likely ids at each response position (with distill_topk)."""
    topk_logprobs: torch.Tensor | None = None
    """(n_response, K) their logprobs."""
    top1: list[int] | None = None
    """The teacher's most likely id at each position, aligned with `Sample.tokens` (-1 on the prompt); with
    `opd_credit` divergence."""


@dataclass
class MicroBatch:
    """One micro-batch as tensors; `old`, `is_w` and `fixed_stats` are filled once old logprobs exist."""

    tokens: torch.Tensor  # (B, L) right-padded
    attn: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, L-1) loss mask on the *predicted* positions
    engine_lp: torch.Tensor  # (B, L-1)
    has_engine_lp: torch.Tensor  # (B,)
    scores: torch.Tensor  # (B,) RL score after group normalisation, nan where none
    pre_adv: torch.Tensor  # (B, L-1) precomputed advantages (rollout-buffer groups), 0 where none
    has_pre: torch.Tensor  # (B,)
    teacher_lp: torch.Tensor | None  # (B, L-1) nan rows where no teacher
    topk_ids: torch.Tensor | None  # (B, L-1, K)
    topk_lp: torch.Tensor | None  # (B, L-1, K)
    has_topk: torch.Tensor  # (B,)
    ref_lp: torch.Tensor | None  # (B, L-1)
    temperature: torch.Tensor  # (B,) sampling temperature (1: the raw distribution)
    top_p: torch.Tensor  # (B,)
    rows: int = 0
    teacher_agrees: torch.Tensor | None = None
    """(B, L-1) the next token is the teacher's own top-1 (with `opd_credit` divergence)."""
    ref_logits: torch.Tensor | None = None
    """(B, L-1, V) the base weights' logits (with `anchor_coef`)."""
    constrained: torch.Tensor | None = None
    """(B,) rows sampled under a grammar constraint: their engine logprobs are renormalised over the
    allowed ids (`sampling.logprobs == "constrained"`), so they exceed the trainer's raw ones by
    -log(allowed mass). TIS uses them as they are (the weight is that mass: the importance weight of
    sampling from the masked distribution); the drift metric leaves them out."""
    old: torch.Tensor | None = None  # (B, L-1) logprobs before the first update
    is_w: torch.Tensor | None = None  # (B, L-1) TIS weights
    fixed_stats: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def tempered(self) -> torch.Tensor:
        """(B,) rows sampled from something other than the raw distribution the engine logprobs describe."""
        return (self.temperature != 1.0) | (self.top_p < 1.0)


def pad_rows(rows: list[list[Any]], value: Any, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """Rows of unequal length as one (B, L) tensor, right-padded with `value`."""
    L = max(len(r) for r in rows)
    out = torch.full((len(rows), L), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out if device is None else out.to(device)


def sample_param(s: Sample, key: str) -> float:
    """A sample's sampling parameter; 1.0 (the raw distribution) when it was not recorded."""
    v = (s.sampling or {}).get(key)
    return 1.0 if v is None else float(v)


def budget_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped so that (longest in group) x (group size) <= budget, shortest first; a
    sequence longer than the budget gets a group of its own."""
    budget = max(1, int(budget))
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        L = max(longest, lengths[i])
        if cur and L * (len(cur) + 1) > budget:
            groups.append(cur)
            cur, L = [], lengths[i]
        cur.append(i)
        longest = L
    if cur:
        groups.append(cur)
    return groups


def split_even(n: int, parts: int) -> list[list[int]]:
    """range(n) cut into min(parts, n) contiguous chunks whose sizes differ by at most one."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(list(range(start, end)))
        start = end
    return out


def tensorize(samples: list[Sample], teacher: list[TeacherSignal | None], scores: list[float], *, pad_id: int,
              device: torch.device) -> MicroBatch:
    """One micro-batch of samples as tensors on `device`, with each sample's teacher signal (None: no
    hint) and RL score (nan: none). The base weights' logprobs (`ref_lp`, `ref_logits`) are the
    trainer's to fill: they need a forward."""
    dev = device
    B = len(samples)
    tokens = pad_rows([s.tokens for s in samples], pad_id, torch.long, dev)  # (B, L)
    L = tokens.shape[1]
    attn = pad_rows([[1] * len(s.tokens) for s in samples], 0, torch.long, dev)  # (B, L)
    mask = pad_rows([s.loss_mask[1:] for s in samples], 0, torch.long, dev)  # (B, L-1)
    has_engine = torch.tensor([any(x != 0.0 for x in s.rollout_logprobs) for s in samples], device=dev)  # (B,)
    engine_lp = pad_rows([s.rollout_logprobs[1:] for s in samples], 0.0, torch.float32, dev)  # (B, L-1)
    score_t = torch.tensor(scores, dtype=torch.float32, device=dev)  # (B,)
    has_pre = torch.tensor([s.advantages is not None for s in samples], device=dev)  # (B,)
    pre_adv = pad_rows([(s.advantages[1:] if s.advantages is not None else [0.0] * (len(s.tokens) - 1))
                        for s in samples], 0.0, torch.float32, dev)  # (B, L-1)
    tl = None
    if any(t is not None for t in teacher):
        tl = pad_rows([(t.logprobs[1:] if t is not None else [float("nan")] * (len(s.tokens) - 1))
                       for s, t in zip(samples, teacher)], float("nan"), torch.float32, dev)  # (B, L-1)
    topk_ids = topk_lp = None
    has_topk = torch.tensor([t is not None and t.topk_ids is not None for t in teacher], device=dev)  # (B,)
    if bool(has_topk.any()):
        K = next(t.topk_ids.shape[-1] for t in teacher if t is not None and t.topk_ids is not None)
        topk_ids = torch.zeros((B, L - 1, K), dtype=torch.long, device=dev)  # (B, L-1, K)
        topk_lp = torch.full((B, L - 1, K), -math.log(K + 1), dtype=torch.float32, device=dev)  # (B, L-1, K)
        for b, (s, t) in enumerate(zip(samples, teacher)):
            if t is not None and t.topk_ids is not None:
                a, n = s.prompt_len - 1, t.topk_ids.shape[0]  # position a predicts the first response token
                topk_ids[b, a:a + n] = t.topk_ids.to(dev)
                topk_lp[b, a:a + n] = t.topk_logprobs.to(dev)
    agrees = None
    if any(t is not None and t.top1 is not None for t in teacher):
        top1 = pad_rows([(t.top1[1:] if t is not None and t.top1 is not None else [-1] * (len(s.tokens) - 1))
                         for s, t in zip(samples, teacher)], -1, torch.long, dev)  # (B, L-1)
        agrees = top1 == tokens[:, 1:]  # (B, L-1)
    temps = torch.tensor([sample_param(s, "temperature") for s in samples], device=dev)  # (B,)
    top_p = torch.tensor([sample_param(s, "top_p") for s in samples], device=dev)  # (B,)
    constrained = torch.tensor([(s.sampling or {}).get("logprobs") == "constrained" for s in samples],
                               device=dev)  # (B,)
    return MicroBatch(tokens, attn, mask, engine_lp, has_engine, score_t, pre_adv, has_pre, tl, topk_ids, topk_lp,
                      has_topk, None, temps, top_p, rows=B, constrained=constrained, teacher_agrees=agrees)
