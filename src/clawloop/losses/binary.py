"""Binary RL: the judge's score (+1 / -1 / 0) as the advantage of every response token.

    A_t = score                       (one turn, one sample: the OpenClaw case)
    A_t = score - mean(group scores)  (groups of n > 1 from the rollout buffer,
                                       optionally / group std)

then the PPO clipped surrogate (`ppo.py`). The advantage helpers live in
`advantages.py`; this is the objective the trainer calls.

Departure from GRPO: ungrouped samples are not centred (see `advantages.py`),
so a single judged turn with score +1 pushes its tokens up on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from clawloop.losses.advantages import binary_rl_advantages, group_normalize
from clawloop.losses.ppo import ppo_clip_loss


def binary_rl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | Sequence[Hashable | None] | None = None,
    std_normalize: bool = False,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | int | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`ppo_clip_loss` with each sample's score (B,) as its tokens' advantage.

    With `group_ids` the scores are first group-normalized (`group_normalize`).
    Micro-batching: normalize over the whole step first and pass the
    normalized scores with `group_ids=None`, since a micro-batch may split a
    group.
    """
    stats: dict[str, float] = {}
    if group_ids is not None:
        scores, group_stats = group_normalize(scores, group_ids, std_normalize=std_normalize)
        stats.update(group_stats)
    adv, adv_stats = binary_rl_advantages(scores, mask)  # (B, T)
    loss, pg_stats = ppo_clip_loss(
        logprobs,
        old_logprobs,
        adv.to(logprobs.dtype),
        mask,
        eps_clip=eps_clip,
        eps_clip_high=eps_clip_high,
        dual_clip=dual_clip,
        agg=agg,
        denominator=denominator,
        is_weights=is_weights,
    )
    return loss, {**pg_stats, **adv_stats, **stats}
