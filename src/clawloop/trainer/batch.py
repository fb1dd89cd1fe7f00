"""A step's samples as tensors: the teacher's signal per sample, one micro-batch (`MicroBatch`), and how a
step is cut (mini-batches by `split_even`, micro-batches under the token budget by `budget_groups`).

Every (B, W) tensor is aligned with the *predicted* positions of the micro-batch's loss window: column
t is about token `start` + t + 1. The window runs from the first to the last position any row trains
on (`loss_window`): an agent's turn trains ~100s of answer tokens after a prompt of 28 k, and the
logits (W, V) of the window are what the losses read, where the (L, V) of the whole sample would not
fit. Without a window (a custom loss plugin sees whole rows) W = L - 1 and start = 0.
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

    tokens: torch.Tensor  # (B, L) right-padded: the forward's input, whole
    attn: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, W) loss mask on the window's *predicted* positions
    engine_lp: torch.Tensor  # (B, W)
    has_engine_lp: torch.Tensor  # (B,)
    scores: torch.Tensor  # (B,) RL score after group normalisation, nan where none
    pre_adv: torch.Tensor  # (B, W) precomputed advantages (rollout-buffer groups), 0 where none
    has_pre: torch.Tensor  # (B,)
    teacher_lp: torch.Tensor | None  # (B, W) nan rows where no teacher
    topk_ids: torch.Tensor | None  # (B, W, K)
    topk_lp: torch.Tensor | None  # (B, W, K)
    has_topk: torch.Tensor  # (B,)
    ref_lp: torch.Tensor | None  # (B, W)
    temperature: torch.Tensor  # (B,) sampling temperature (1: the raw distribution)
    top_p: torch.Tensor  # (B,)
    rows: int = 0
    teacher_agrees: torch.Tensor | None = None
    """(B, W) the next token is the teacher's own top-1 (with `opd_credit` divergence)."""
    ref_logits: torch.Tensor | None = None
    """(B, W, V) the base weights' logits (with `anchor_coef`)."""
    constrained: torch.Tensor | None = None
    """(B,) rows sampled under a grammar constraint: their engine logprobs are renormalised over the
    allowed ids (`sampling.logprobs == "constrained"`), so they exceed the trainer's raw ones by
    -log(allowed mass). TIS uses them as they are (the weight is that mass: the importance weight of
    sampling from the masked distribution); the drift metric leaves them out."""
    old: torch.Tensor | None = None  # (B, W) logprobs before the first update
    is_w: torch.Tensor | None = None  # (B, W) TIS weights
    fixed_stats: dict[str, float] = dataclasses.field(default_factory=dict)
    start: int = 0
    """The first predicted position of the window (column 0 is about token `start` + 1)."""
    mm: dict[str, torch.Tensor] | None = None
    """A vision-language model's image inputs for the forward (`vision.SampleImages.batch_inputs`); None: text."""

    @property
    def end(self) -> int:
        """One past the window's last predicted position."""
        return self.start + self.mask.shape[1]

    @property
    def targets(self) -> torch.Tensor:
        """(B, W) the tokens the window's positions predict."""
        return self.tokens[:, self.start + 1:self.end + 1]

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


WINDOW_MIN_SKIP = 1024
"""Cut a micro-batch to its loss window only when that leaves out at least this many positions. Below it
the saving is small (< 1024 x V logits), and whole rows keep the built-in objectives' numbers bit for bit
those of a custom loss (which sees whole rows) on the same batch: the window changes nothing but the
order of float sums, which the first AdamW update (~ lr x sign(grad)) magnifies where a gradient is ~0."""


def loss_window(mask: torch.Tensor, min_skip: int | None = None) -> tuple[int, int]:
    """(start, end): the predicted positions from the first to the last that any row of `mask` (B, L-1)
    trains on; every position when none does, or when the window would leave out fewer than `min_skip`."""
    cols = mask.any(dim=0).nonzero()  # (n, 1)
    if cols.numel() == 0:
        return 0, mask.shape[1]
    a, e = int(cols[0, 0]), int(cols[-1, 0]) + 1
    min_skip = WINDOW_MIN_SKIP if min_skip is None else min_skip
    return (a, e) if mask.shape[1] - (e - a) >= min_skip else (0, mask.shape[1])


def tensorize(samples: list[Sample], teacher: list[TeacherSignal | None], scores: list[float], *, pad_id: int,
              device: torch.device, window: bool = True) -> MicroBatch:
    """One micro-batch of samples as tensors on `device`, with each sample's teacher signal (None: no
    hint) and RL score (nan: none), cut to the loss window (`window` False: whole rows). The base
    weights' logprobs (`ref_lp`, `ref_logits`) are the trainer's to fill: they need a forward."""
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
    a, e = loss_window(mask) if window else (0, L - 1)

    def cut(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[:, a:e].contiguous()  # (B, W, ...): the (B, L-1) storage goes

    return MicroBatch(tokens, attn, cut(mask), cut(engine_lp), has_engine, score_t, cut(pre_adv), has_pre, cut(tl),
                      cut(topk_ids), cut(topk_lp), has_topk, None, temps, top_p, rows=B, constrained=constrained,
                      teacher_agrees=cut(agrees), start=a)
