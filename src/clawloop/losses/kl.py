"""KL to a reference policy and an entropy bonus, both off by default.

Per valid token, with log r = ref_logprob - logprob on the policy's own sample
(Schulman's estimators, http://joschu.net/blog/kl-approx.html):

    k1          = logprob - ref_logprob            unbiased, can be negative
    k2          = 0.5 * (logprob - ref_logprob)^2
    k3          = exp(log r) - 1 - log r            unbiased, always >= 0
    low_var_kl  = k3 (the name verl and slime use)

`kl_loss` returns coef * aggregate(kl); with coef 0 the loss is exactly 0 and
the KL only measured. (The trainer calls it only when `kl_coef > 0`: the
reference logprobs cost a forward, so `train/kl` is absent at coef 0.)

`entropy_bonus` returns -coef * aggregate(entropy): adding it to the loss
rewards a spread-out policy. Off by default; with coef 0 the entropy is still
measured (the trainer reports `train/entropy` on every step: a collapsing
entropy is a dead learning signal).

Departures: k3 / low_var_kl clamp log r to [-20, 20] and the estimate to
[-10, 10] (as verl does) so one token the reference finds absurd cannot blow
up the step; the clamp zeroes that token's gradient rather than exploding it.
Inputs are zeroed on padding first, so NaN there reaches neither loss nor grad.
"""

from __future__ import annotations

import torch

from clawloop.losses.aggregation import aggregate, masked_mean_float

KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(policy || reference) estimate, same shape as the inputs."""
    diff = logprobs - ref_logprobs.detach()  # (B, T) log p - log ref
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        log_r = (-diff).clamp(-20.0, 20.0)  # (B, T) log ref - log p
        return (torch.exp(log_r) - 1.0 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "low_var_kl",
    coef: float = 0.0,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """coef * aggregated KL(policy || reference) over (B, T); stats: train/kl, train/kl_loss."""
    if coef < 0:
        raise ValueError(f"KL coef must be >= 0, got {coef}")
    if logprobs.shape != ref_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, ref_logprobs and mask must share one (B, T) shape")
    valid = mask.bool()  # (B, T)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    kl = kl_penalty(torch.where(valid, logprobs, zero), torch.where(valid, ref_logprobs, zero), kind)  # (B, T)
    mean_kl = aggregate(kl, valid, agg, fixed_denominator=denominator)
    loss = coef * mean_kl if coef else zero + 0.0 * mean_kl  # keeps the graph, gradient 0
    stats = {
        "train/kl": masked_mean_float(kl, valid),
        "train/kl_loss": float(loss.detach().item()),
    }
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...)."""
    logp = torch.log_softmax(logits, dim=-1)  # (..., V)
    return -(logp.exp() * logp).sum(dim=-1)


def entropy_bonus(
    logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 0.0,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-coef * aggregated entropy of `logits` (B, T, V) over `mask` (B, T); stats: train/entropy.

    With coef 0 the entropy is computed without a graph (a metric only) and the
    loss is a constant 0.
    """
    if coef < 0:
        raise ValueError(f"entropy coef must be >= 0, got {coef}")
    if logits.dim() != 3 or logits.shape[:2] != mask.shape:
        raise ValueError(f"logits must be (B, T, V) over mask (B, T); got {tuple(logits.shape)}, {tuple(mask.shape)}")
    valid = mask.bool()  # (B, T)
    if coef:
        ent = entropy_from_logits(logits)  # (B, T)
        loss = -coef * aggregate(ent, valid, agg, fixed_denominator=denominator)
    else:
        with torch.no_grad():
            ent = entropy_from_logits(logits)  # (B, T)
        loss = torch.zeros((), dtype=logits.dtype, device=logits.device)
    return loss, {"train/entropy": masked_mean_float(ent, valid)}


def anchor_kl_loss(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """coef * aggregated full-distribution KL(policy || reference) per position: sum_v p (log p - log p_ref).

    `logits` (B, T, V) carries the gradient, `ref_logits` (B, T, V') the reference's (V' >= V: extra rows
    dropped), `mask` (B, T) the positions to anchor. Unlike `kl_loss`, which sees only the sampled token's
    logprob, this holds the whole next-token distribution where the learning signal says nothing, so the
    answer's other tokens (the digits after a rejected opener) stay where they were. `weights` (B, T), if
    given, scales each position's KL (the anchor's own coefficient on some rows, `--anchor-rl-coef`); the
    aggregation's denominator is the masked positions' as without it.
    Stats: train/anchor_kl, train/anchor_loss."""
    if coef < 0:
        raise ValueError(f"anchor coef must be >= 0, got {coef}")
    if logits.shape[:2] != mask.shape or ref_logits.shape[:2] != mask.shape:
        raise ValueError("logits, ref_logits and mask must share their leading (B, T) dims")
    valid = mask.bool()  # (B, T)
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    ref = torch.log_softmax(ref_logits[..., :logits.shape[-1]].detach().float(), dim=-1)  # (B, T, V)
    kl = (logp.exp() * (logp - ref)).sum(dim=-1)  # (B, T)
    kl = torch.where(valid, kl, torch.zeros_like(kl))
    if weights is not None:
        if weights.shape != mask.shape:
            raise ValueError("weights must have mask's (B, T) shape")
        mean_kl = aggregate(kl * weights.to(kl.dtype), valid, agg, fixed_denominator=denominator)
    else:
        mean_kl = aggregate(kl, valid, agg, fixed_denominator=denominator)
    loss = coef * mean_kl
    return loss, {"train/anchor_kl": masked_mean_float(kl.detach(), valid), "train/anchor_loss": float(loss.detach())}

