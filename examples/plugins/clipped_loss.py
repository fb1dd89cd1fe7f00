"""A custom loss in the OpenClaw-RL README's shape, for `--custom-loss-function-path`.

    clawloop up --custom-loss-function-path examples/plugins/clipped_loss.py

`compute_loss(policy_logits, reference_logits, rewards, advantages, config)` gets
1-D tensors over the micro-batch's trained tokens: the policy's logprobs of the
sampled tokens (with grad), their logprobs before this update, each token's
sample reward and the advantages --method built; `config` is the train section
as a dict plus `clip_range`. It returns the loss, a scalar tensor. (The README
calls the first two "logits"; they are the sampled tokens' logprobs, which is
what makes exp(policy - reference) the PPO ratio.)
"""

from typing import Any

import torch


def compute_loss(policy_logits: torch.Tensor, reference_logits: torch.Tensor, rewards: torch.Tensor,
                 advantages: torch.Tensor, config: dict[str, Any]) -> torch.Tensor:
    """PPO's clipped surrogate plus a small penalty on drifting from the pre-update policy."""
    log_ratio = policy_logits - reference_logits  # (N,)
    ratio = log_ratio.exp()
    eps = config.get("clip_range", 0.2)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps, 1.0 + eps) * advantages)
    drift = config.get("kl_coeff", 0.01) * log_ratio.mean()
    return -surrogate.mean() + drift
