"""Advantages: from judged rewards to the per-token advantages every policy-gradient objective trains on.

    centre_rewards       rewards (n,) -> RL scores (n,): group mean (GRPO), mean baseline, negative weight
    combined_advantages  scores (B,), teacher - old (B, T), a rollout group's own (B, T) -> advantages (B, T)

A judged turn has one score: {-1, 0, +1} from a voting judge, any finite
float from a custom reward or a rollout-buffer generator (0.3 stays 0.3, it is
never reduced to its sign); `combined_advantages` puts that score on each of
the turn's response tokens (the loss mask). Samples that come in groups (n > 1
completions of one prompt, from the rollout buffer) are first centred on their
group mean by `group_normalize`, GRPO-style. The trainer calls both functions
(`centre_rewards` once per step, over the whole batch, because a micro-batch may
split a group; `combined_advantages` inside each objective in `binary.py`,
`opd.py`, `combine.py`, `distill.py`).

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

from clawloop.losses.aggregation import masked_mean_float
from clawloop.losses.credit import until_divergence


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


def centre_rewards(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable | None],
    *,
    baseline: str = "mean",
    history: Sequence[float] = (),
    history_has_batch: bool = False,
    negative_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each reward's RL score (n,), from rewards (n,) and their group ids (None: ungrouped).

    A grouped reward is centred on its group's mean (`group_normalize`). An ungrouped one (a live
    turn) has no group to centre on: with `baseline` "mean" it loses the leave-one-out mean of the
    recent rewards (`running_baseline` over the batch and `history`; with `history_has_batch` the
    caller already recorded this batch in `history`, so the mean is over `history` alone), and a
    negative result is then scaled by `negative_weight` (0: a -1 says "not this" but not where;
    module docstring). Stats: the group stats when there are groups, train/baseline (the mean
    baseline subtracted), train/score_mean (of the raw rewards)."""
    if len(group_ids) != rewards.numel():
        raise ValueError(f"group_ids has {len(group_ids)} entries for {rewards.numel()} rewards")
    normed, stats = group_normalize(rewards, group_ids)  # (n,)
    if not stats["train/groups"]:  # no groups: nothing was normalised, the group stats say nothing
        stats = {}
    solo = [k for k, g in enumerate(group_ids) if g is None]
    if solo and baseline == "mean":
        r = rewards[solo]  # (m,)
        if history_has_batch:
            hist = list(history)
            base = torch.tensor([(sum(hist) - x) / (len(hist) - 1) if len(hist) > 1 else 0.0
                                 for x in r.tolist()])  # (m,) leave-one-out over the window
        else:
            base = running_baseline(r, history)  # (m,)
        normed[solo] = r - base
        stats["train/baseline"] = float(base.mean())
    if solo and negative_weight != 1.0:
        a = normed[solo]  # (m,)
        normed[solo] = torch.where(a < 0, a * negative_weight, a)
    stats["train/score_mean"] = float(rewards.mean())
    return normed, stats


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


