"""Training objectives: one pure function per objective, each `(tensors, *, knobs) -> (loss, stats)`.

    ppo.py         ppo_clip_loss          the clipped surrogate everything below trains with
    binary.py      binary_rl_loss         judge score as every response token's advantage
    advantages.py  binary_rl_advantages, group_normalize (groups of unequal size), running_baseline
    opd.py         opd_loss               teacher - old logprob as a per-token advantage
    combine.py     combine_loss           w_rl * score + w_opd * (teacher - old)
    credit.py      until_divergence       where a hinted teacher's view is evidence
    topk.py        topk_distill_loss      reverse KL over the teacher's top-K + a tail bucket
    nucleus.py     nucleus_mass_loss      the student's mass on the teacher's top-p nucleus (OPD's default)
    kl.py          kl_loss, entropy_bonus KL to a reference (k1/k2/k3), entropy; both off by default
                   anchor_kl_loss         full-distribution KL where the signal says nothing
    offpolicy.py   tis_weights, behaviour_logprobs, staleness_filter, staleness_token_mask
                   engine/trainer mismatch, sampling at T != 1 / top-p, stale samples
    aggregation.py aggregate, step_denominator   token-mean, seq-mean-*, fixed denominator
    plugins.py     load_custom_loss       --custom-loss-function-path file.py:fn

Stats keys are namespaced `train/...`. Every function is pure: no state, no
config lookups; the trainer passes the knobs from `TrainConfig`.
"""

from clawloop.losses.advantages import binary_rl_advantages, group_normalize, running_baseline
from clawloop.losses.aggregation import (
    AGG_MODES,
    aggregate,
    aggregation_denominator,
    masked_max_float,
    masked_mean_float,
    step_denominator,
)
from clawloop.losses.binary import binary_rl_loss
from clawloop.losses.combine import combine_loss, combined_advantages
from clawloop.losses.credit import until_divergence
from clawloop.losses.kl import KL_KINDS, anchor_kl_loss, entropy_bonus, entropy_from_logits, kl_loss, kl_penalty
from clawloop.losses.offpolicy import (
    behaviour_logprobs,
    logprob_diff_stats,
    staleness_filter,
    staleness_histogram,
    staleness_token_mask,
    tis_weights,
)
from clawloop.losses.opd import opd_advantages, opd_loss
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
    "KL_KINDS",
    "PluginError",
    "aggregate",
    "anchor_kl_loss",
    "aggregation_denominator",
    "binary_rl_advantages",
    "binary_rl_loss",
    "check_signature",
    "combine_loss",
    "combined_advantages",
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
    "opd_advantages",
    "opd_loss",
    "ppo_clip_loss",
    "running_baseline",
    "staleness_filter",
    "staleness_histogram",
    "staleness_token_mask",
    "step_denominator",
    "tis_weights",
    "behaviour_logprobs",
    "topk_distill_loss",
    "nucleus_mass_loss",
    "teacher_nucleus",
    "until_divergence",
]
