"""Training objectives: one pure function per objective, each `(tensors, *, knobs) -> (loss, stats)`.

The trainer (`trainer/core.py`, `Trainer._objective`) calls exactly one objective per micro-batch:

    --method binary                          binary.py    binary_rl_loss   judge score on every response token
    --method opd     --opd-target advantage  opd.py       opd_loss         teacher - old logprob per token
    --method combine --opd-target advantage  combine.py   combine_loss     w_rl * score + w_opd * (teacher - old)
    --method opd / combine, topk | nucleus   distill.py   distill_loss     w_opd * top-K KL (topk.py) or nucleus
                                                                           mass (nucleus.py), + binary_rl_loss
    --custom-loss-function-path              plugins.py   load_custom_loss stands in for ppo_clip_loss in each

and adds the regularisers itself: kl.py (anchor_kl_loss on credit.anchor_positions, kl_loss, entropy_bonus).

    advantages.py  centre_rewards (group mean, mean baseline, negative weight; once per step),
                   combined_advantages (the per-token advantages of every objective above),
                   group_normalize (groups of unequal size), running_baseline, step_wise_advantages
    ppo.py         ppo_clip_loss          the clipped surrogate the advantage objectives train with
    credit.py      until_divergence       where a hinted teacher's view is evidence; anchor_positions;
                   teacher_trust, trusted_agreement (--opd-trust surer)
    topk.py        topk_distill_loss      reverse KL over the teacher's top-K + a tail bucket
    nucleus.py     nucleus_mass_loss      the student's mass on the teacher's top-p nucleus
    kl.py          kl_loss, entropy_bonus KL to a reference (k1/k2/k3), entropy; both off by default
                   anchor_kl_loss         full-distribution KL where the signal says nothing
    offpolicy.py   tis_weights, behaviour_logprobs, staleness_token_mask
                   engine/trainer mismatch, sampling at T != 1 / top-p, stale tokens
    aggregation.py aggregate, step_denominator   token-mean, seq-mean-*, fixed denominator

Stats keys are namespaced `train/...`. Every function is pure: no state, no
config lookups; the trainer passes the knobs from `TrainConfig`.
"""

from clawloop.losses.advantages import centre_rewards, combined_advantages, group_normalize, running_baseline
from clawloop.losses.aggregation import (
    AGG_MODES,
    aggregate,
    aggregation_denominator,
    masked_max_float,
    masked_mean_float,
    step_denominator,
)
from clawloop.losses.binary import binary_rl_loss
from clawloop.losses.combine import combine_loss
from clawloop.losses.credit import anchor_positions, rl_term_rows, teacher_trust, trusted_agreement, until_divergence
from clawloop.losses.distill import DISTILL_TARGETS, distill_loss
from clawloop.losses.kl import KL_KINDS, anchor_kl_loss, entropy_bonus, entropy_from_logits, kl_loss, kl_penalty
from clawloop.losses.offpolicy import (
    behaviour_logprobs,
    logprob_diff_stats,
    staleness_histogram,
    staleness_token_mask,
    tis_weights,
)
from clawloop.losses.opd import opd_loss
from clawloop.losses.plugins import (
    CUSTOM_LOSS_KWARGS,
    CUSTOM_LOSS_SIGNATURE,
    PluginError,
    check_signature,
    load_callable,
    load_custom_loss,
)
from clawloop.losses.ppo import ppo_clip_loss
from clawloop.losses.nucleus import nucleus_mass_loss, teacher_nucleus
from clawloop.losses.topk import topk_distill_loss

__all__ = [
    "AGG_MODES",
    "CUSTOM_LOSS_KWARGS",
    "CUSTOM_LOSS_SIGNATURE",
    "DISTILL_TARGETS",
    "KL_KINDS",
    "PluginError",
    "aggregate",
    "anchor_kl_loss",
    "anchor_positions",
    "rl_term_rows",
    "aggregation_denominator",
    "binary_rl_loss",
    "centre_rewards",
    "check_signature",
    "combine_loss",
    "combined_advantages",
    "distill_loss",
    "entropy_bonus",
    "entropy_from_logits",
    "group_normalize",
    "kl_loss",
    "kl_penalty",
    "load_callable",
    "load_custom_loss",
    "logprob_diff_stats",
    "masked_max_float",
    "masked_mean_float",
    "opd_loss",
    "ppo_clip_loss",
    "running_baseline",
    "staleness_histogram",
    "staleness_token_mask",
    "step_denominator",
    "tis_weights",
    "behaviour_logprobs",
    "topk_distill_loss",
    "nucleus_mass_loss",
    "teacher_nucleus",
    "teacher_trust",
    "trusted_agreement",
    "until_divergence",
]
