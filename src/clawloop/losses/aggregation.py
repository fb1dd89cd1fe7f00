"""Reduce a masked per-token loss of shape (B, T) to one scalar.

Every objective in `clawloop.losses` builds a per-token loss and hands it to
`aggregate`, so the choice of reduction lives in one place and is tested once.

Modes
- "token-mean": sum over valid tokens / number of valid tokens. Long answers
  weigh more than short ones (each token counts the same).
- "seq-mean-token-mean": mean over each row's valid tokens, then mean over the
  rows that have at least one valid token (the original GRPO reduction).
- "seq-mean-token-sum": sum over each row's valid tokens, then mean over the
  rows that have at least one valid token.
- "fixed-denominator": sum over valid tokens / a constant the caller chooses,
  e.g. max_response_tokens * rows (the Dr. GRPO reduction, no length bias).

Micro-batching. A step that splits its batch into micro-batches and sums the
gradients only matches the one-big-batch gradient if every micro-batch divides
by the denominator of the WHOLE step. The trainer does:

    denom = sum(aggregation_denominator(mb.mask, mode) for mb in step)
    # with data parallelism: all_reduce(denom, SUM) and scale by world size,
    # because DDP averages gradients over ranks
    for mb in step:
        loss, stats = ppo_clip_loss(..., agg=mode, denominator=denom)
        loss.backward()            # no division by the number of micro-batches

Without `fixed_denominator` each call divides by its own count, which is only
right when the whole batch is one call. `step_denominator` does that sum for
every mode, "fixed-denominator" included (samples x a per-sample constant, so
the denominator depends on no response's length).

Departures: masked positions are ignored with `torch.where`, so NaN or inf in
padding never reaches the loss value. (A NaN upstream of `values` can still
reach the gradient through the product rule; the objectives zero their inputs
on padding before computing `values` for that reason.) A denominator of 0,
which only happens when nothing is valid, is replaced by 1, so an all-masked
batch gives a loss of exactly 0 that still has a grad path (its gradient is
zero, not NaN). Other denominators are used as given, fractional ones
included (data parallelism divides step-wide counts by the world size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "fixed-denominator"]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "fixed-denominator",
)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    fixed_denominator: float | int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Scalar reduction of `values` (B, T) over `mask` (B, T, bool or 0/1).

    `fixed_denominator` replaces the batch's own denominator (valid tokens for
    "token-mean", non-empty rows for the "seq-mean-*" modes) and is required for
    "fixed-denominator". Pass the step-wide value when micro-batching.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    valid = mask.bool()  # (B, T)
    masked = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))  # (B, T)

    if mode == "token-mean":
        total = masked.sum()
        denom = valid.sum() if fixed_denominator is None else fixed_denominator
    elif mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        row_sum = masked.sum(dim=-1)  # (B,)
        row_len = valid.sum(dim=-1)  # (B,)
        if mode == "seq-mean-token-mean":
            row_sum = row_sum / row_len.clamp(min=1)  # (B,) empty rows stay 0
        total = row_sum.sum()
        denom = (row_len > 0).sum() if fixed_denominator is None else fixed_denominator
    elif mode == "fixed-denominator":
        if fixed_denominator is None:
            raise ValueError('mode "fixed-denominator" needs fixed_denominator=')
        total = masked.sum()
        denom = fixed_denominator
    else:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")

    denom_t = torch.as_tensor(denom, dtype=total.dtype, device=total.device)
    if denom_t.numel() != 1 or not bool(torch.isfinite(denom_t).all()) or bool((denom_t < 0).any()):
        raise ValueError(f"denominator must be one finite number >= 0, got {denom}")
    denom_t = denom_t.reshape(())
    # 0 only when nothing is valid (total is 0 too): 0 / 1, not 0 / 0.
    return total / torch.where(denom_t > 0, denom_t, torch.ones_like(denom_t))


def aggregation_denominator(mask: torch.Tensor, mode: str) -> int:
    """This micro-batch's share of the step denominator for `mode`.

    Sum it over all micro-batches of a step and pass the total as
    `fixed_denominator` / `denominator=`. For "fixed-denominator" the caller
    already owns the constant, so asking here is an error.
    """
    valid = mask.bool()  # (B, T)
    if mode == "token-mean":
        return int(valid.sum().item())
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return int((valid.sum(dim=-1) > 0).sum().item())
    if mode == "fixed-denominator":
        raise ValueError('mode "fixed-denominator" has no per-batch denominator; pass your constant')
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


def step_denominator(masks: Sequence[torch.Tensor], mode: str, *,
                     tokens_per_sample: float | int | None = None) -> float:
    """The denominator of a whole step made of micro-batches with loss masks `masks` (each (B_i, T_i)).

    "fixed-denominator": (rows over all micro-batches) x `tokens_per_sample` (required), Dr. GRPO's
    constant: every sample weighs as if it had that many tokens, whatever its length. The other
    modes: the sum of `aggregation_denominator` over the micro-batches.
    """
    if mode == "fixed-denominator":
        if tokens_per_sample is None or tokens_per_sample <= 0:
            raise ValueError('mode "fixed-denominator" needs tokens_per_sample > 0')
        return float(sum(int(m.shape[0]) for m in masks) * tokens_per_sample)
    return float(sum(aggregation_denominator(m, mode) for m in masks))


def masked_mean_float(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Detached token-mean as a python float, 0.0 when nothing is valid. For stats."""
    return float(aggregate(values.detach().float(), mask, "token-mean").item())


def masked_max_float(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Detached max over valid positions as a python float, 0.0 when nothing is valid."""
    valid = mask.bool()
    if not bool(valid.any()):
        return 0.0
    return float(values.detach()[valid].max().item())
