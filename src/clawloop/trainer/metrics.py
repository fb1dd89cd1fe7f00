"""Step metrics from per-micro-batch stats: one rule per kind of number.

A step runs its loss over several micro-batches (a token budget) and, with
`num_steps_per_rollout` > 1, over several optimizer updates. Each call of an
objective returns stats for its own slice; averaging all of them alike is wrong
twice over: a micro-batch's loss is already divided by the step-wide
denominator (it is a *share* of the loss, so shares add up), and the max of
maxima is not their mean. The rules, by key:

    ...loss            micro-batches: sum (shares of one loss); updates: mean
    ..._max            max
    ..._min            min
    train/valid_tokens sum
    SAMPLE_STATS       mean weighted by rows (fractions and means over samples)
    anything else      mean weighted by valid tokens (per-token means)
"""

from __future__ import annotations

from collections.abc import Sequence

SAMPLE_STATS = frozenset({
    "train/combine_rl_frac", "train/combine_opd_frac", "train/combine_both_frac", "train/combine_no_signal_frac",
    "train/zero_adv_frac", "train/score_mean", "train/constrained_frac",
})
"""Stats that are fractions of, or means over, samples rather than tokens."""


def merge_stats(parts: Sequence[tuple[dict[str, float], float, float]], *, losses: str = "sum") -> dict[str, float]:
    """Merge `(stats, valid_tokens, rows)` per slice into one dict (rules in the module docstring).

    `losses="sum"` for the micro-batches of one update (each loss is a share), "mean" across updates
    (each is a whole loss). A key missing from some slices is merged over the slices that have it."""
    if losses not in ("sum", "mean"):
        raise ValueError(f"losses must be 'sum' or 'mean', got {losses!r}")
    keys: dict[str, None] = {}
    for stats, _, _ in parts:
        keys.update(dict.fromkeys(stats))
    out: dict[str, float] = {}
    for k in keys:
        have = [(s[k], tok, rows) for s, tok, rows in parts if k in s]
        values = [v for v, _, _ in have]
        if k == "train/valid_tokens":
            out[k] = float(sum(values))
        elif k.endswith("loss"):
            out[k] = float(sum(values)) if losses == "sum" else float(sum(values) / len(values))
        elif k.endswith("_max"):
            out[k] = float(max(values))
        elif k.endswith("_min"):
            out[k] = float(min(values))
        else:
            weights = [rows if k in SAMPLE_STATS else tok for _, tok, rows in have]
            total = sum(weights)
            out[k] = (float(sum(v * w for v, w in zip(values, weights)) / total) if total > 0
                      else float(sum(values) / len(values)))
    return out
