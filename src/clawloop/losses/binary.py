"""Binary RL: the judge's score as the advantage of every response token, the objective of `--method binary`.

    A_t = w_rl * score                  (one turn, one sample: the OpenClaw case, after
                                         the mean baseline and negative weight)
    A_t = w_rl * (score - mean(group))  (groups of n > 1 from the rollout buffer)
    A_t = w_rl * a_t                    (a rollout-buffer sample that arrived with its own advantages)

then the PPO clipped surrogate (`ppo.py`), or the custom loss in its place. Scores are centred
over the whole step before it is cut into micro-batches (`advantages.centre_rewards`: a
micro-batch may split a group); this function puts them on the tokens
(`advantages.combined_advantages` with no teacher) and takes the loss.

Departure from GRPO: an ungrouped sample is not centred on a group (it has none) but on the
mean of the other recent rewards (see `advantages.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from clawloop.losses.advantages import combined_advantages
from clawloop.losses.ppo import ppo_clip_loss


def binary_rl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    pre_advantages: torch.Tensor | None = None,
    has_pre: torch.Tensor | None = None,
    w_rl: float = 1.0,
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] = ppo_clip_loss,
    **pg_knobs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss` (the PPO clip, or a custom loss) with each sample's score (B,) on its tokens.

    `scores` (B,) NaN where a sample has none (it trains on nothing: advantage 0); `pre_advantages`
    (B, T) / `has_pre` (B,) the rows that brought their own. `pg_knobs` go to `policy_loss` (eps_clip,
    eps_clip_high, dual_clip, agg, denominator, is_weights). Stats: the advantages' (train/combine_*)
    and the policy loss's."""
    adv, adv_stats = combined_advantages(scores, None, old_logprobs, mask, w_rl=w_rl, w_opd=0.0,
                                         pre_advantages=pre_advantages, has_pre=has_pre)  # (B, T)
    loss, stats = policy_loss(logprobs, old_logprobs, adv, mask, **pg_knobs)
    return loss, {**adv_stats, **stats}
