"""OpenClaw-RL's combine loss (Binary RL + OPD in one PPO objective), ported to clawloop.

    clawloop up --method combine --custom-loss-function-path examples/plugins/openclaw_combine_loss.py

It keeps slime's loss signature, `fn(args, batch, logits, sum_of_sample_mean)`,
and the structure of OpenClaw-RL's `combine_loss_function`: logprobs from the
logits, the teacher's advantage (teacher - old) per token added to the judge
score's advantage, PPO's clipped surrogate, reduced by `sum_of_sample_mean`.
Porting it meant three changes:

- slime's helpers come from `clawloop.losses.plugins` (same names, same keywords);
- the weights are clawloop's `--train-w-rl`/`--train-w-opd` (`args.w_opd`; the judge-score
  part in `batch["advantages"]` already carries `w_rl`), not environment variables;
- TIS: clawloop's truncated importance weights (`batch["is_weights"]`) multiply
  the per-token loss, as in the built-in objectives; entropy and KL are left to
  the trainer, which adds them to every loss (so `args.entropy_coef` is 0 here).

On the same batch it gives the built-in combine's loss and gradient
(`clawloop.losses.combine_loss`; tests/test_plugins.py checks it).
"""

from argparse import Namespace
from collections.abc import Callable

import torch

from clawloop.losses.plugins import compute_policy_loss, get_log_probs_and_entropy


def combine_loss_function(args: Namespace, batch: dict, logits: torch.Tensor,
                          sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, dict]:
    rl_advantages = torch.cat(batch["advantages"], dim=0)  # (N,) w_rl * score per token
    old_log_probs = torch.cat(batch["log_probs"], dim=0)  # (N,)
    _, out = get_log_probs_and_entropy(logits, args=args, unconcat_tokens=batch["unconcat_tokens"],
                                       total_lengths=batch["total_lengths"],
                                       response_lengths=batch["response_lengths"])
    new_log_probs = torch.cat(out["log_probs"], dim=0)  # (N,)

    teacher = batch.get("teacher_log_probs")
    if teacher is None:
        opd_advantages = torch.zeros_like(rl_advantages)
    else:  # samples without a teacher carry the old logprobs: their OPD advantage is 0
        opd_advantages = torch.cat([t - o for t, o in zip(teacher, batch["log_probs"])], dim=0)  # (N,)
    advantages = args.w_opd * opd_advantages + rl_advantages  # (N,)

    ppo_kl = old_log_probs - new_log_probs  # (N,)
    pg_loss, clipfrac = compute_policy_loss(ppo_kl, advantages, args.eps_clip, args.eps_clip_high, args.eps_clip_c)
    pg_loss = pg_loss * torch.cat(batch["is_weights"], dim=0)  # (N,) TIS
    loss = sum_of_sample_mean(pg_loss)
    if new_log_probs.numel() == 0:
        loss = loss + 0 * logits.sum()  # keep the graph on a batch with nothing to train
    metrics = {"pg_loss": loss.detach(), "pg_clipfrac": sum_of_sample_mean(clipfrac).detach(),
               "ppo_kl": sum_of_sample_mean(ppo_kl.detach()).detach()}
    return loss, metrics
