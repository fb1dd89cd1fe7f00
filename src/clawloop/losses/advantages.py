"""Advantages for Binary RL: the judge's scalar score on every response token.

A judged turn has one score: {-1, 0, +1} from a voting judge, any finite
float from a custom reward or a rollout-buffer generator (0.3 stays 0.3, it is
never reduced to its sign); `binary_rl_advantages` puts that score on each of
the turn's response tokens (the loss mask). Samples that come in groups (n > 1
completions of one prompt, from the rollout buffer) are first centred on their
group mean by `group_normalize`, GRPO-style.

Departures from GRPO as usually implemented:
- Groups may have UNEQUAL sizes (a group that lost members to filtering, or
  to a timeout, still trains). Group statistics are computed with `index_add_`
  over a group index, never with `rewards.reshape(-1, n)`, which silently mixes
  neighbouring groups as soon as one group is short (the anchor's bug).
- Samples with no group (`None`, or a negative id in a tensor) keep their raw
  score. A live conversation turn is its own sample; centring a group of one
  would zero it.
- A degenerate group (every member scored the same, singletons included) gets
  advantage exactly 0 and is counted in `train/degenerate_groups`: it carries
  no learning signal, and the trainer should know how much of the batch that is.
- The std (when `std_normalize`) is the unbiased sample std (n - 1), as in TRL
  and verl.

Ungrouped samples (live conversation turns: one answer per prompt) have no
group to centre on. `running_baseline` gives them a baseline anyway: the mean
of the *other* recent ungrouped rewards (leave-one-out over the step's batch
plus a window of earlier steps). Without it a stream of mostly -1 verdicts
pushes down every sampled token, the right digits of an answer that only had
the wrong form included, and the freed probability mass lands on whatever the
softmax gives it: the model loses what it knew (bench/RESULTS.md "Why the loop
made the model worse"). With it, a -1 among mostly -1 verdicts is ~0, and the
rare +1 carries the signal. Any baseline that does not depend on the sample's
own reward leaves the policy gradient unbiased.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def binary_rl_advantages(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Broadcast each sample's scalar score (B,) to its response tokens (B, T).

    Returns the detached per-token advantages, 0 off the mask, and stats:
    train/zero_adv_frac (fraction of samples whose advantage is 0, a dead
    signal), train/score_mean.
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores must be (B,) and response_mask (B, T); got {tuple(scores.shape)} "
                         f"and {tuple(response_mask.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("binary_rl_advantages: scores must be finite (drop unscored samples first)")
    valid = response_mask.bool()  # (B, T)
    s = scores.detach().to(torch.float32)  # (B,)
    adv = torch.where(valid, s[:, None], torch.zeros((), dtype=s.dtype, device=s.device))  # (B, T)
    n = max(int(s.numel()), 1)
    stats = {
        "train/zero_adv_frac": float((s == 0).sum().item()) / n,
        "train/score_mean": float(s.mean().item()) if s.numel() else 0.0,
    }
    return adv, stats


def running_baseline(rewards: torch.Tensor, history: Sequence[float] = ()) -> torch.Tensor:
    """Leave-one-out baselines (B,) for ungrouped rewards (B,): for each sample, the mean of the other
    rewards of the batch together with `history` (rewards of earlier steps). 0 where there is nothing
    else to average (one sample, no history), so a lone sample keeps its raw reward."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got {tuple(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("running_baseline: rewards must be finite")
    r = rewards.detach().to(torch.float32)  # (B,)
    h = torch.tensor([float(x) for x in history], dtype=torch.float32, device=r.device)  # (H,)
    total = r.sum() + h.sum()
    count = r.numel() - 1 + h.numel()
    if count <= 0:
        return torch.zeros_like(r)
    return (total - r) / count  # (B,)