def combined_advantages(
    scores: torch.Tensor,
    teacher_logprobs: torch.Tensor | None,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    has_score: torch.Tensor | None = None,
    has_teacher: torch.Tensor | None = None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    teacher_agrees: torch.Tensor | None = None,
    pre_advantages: torch.Tensor | None = None,
    has_pre: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages (B, T), detached, 0 off the mask; plus stats:

        A_t = w_rl * score + w_opd * (teacher_logprob_t - old_logprob_t)    (+ w_rl * pre_advantages_t)

    `scores` (B,), `teacher_logprobs` / `old_logprobs` / `mask` (B, T). Which rows have a score or a
    teacher, and the divergence cut with `teacher_agrees` (B, T): `combine.py`'s docstring.
    `opd_clip` bounds |teacher - old| per token before weighting. `pre_advantages` (B, T) are the
    advantages a sample arrived with (a rollout-buffer group's, `has_pre` (B,) marks those rows):
    they are that row's RL term, in place of a score, weighted by `w_rl`; the stats describe the
    score and teacher terms only.
    Stats: train/combine_rl_frac, train/combine_opd_frac, train/combine_both_frac,
    train/combine_no_signal_frac (fractions of samples), train/combine_adv_mean,
    train/combine_zero_adv_frac (valid tokens whose advantage is exactly 0).
    """
    if opd_clip is not None and opd_clip <= 0:
        raise ValueError(f"opd_clip must be > 0, got {opd_clip}")
    if scores.dim() != 1 or mask.dim() != 2 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must be (B,) and mask (B, T); got {tuple(scores.shape)} and {tuple(mask.shape)}")
    if old_logprobs.shape != mask.shape or (teacher_logprobs is not None and teacher_logprobs.shape != mask.shape):
        raise ValueError("old_logprobs, teacher_logprobs and mask must share one (B, T) shape")
    valid = mask.bool()  # (B, T)
    s = scores.detach().to(old_logprobs.dtype)  # (B,)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)

    if has_score is None:
        has_score = torch.isfinite(s)  # (B,)
    has_score = has_score.bool().to(valid.device)  # (B,)
    if (pre_advantages is None) != (has_pre is None):
        raise ValueError("pre_advantages and has_pre come together")
    if has_pre is not None:
        if pre_advantages.shape != mask.shape or has_pre.shape != scores.shape:
            raise ValueError("pre_advantages must be (B, T) like mask and has_pre (B,) like scores")
        has_pre = has_pre.bool().to(valid.device)  # (B,)
        has_score = has_score & ~has_pre  # a rollout group's advantages are its RL term, not a score
    if teacher_logprobs is None:
        if has_teacher is not None and bool(has_teacher.any()):
            raise ValueError("has_teacher marks samples with a teacher but teacher_logprobs is None")
        has_teacher = torch.zeros_like(has_score)  # (B,)
        diff = torch.zeros_like(old_logprobs)  # (B, T)
    else:
        diff = (teacher_logprobs - old_logprobs).detach()  # (B, T)
        if has_teacher is None:
            has_teacher = (torch.isfinite(diff) | ~valid).all(dim=-1)  # (B,)
        has_teacher = has_teacher.bool().to(valid.device)  # (B,)
    if bool((has_score & ~torch.isfinite(s)).any()):
        raise ValueError("combined_advantages: has_score marks a sample whose score is not finite")

    rl_term = torch.where(has_score, s, zero)  # (B,)
    opd_rows = valid & has_teacher[:, None]  # (B, T)
    opd_term = torch.where(opd_rows, diff, zero)  # (B, T)
    if not bool(torch.isfinite(opd_term).all()):
        raise ValueError("combined_advantages: teacher or old logprobs are not finite on a teacher row")
    if opd_clip is not None:
        opd_term = opd_term.clamp(-opd_clip, opd_clip)  # (B, T)
    cut = 0.0
    if teacher_agrees is not None:
        if teacher_agrees.shape != mask.shape:
            raise ValueError("teacher_agrees and mask must share one (B, T) shape")
        agrees = teacher_agrees.bool()
        keep = until_divergence(agrees, opd_rows)  # (B, T)
        spared = opd_rows & ((agrees & (opd_term < 0)) | ~keep)  # (B, T)
        cut = masked_mean_float((opd_rows & ~keep).float(), opd_rows) if bool(opd_rows.any()) else 0.0
        opd_term = torch.where(spared, zero, opd_term)  # (B, T)

    adv = w_rl * rl_term[:, None] + w_opd * opd_term  # (B, T)
    adv = torch.where(valid, adv, zero)  # (B, T)

    n = max(int(s.numel()), 1)
    stats = {
        "train/combine_rl_frac": float(has_score.sum().item()) / n,
        "train/combine_opd_frac": float(has_teacher.sum().item()) / n,
        "train/combine_both_frac": float((has_score & has_teacher).sum().item()) / n,
        "train/combine_no_signal_frac": float((~has_score & ~has_teacher).sum().item()) / n,
        "train/combine_adv_mean": masked_mean_float(adv, valid),
        "train/combine_zero_adv_frac": masked_mean_float((adv == 0).float(), valid),
        "train/opd_after_divergence_frac": cut,
    }
    if has_pre is not None and bool(has_pre.any()):
        adv = adv + torch.where(has_pre[:, None] & valid, w_rl * pre_advantages, torch.zeros_like(adv))  # (B, T)
    return adv, stats
