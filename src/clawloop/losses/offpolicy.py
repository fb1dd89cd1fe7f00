"""Off-policy correction: truncated importance sampling and a staleness bound.

The engine that sampled a turn and the trainer do not compute the same
logprobs: the engine may run other kernels or precision, and may have served
an older policy version. Two corrections, both on by default:

- Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL
  framework secretly brings you off-policy RL training"). The PPO ratio is
  taken against the trainer's own old logprobs; each token's loss is then
  multiplied by

      w_t = min(exp(trainer_old_logprob_t - engine_logprob_t), cap)     (cap 2.0)

  which reweights the engine's samples towards the trainer's old policy. The
  cap bounds the variance; weights are constants (no gradient).
- A staleness bound (`staleness_token_mask`): response tokens more than
  `max_staleness` policy versions older than the reference are taken out of
  the loss mask, and counted; a sample with none left is dropped. The bound
  is per token because an engine that swaps weights under running requests
  (vLLM) yields responses whose tokens come from two versions, and the newer
  tokens of such a response still train. TIS needs nothing extra
  for them: each token carries the engine logprob of the weights that
  sampled it, so its weight is already that token's own ratio.

`train/logprob_diff_abs_mean` (mean |engine - trainer| logprob on the sampled
tokens) is the drift metric the trainer warns on: it should be ~0 for a fresh
on-policy sample from the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clawloop.losses.aggregation import masked_max_float, masked_mean_float

LOG_RATIO_CLAMP = 20.0


def tis_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (B, T), detached, 1 off the mask; plus stats.

    `cap=None` or 0 turns the correction off (all weights 1), but the drift
    metrics are still measured. Stats: train/tis_weight_mean,
    train/tis_weight_max (before the cap), train/tis_clip_frac,
    train/logprob_diff_abs_mean, train/logprob_diff_abs_max.
    """
    if cap is not None and cap < 0:
        raise ValueError(f"TIS cap must be > 0 (or None / 0 for off), got {cap}")
    if old_logprobs.shape != engine_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError("old_logprobs, engine_logprobs and mask must share one (B, T) shape")
    valid = mask.bool()  # (B, T)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    log_ratio = torch.where(valid, (old_logprobs - engine_logprobs).detach(), zero)  # (B, T)
    if not bool(torch.isfinite(log_ratio).all()):
        raise ValueError("tis_weights: trainer or engine logprobs are not finite on valid tokens")
    raw = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T) 1 on padding
    weights = raw.clamp(max=cap) if cap else torch.ones_like(raw)  # (B, T)
    stats = {
        "train/tis_weight_mean": masked_mean_float(weights, valid),
        "train/tis_weight_max": masked_max_float(raw, valid),
        "train/tis_clip_frac": masked_mean_float((raw > cap).float(), valid) if cap else 0.0,
        **logprob_diff_stats(old_logprobs, engine_logprobs, mask),
    }
    return weights, stats


def logprob_diff_stats(
    trainer_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, float]:
    """Mean and max |engine - trainer| logprob over valid tokens (0.0 when none)."""
    valid = mask.bool()  # (B, T)
    diff = torch.where(valid, (engine_logprobs - trainer_logprobs).detach().abs(),
                       torch.zeros((), dtype=trainer_logprobs.dtype, device=trainer_logprobs.device))  # (B, T)
    return {
        "train/logprob_diff_abs_mean": masked_mean_float(diff, valid),
        "train/logprob_diff_abs_max": masked_max_float(diff, valid),
    }


def behaviour_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """log q(target) under the distribution a token was *sampled* from: softmax(logits / T)
    renormalised over the top-p nucleus. (B, T) from logits (B, T, V), targets (B, T) and
    per-row temperature and top_p (B,).

    Engines report logprobs of the unmodified distribution (temperature 1, no top-p): the
    quantity the trainer recomputes. When a turn was sampled at T != 1 or top_p < 1, those are
    not the behaviour policy's, and importance weights against them are wrong. The nucleus rule
    is the hf engine's: sorted by probability, a token is kept while the mass before it is
    <= top_p. T <= 0 is greedy: q is a point mass, log q = 0 at the argmax (the sampled token).
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError("logits must be (B, T, V) and targets (B, T)")
    greedy = temperature <= 0  # (B,)
    t = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)  # (B,)
    lq_all = torch.log_softmax(logits / t[:, None, None], dim=-1)  # (B, T, V)
    lq = lq_all.gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
    nucleus = top_p < 1.0  # (B,)
    if bool(nucleus.any()):
        p_sorted, _ = torch.sort(lq_all.exp(), dim=-1, descending=True)  # (B, T, V)
        before = p_sorted.cumsum(-1) - p_sorted  # mass of the tokens ranked above
        kept = before <= top_p.to(logits.dtype)[:, None, None]  # (B, T, V)
        mass = (p_sorted * kept).sum(-1).clamp_min(1e-30)  # (B, T)
        lq = torch.where(nucleus[:, None], lq - mass.log(), lq)
    return torch.where(greedy[:, None], torch.zeros_like(lq), lq)


def staleness_token_mask(
    versions: torch.Tensor,
    mask: torch.Tensor,
    current_version: int,
    max_staleness: int | None,
) -> tuple[torch.Tensor, int]:
    """`mask` with the tokens more than `max_staleness` versions old removed, and how many valid
    tokens that removed. Any shape; `versions` and `mask` share it (the trainer passes each
    sample's per-token versions, and drops a sample with no trainable token left).

    Staleness is `current_version - version`. `max_staleness=None` keeps everything; 0 keeps only
    tokens of the current version. A version newer than the reference (after resuming an older
    checkpoint) is kept: its engine logprobs are still exact, and TIS corrects for the difference."""
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0 (or None for no bound), got {max_staleness}")
    v = torch.as_tensor(versions, dtype=torch.long)
    valid = torch.as_tensor(mask).bool()
    if v.shape != valid.shape:
        raise ValueError(f"versions {tuple(v.shape)} and mask {tuple(valid.shape)} differ in shape")
    if max_staleness is None:
        return valid.clone(), 0
    fresh = (current_version - v) <= max_staleness  # same shape as mask
    keep = valid & fresh
    return keep, int((valid & ~fresh).sum().item())


def staleness_histogram(versions: torch.Tensor | Sequence[int], current_version: int) -> dict[int, int]:
    """{staleness: number of samples}, staleness = current_version - version, sorted by staleness."""
    v = torch.as_tensor(versions, dtype=torch.long).reshape(-1)  # (B,)
    values, counts = torch.unique(current_version - v, return_counts=True)
    return {int(a): int(b) for a, b in zip(values.tolist(), counts.tolist())}