def _group_index(group_ids: torch.Tensor | Sequence[Hashable | None], n: int,
                 device: torch.device) -> torch.Tensor:
    """Contiguous group index (n,) in [0, G); -1 for ungrouped samples."""
    if isinstance(group_ids, torch.Tensor):
        ids = group_ids.to(device=device, dtype=torch.long).reshape(-1)  # (n,)
        if ids.numel() != n:
            raise ValueError(f"group_ids has {ids.numel()} entries for {n} rewards")
        grouped = ids >= 0  # (n,)
        index = torch.full_like(ids, -1)  # (n,)
        if bool(grouped.any()):
            _, inverse = torch.unique(ids[grouped], return_inverse=True)
            index[grouped] = inverse
        return index
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries for {n} rewards")
    seen: dict[Hashable, int] = {}
    out = [-1 if g is None else seen.setdefault(g, len(seen)) for g in group_ids]
    return torch.tensor(out, dtype=torch.long, device=device)


def group_normalize(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable | None],
    *,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Centre each reward (B,) on its group's mean, optionally divide by the group std.

    `group_ids` is a (B,) integer tensor (negative: ungrouped) or a sequence of
    hashables (None: ungrouped), e.g. `[s.group_id for s in samples]`. Groups
    may have any sizes and need not be contiguous. Returns the detached
    normalized rewards (B,) and stats: train/groups, train/degenerate_groups,
    train/degenerate_group_frac, train/ungrouped.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got {tuple(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("group_normalize: rewards must be finite")
    r = rewards.detach().to(torch.float32)  # (B,)
    index = _group_index(group_ids, r.numel(), r.device)  # (B,)
    grouped = index >= 0  # (B,)
    n_groups = int(index.max().item()) + 1 if bool(grouped.any()) else 0
    out = r.clone()  # (B,) ungrouped samples keep their raw score

    degenerate_count = 0
    if n_groups:
        gi = index[grouped]  # (Bg,)
        rg = r[grouped]  # (Bg,)
        count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gi, torch.ones_like(rg))  # (G,)
        total = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gi, rg)  # (G,)
        mean = total / count  # (G,) every group has >= 1 member
        centred = rg - mean[gi]  # (Bg,)
        hi = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, gi, rg, "amax")
        lo = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, gi, rg, "amin")
        degenerate = hi == lo  # (G,) all members equal, singletons included
        if std_normalize:
            sq = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gi, centred * centred)  # (G,)
            std = torch.sqrt(sq / (count - 1).clamp(min=1))  # (G,)
            centred = centred / (std[gi] + eps)  # (Bg,)
        centred = torch.where(degenerate[gi], torch.zeros_like(centred), centred)  # (Bg,) exact zeros
        out[grouped] = centred
        degenerate_count = int(degenerate.sum().item())

    stats = {
        "train/groups": float(n_groups),
        "train/degenerate_groups": float(degenerate_count),
        "train/degenerate_group_frac": degenerate_count / n_groups if n_groups else 0.0,
        "train/ungrouped": float((~grouped).sum().item()),
    }
    return out, stats


def step_wise_advantages(
    step_rewards: torch.Tensor,
    bucket_ids: Sequence[Hashable],
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """OpenClaw-RL's `step_wise` estimator for multi-step agent trajectories.

    `step_rewards` (B,) holds one reward per agent step (outcome + prm_step_coef · step PRM);
    `bucket_ids` names each step's (task group, step index) bucket. Each reward is
    z-normalised within its bucket ((r - mean) / (std + eps), unbiased std), and the steps of
    a constant bucket (all rewards equal, singletons included) carry no signal and are dropped.
    Returns (advantages (B,), keep (B,) bool, stats: train/step_buckets,
    train/step_buckets_dropped, train/steps_dropped).
    """
    adv, _ = group_normalize(step_rewards, list(bucket_ids), std_normalize=True, eps=eps)  # (B,)
    r = step_rewards.detach().to(torch.float32)
    index = _group_index(list(bucket_ids), r.numel(), r.device)  # (B,)
    n = int(index.max().item()) + 1 if r.numel() else 0
    keep = torch.zeros(r.numel(), dtype=torch.bool, device=r.device)  # (B,)
    dropped = 0
    if n:
        hi = torch.full((n,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amax")
        lo = torch.full((n,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amin")
        live = hi > lo  # (G,)
        keep = live[index]
        dropped = int((~live).sum().item())
    stats = {"train/step_buckets": float(n), "train/step_buckets_dropped": float(dropped),
             "train/steps_dropped": float((~keep).sum().item())}
    return adv, keep, stats
