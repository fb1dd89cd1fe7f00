"""Each objective in clawloop.losses against a small example worked out by hand: the functions the
trainer runs (`Trainer._objective` dispatches to binary_rl_loss, opd_loss, combine_loss, distill_loss,
each building its advantages with combined_advantages).

The arithmetic is in the comment above each check; the code only confirms it.
Run: .venv/bin/python -m pytest tests/test_losses.py
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from clawloop.losses import (
    CUSTOM_LOSS_KWARGS,
    PluginError,
    aggregate,
    aggregation_denominator,
    binary_rl_loss,
    centre_rewards,
    check_signature,
    combine_loss,
    combined_advantages,
    distill_loss,
    entropy_bonus,
    entropy_from_logits,
    group_normalize,
    kl_loss,
    kl_penalty,
    load_callable,
    load_custom_loss,
    logprob_diff_stats,
    opd_loss,
    ppo_clip_loss,
    staleness_histogram,
    staleness_token_mask,
    tis_weights,
    topk_distill_loss,
)

torch.set_num_threads(1)

NAN, INF = float("nan"), float("inf")


def t(x, **kw) -> torch.Tensor:
    return torch.tensor(x, dtype=kw.pop("dtype", torch.float64), **kw)


def lp_with_ratios(ratios, **kw) -> torch.Tensor:
    """logprobs whose ratio to old_logprobs = 0 is exactly `ratios`."""
    return torch.log(t(ratios)).requires_grad_(kw.get("grad", True))


# ---------------------------------------------------------------------------- aggregation


# values (padding holds NaN / inf, which must never leak):
#   row 0: 1 2 3    mask 1 1 1
#   row 1: 4 . .    mask 1 0 0
#   row 2: . . .    mask 0 0 0   (fully masked)
AGG_VALUES = [[1.0, 2.0, 3.0], [4.0, NAN, INF], [NAN, -INF, 7.0]]
AGG_MASK = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        # (1 + 2 + 3 + 4) / 4 valid tokens = 2.5
        ("token-mean", {}, 2.5),
        # row means 6/3 = 2 and 4/1 = 4; the empty row is not a row: (2 + 4) / 2 = 3
        ("seq-mean-token-mean", {}, 3.0),
        # row sums 6 and 4: (6 + 4) / 2 = 5
        ("seq-mean-token-sum", {}, 5.0),
        # 10 / the caller's constant 8 = 1.25
        ("fixed-denominator", {"fixed_denominator": 8}, 1.25),
        # a fractional step-wide denominator (DDP: count / world size) is used as is: 10 / 2.5 = 4
        ("token-mean", {"fixed_denominator": 2.5}, 4.0),
    ],
)
def test_aggregate_modes_by_hand(mode, kw, expected):
    values = t(AGG_VALUES).requires_grad_(True)
    loss = aggregate(values, t(AGG_MASK, dtype=torch.bool), mode, **kw)
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert torch.isfinite(values.grad).all()
    assert (values.grad[~t(AGG_MASK, dtype=torch.bool)] == 0).all()


def test_aggregate_token_mean_gradient_by_hand():
    # token-mean over 4 valid tokens: d loss / d v = 1/4 on each valid token, 0 on padding
    values = t(AGG_VALUES).requires_grad_(True)
    aggregate(values, t(AGG_MASK), "token-mean").backward()
    assert torch.equal(values.grad, t([[0.25, 0.25, 0.25], [0.25, 0, 0], [0, 0, 0]]))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("shape", [(3, 4), (0, 4), (3, 0), (0, 0)])
def test_aggregate_nothing_valid_is_zero_with_zero_grad(mode, shape):
    values = torch.full(shape, NAN, dtype=torch.float64, requires_grad=True)
    loss = aggregate(values, torch.zeros(shape, dtype=torch.bool), mode)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(values.grad, torch.zeros(shape, dtype=torch.float64))


def test_aggregation_denominator_counts_tokens_and_nonempty_rows():
    mask = t(AGG_MASK)
    assert aggregation_denominator(mask, "token-mean") == 4
    assert aggregation_denominator(mask, "seq-mean-token-mean") == 2
    assert aggregation_denominator(mask, "seq-mean-token-sum") == 2
    with pytest.raises(ValueError, match="fixed-denominator"):
        aggregation_denominator(mask, "fixed-denominator")


def test_aggregate_rejects_bad_input():
    v, m = t(AGG_VALUES), t(AGG_MASK)
    with pytest.raises(ValueError, match="needs fixed_denominator"):
        aggregate(v, m, "fixed-denominator")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(v, m, "mean")
    with pytest.raises(ValueError, match="differ in shape"):
        aggregate(v, m[:, :2], "token-mean")
    with pytest.raises(ValueError, match="denominator"):
        aggregate(v, m, "token-mean", fixed_denominator=-1)


# ---------------------------------------------------------------------------- micro-batch invariance


def _tiny_policy_batch(seed: int = 0):
    """A linear 'model' W (D, V) over fixed features, a batch of 6 rows of ragged length."""
    g = torch.Generator().manual_seed(seed)
    B, T, D, V = 6, 5, 4, 7
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = [5, 1, 0, 3, 4, 2]  # row 2 is fully masked
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    w0 = torch.randn(D, V, generator=g, dtype=torch.float64)
    old = torch.log_softmax(feats @ w0, -1).gather(-1, tokens[..., None]).squeeze(-1)
    old = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios away from 1: some clip
    is_w = torch.rand(B, T, generator=g, dtype=torch.float64) + 0.5
    return feats, tokens, mask, adv, w0, old, is_w


def _grad(w0, rows_list, feats, tokens, mask, adv, old, is_w, mode, denom_fn):
    w = w0.clone().requires_grad_(True)
    for rows in rows_list:
        logprobs = torch.log_softmax(feats[rows] @ w, -1).gather(-1, tokens[rows][..., None]).squeeze(-1)
        loss, _ = ppo_clip_loss(logprobs, old[rows], adv[rows], mask[rows], agg=mode, dual_clip=3.0,
                                denominator=denom_fn(rows), is_weights=is_w[rows])
        loss.backward()  # gradients accumulate across micro-batches
    return w.grad


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "fixed-denominator"])
def test_microbatch_grad_accumulation_matches_one_big_batch(mode):
    feats, tokens, mask, adv, w0, old, is_w = _tiny_policy_batch()
    one_batch = [slice(0, 6)]
    micro = [slice(0, 2), slice(2, 3), slice(3, 6)]  # uneven, and one holds only the empty row
    if mode == "fixed-denominator":
        step_denom = 6 * 5  # e.g. rows * max_response_tokens
    else:
        step_denom = sum(aggregation_denominator(mask[r], mode) for r in micro)
    big = _grad(w0, one_batch, feats, tokens, mask, adv, old, is_w, mode,
                lambda r: step_denom if mode == "fixed-denominator" else None)
    acc = _grad(w0, micro, feats, tokens, mask, adv, old, is_w, mode, lambda r: step_denom)
    assert torch.allclose(big, acc, rtol=1e-10, atol=1e-12)
    assert big.abs().sum() > 0


def test_microbatch_without_step_denominator_differs():
    # The invariance above is not vacuous: letting each micro-batch divide by
    # its own token count and averaging over micro-batches gives another gradient.
    feats, tokens, mask, adv, w0, old, is_w = _tiny_policy_batch()
    big = _grad(w0, [slice(0, 6)], feats, tokens, mask, adv, old, is_w, "token-mean", lambda r: None)
    micro = [slice(0, 2), slice(3, 6)]
    naive = _grad(w0, micro, feats, tokens, mask, adv, old, is_w, "token-mean", lambda r: None) / len(micro)
    assert not torch.allclose(big, naive, rtol=1e-3)


# ---------------------------------------------------------------------------- PPO


# old_logprobs = 0, so the ratio r is exp(logprobs); eps_clip 0.2, eps_clip_high 0.28:
#   token  A    r     -A*r   -A*clip(r, 0.8, 1.28)   max     clipped?
#   0     +1   1.5   -1.5        -1.28              -1.28     yes
#   1     +1   0.5   -0.5        -0.8               -0.5      no
#   2     -1   0.5    0.5         0.8                0.8      yes
#   3     -1   1.1    1.1         1.1                1.1      no (tie)
# token-mean = (-1.28 - 0.5 + 0.8 + 1.1) / 4 = 0.12 / 4 = 0.03
# clip_frac = 2/4; ratio mean = (1.5 + 0.5 + 0.5 + 1.1) / 4 = 0.9, max 1.5
# approx_kl (k3 = r - 1 - ln r): 0.094535 + 0.193147 + 0.193147 + 0.004690 = 0.485519 / 4 = 0.121380
# grad wrt logprobs: clipped tokens 0; unclipped -A*r/4: token 1 -0.5/4 = -0.125, token 3 1.1/4 = 0.275
PPO_RATIOS = [[1.5, 0.5, 0.5, 1.1]]
PPO_ADV = [[1.0, 1.0, -1.0, -1.0]]


def test_ppo_clip_loss_by_hand():
    logprobs = lp_with_ratios(PPO_RATIOS)
    loss, stats = ppo_clip_loss(logprobs, torch.zeros(1, 4, dtype=torch.float64), t(PPO_ADV), torch.ones(1, 4))
    assert loss.item() == pytest.approx(0.03)
    assert stats["train/clip_frac"] == pytest.approx(0.5)
    assert stats["train/ratio_mean"] == pytest.approx(0.9)
    assert stats["train/ratio_max"] == pytest.approx(1.5)
    assert stats["train/approx_kl"] == pytest.approx(0.121380, abs=1e-6)
    assert stats["train/pg_loss"] == pytest.approx(0.03)
    assert stats["train/dual_clip_frac"] == 0.0
    loss.backward()
    assert torch.allclose(logprobs.grad, t([[0.0, -0.125, 0.0, 0.275]]))


def test_ppo_symmetric_clip_by_hand():
    # eps_clip_high=None: token 0 clips at 1.2 instead of 1.28: (-1.2 - 0.5 + 0.8 + 1.1) / 4 = 0.05
    loss, _ = ppo_clip_loss(lp_with_ratios(PPO_RATIOS), torch.zeros(1, 4, dtype=torch.float64), t(PPO_ADV),
                            torch.ones(1, 4), eps_clip_high=None)
    assert loss.item() == pytest.approx(0.05)


def test_ppo_dual_clip_by_hand():
    # dual_clip c = 3 caps the loss of A < 0 tokens at -A * c = 3:
    #   A=-1, r=5: max(5, 1.2) = 5 -> min(5, 3) = 3   (dual clip active, grad 0)
    #   A=-1, r=2: max(2, 1.2) = 2 -> min(2, 3) = 2   (grad -A*r/3 = 2/3)
    #   A=+1, r=5: max(-5, -1.28) = -1.28             (A > 0: untouched, clipped, grad 0)
    # token-mean = (3 + 2 - 1.28) / 3 = 1.24; dual_clip_frac = 1/3
    logprobs = lp_with_ratios([[5.0, 2.0, 5.0]])
    old, adv, mask = torch.zeros(1, 3, dtype=torch.float64), t([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    loss, stats = ppo_clip_loss(logprobs, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(1.24)
    assert stats["train/dual_clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(logprobs.grad, t([[0.0, 2.0 / 3.0, 0.0]]))
    # without it the first token costs 5: (5 + 2 - 1.28) / 3 = 1.906667; 0 means off, as in the config
    for off in (None, 0.0):
        loss_off, _ = ppo_clip_loss(lp_with_ratios([[5.0, 2.0, 5.0]]), old, adv, mask, dual_clip=off)
        assert loss_off.item() == pytest.approx(5.72 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logprobs, old, adv, mask, dual_clip=0.5)


def test_ppo_is_weights_by_hand():
    # per-token losses (-1.28, -0.5, 0.8, 1.1) times weights (2, 1, 0.5, 1):
    # (-2.56 - 0.5 + 0.4 + 1.1) / 4 = -1.56 / 4 = -0.39
    loss, _ = ppo_clip_loss(lp_with_ratios(PPO_RATIOS), torch.zeros(1, 4, dtype=torch.float64), t(PPO_ADV),
                            torch.ones(1, 4), is_weights=t([[2.0, 1.0, 0.5, 1.0]]))
    assert loss.item() == pytest.approx(-0.39)


def test_ppo_padding_with_nan_reaches_neither_loss_nor_grad():
    # Row 1 is padding after its first token; every padded input is NaN or inf.
    logprobs = t([[math.log(1.5), math.log(0.5)], [math.log(0.5), NAN]]).requires_grad_(True)
    old = t([[0.0, 0.0], [0.0, INF]])
    adv = t([[1.0, 1.0], [-1.0, NAN]])
    mask = t([[1, 1], [1, 0]], dtype=torch.bool)
    loss, stats = ppo_clip_loss(logprobs, old, adv, mask, is_weights=t([[1.0, 1.0], [1.0, NAN]]))
    # the three valid tokens are tokens 0, 1, 2 of the example above: (-1.28 - 0.5 + 0.8) / 3
    assert loss.item() == pytest.approx(-0.98 / 3)
    assert stats["train/valid_tokens"] == 3
    loss.backward()
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad[1, 1] == 0


def test_ppo_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


# ---------------------------------------------------------------------------- Binary RL


def test_binary_rl_advantages_broadcast_by_hand():
    # score of each sample on each of its response tokens, 0 on prompt / padding (the advantages
    # binary_rl_loss trains on: combined_advantages with no teacher)
    mask = t([[0, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv, stats = combined_advantages(t([1.0, -1.0, 0.0]), None, torch.zeros(3, 3, dtype=torch.float64), mask)
    assert torch.equal(adv, t([[0.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert stats["train/combine_zero_adv_frac"] == pytest.approx(1 / 5)  # the score-0 sample's one token
    # an unscored sample (NaN) trains on nothing and says so; a non-finite score marked present is an error
    adv, stats = combined_advantages(t([1.0, NAN]), None, torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2))
    assert torch.equal(adv, t([[1.0, 1.0], [0.0, 0.0]])) and stats["train/combine_no_signal_frac"] == 0.5
    with pytest.raises(ValueError, match="not finite"):
        combined_advantages(t([1.0, NAN]), None, torch.zeros(2, 2), torch.ones(2, 2),
                            has_score=t([1, 1], dtype=torch.bool))


def test_group_normalize_uneven_interleaved_groups_by_hand():
    # ids      a    b    a    c    b    a     c     None
    # reward   1    1    0    1    1    0    -1     0.5
    # a (3 members): mean 1/3 -> 2/3, -1/3, -1/3
    # b (2 members): all equal -> degenerate -> 0, 0
    # c (2 members): mean 0   -> 1, -1
    # None: ungrouped, keeps 0.5
    ids = ["a", "b", "a", "c", "b", "a", "c", None]
    rewards = t([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, -1.0, 0.5])
    out, stats = group_normalize(rewards, ids)
    expected = [2 / 3, 0.0, -1 / 3, 1.0, 0.0, -1 / 3, -1.0, 0.5]
    assert torch.allclose(out, torch.tensor(expected), atol=1e-6)
    assert stats == {"train/groups": 3.0, "train/degenerate_groups": 1.0,
                     "train/degenerate_group_frac": pytest.approx(1 / 3), "train/ungrouped": 1.0}
    # std_normalize, unbiased std:
    # a: squares 4/9 + 1/9 + 1/9 = 2/3, / (3 - 1) = 1/3, std = 0.577350 -> 1.154701, -0.577350, -0.577350
    # c: squares 1 + 1 = 2, / (2 - 1) = 2, std = 1.414214 -> 0.707107, -0.707107
    out, _ = group_normalize(rewards, ids, std_normalize=True)
    expected = [1.154701, 0.0, -0.577350, 0.707107, 0.0, -0.577350, -0.707107, 0.5]
    assert torch.allclose(out, torch.tensor(expected), atol=1e-5)


def test_group_normalize_tensor_ids_and_degenerate_singletons():
    # tensor ids; -1 = ungrouped. Group 7 = {3, 5} (mean 4 -> -1, +1); group 2 = {9} alone:
    # a singleton is degenerate -> 0, counted.
    out, stats = group_normalize(t([3.0, 9.0, 5.0, 2.0]), torch.tensor([7, 2, 7, -1]))
    assert torch.equal(out, torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    assert stats["train/degenerate_groups"] == 1.0 and stats["train/groups"] == 2.0


def test_group_normalize_equal_groups_match_reshape():
    # With equal, contiguous groups the reshape(-1, n) formula is right; ours must agree there.
    r = torch.randn(12, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(12) // 4
    ref = r.reshape(-1, 4)
    ref = ((ref - ref.mean(-1, keepdim=True)) / (ref.std(-1, keepdim=True) + 1e-6)).reshape(-1)
    out, _ = group_normalize(r, ids, std_normalize=True)
    assert torch.allclose(out, ref, atol=1e-6)


def test_binary_rl_loss_by_hand():
    # one group {+1, 0}: mean 0.5 -> advantages +0.5, -0.5 (centre_rewards, once per step, as the
    # trainer does before micro-batching); ratios 1 (logprobs == old):
    # per-token loss -A: row 0 (2 tokens) -0.5, -0.5; row 1 (1 token) +0.5
    # token-mean = (-0.5 - 0.5 + 0.5) / 3 = -1/6; grad = -A/3 = [[-1/6, -1/6], [1/6, 0]]
    logprobs = t([[-1.0, -2.0], [-0.5, 0.0]]).requires_grad_(True)
    mask = t([[1, 1], [1, 0]])
    scores, group_stats = centre_rewards(t([1.0, 0.0]), ["g", "g"])
    loss, stats = binary_rl_loss(logprobs, logprobs.detach(), scores, mask)
    assert loss.item() == pytest.approx(-1 / 6)
    loss.backward()
    assert torch.allclose(logprobs.grad, t([[-1 / 6, -1 / 6], [1 / 6, 0.0]]))
    assert group_stats["train/groups"] == 1.0
    # without groups the raw scores train: (-1 - 1 + 0) / 3 = -2/3
    loss, stats = binary_rl_loss(logprobs, logprobs.detach(), t([1.0, 0.0]), mask)
    assert loss.item() == pytest.approx(-2 / 3)
    assert stats["train/combine_zero_adv_frac"] == pytest.approx(1 / 3)  # row 1's one token
    assert stats["train/combine_rl_frac"] == 1.0 and stats["train/valid_tokens"] == 3.0


def test_binary_rl_loss_weights_and_a_rollout_groups_own_advantages_by_hand():
    # row 0: score 1, w_rl 2 -> A = (2, 2); row 1 arrived with its own advantages (0.5, -1): they are
    # its RL term (its score, 5, is ignored) -> w_rl x (0.5, -1) = (1, -2)
    # ratio 1: token-mean of -A = -(2 + 2 + 1 - 2) / 4 = -3/4
    old = torch.zeros(2, 2, dtype=torch.float64)
    pre, has_pre = t([[0.0, 0.0], [0.5, -1.0]]), t([0, 1], dtype=torch.bool)
    loss, stats = binary_rl_loss(old.clone().requires_grad_(True), old, t([1.0, 5.0]), torch.ones(2, 2),
                                 pre_advantages=pre, has_pre=has_pre, w_rl=2.0)
    assert loss.item() == pytest.approx(-3 / 4)
    assert stats["train/combine_rl_frac"] == 0.5  # the scores; the pre row is its own kind of signal
    with pytest.raises(ValueError, match="together"):
        binary_rl_loss(old.clone().requires_grad_(True), old, t([1.0, 5.0]), torch.ones(2, 2), pre_advantages=pre)


# ---------------------------------------------------------------------------- OPD


def test_opd_loss_by_hand():
    # teacher - old = (-1 - -2, -0.5 - -0.5, -3 - -1) = (1, 0, -2)
    # logprobs == old, ratio 1: per-token loss -A = (-1, 0, 2), token-mean = 1/3
    # opd_clip 1.5: A = (1, 0, -1.5), loss = (-1 + 0 + 1.5) / 3 = 1/6
    # w_opd 2: A = (2, 0, -4), loss = 2/3
    teacher, old = t([[-1.0, -0.5, -3.0]]), t([[-2.0, -0.5, -1.0]])
    mask = torch.ones(1, 3)
    adv, _ = combined_advantages(t([NAN]), teacher, old, mask)  # OPD's advantages: no score
    assert torch.equal(adv, t([[1.0, 0.0, -2.0]]))
    logprobs = old.clone().requires_grad_(True)
    loss, stats = opd_loss(logprobs, old, teacher, mask)
    assert loss.item() == pytest.approx(1 / 3)
    assert stats["train/combine_opd_frac"] == 1.0 and stats["train/combine_rl_frac"] == 0.0
    loss.backward()
    assert torch.allclose(logprobs.grad, t([[-1 / 3, 0.0, 2 / 3]]))
    loss, stats = opd_loss(old.clone().requires_grad_(True), old, teacher, mask, opd_clip=1.5)
    assert loss.item() == pytest.approx(1 / 6)
    loss, _ = opd_loss(old.clone().requires_grad_(True), old, teacher, mask, w_opd=2.0)
    assert loss.item() == pytest.approx(2 / 3)
    # the divergence cut (opd_credit divergence): the teacher agrees with token 0, not with token 1 ->
    # token 0 keeps +1, token 1 (the divergence point) keeps its 0, token 2 is past it -> 0; loss -1/3
    agrees = t([[1, 0, 1]], dtype=torch.bool)
    loss, stats = opd_loss(old.clone().requires_grad_(True), old, teacher, mask, teacher_agrees=agrees)
    assert loss.item() == pytest.approx(-1 / 3)
    assert stats["train/opd_after_divergence_frac"] == pytest.approx(1 / 3)


def test_opd_ignores_garbage_teacher_on_padding():
    teacher, old = t([[-1.0, NAN]]), t([[-2.0, 0.0]])
    adv, _ = combined_advantages(t([NAN]), teacher, old, t([[1, 0]]))
    assert torch.equal(adv, t([[1.0, 0.0]]))
    # a row without a teacher (NaN on its valid tokens) trains on nothing, it is not an error
    loss, stats = opd_loss(old.clone().requires_grad_(True), old, t([[NAN, NAN]]), t([[1, 1]]))
    assert loss.item() == 0.0 and stats["train/combine_no_signal_frac"] == 1.0


def test_distill_loss_by_hand():
    # nucleus target, one row of 2 positions, a uniform student over V = 4 (p = 1/4 everywhere).
    # The teacher's top-2 (0.95, 0.04) with top_p 0.9: the nucleus is its top-1 alone, so each position's
    # loss is -log 1/4 = log 4. The teacher disagrees with the sampled token at position 0 (the
    # divergence point, kept) and agrees at 1 (past it, cut): the term covers position 0 only -> log 4;
    # w_opd 2 -> 2 log 4. The score 1 adds the policy-gradient term, ratio 1: token-mean of -1 = -1.
    logits = torch.zeros(1, 2, 4, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[[0, 1], [2, 3]]])
    t_lp = torch.log(t([[[0.95, 0.04], [0.95, 0.04]]]))
    old, mask = torch.full((1, 2), math.log(0.25), dtype=torch.float64), torch.ones(1, 2)
    agrees = t([[0, 1]], dtype=torch.bool)
    kw = dict(teacher_topk_ids=ids, teacher_topk_logprobs=t_lp, teacher_agrees=agrees, target="nucleus", top_p=0.9,
              w_opd=2.0)
    loss, stats = distill_loss(old.clone().requires_grad_(True), old, logits, mask, scores=t([1.0]), **kw)
    assert loss.item() == pytest.approx(2 * math.log(4) - 1)
    assert stats["train/opd_after_divergence_frac"] == pytest.approx(0.5)
    assert stats["train/nucleus_size"] == 1.0 and stats["train/pg_loss"] == pytest.approx(-1.0)
    # no score and no advantages of its own (--method opd): the distribution term alone, no PPO term
    loss, stats = distill_loss(old.clone().requires_grad_(True), old, logits, mask, **kw)
    assert loss.item() == pytest.approx(2 * math.log(4)) and "train/pg_loss" not in stats
    # a row the teacher saw no hint for (has_topk False) is not distilled
    loss, _ = distill_loss(old.clone().requires_grad_(True), old, logits, mask, scores=t([1.0]),
                           has_topk=t([0], dtype=torch.bool), **kw)
    assert loss.item() == pytest.approx(-1.0)
    # the top-K target is w_opd x topk_distill_loss on the same positions, reported as train/topk_loss
    kw["target"] = "topk"
    loss, stats = distill_loss(old.clone().requires_grad_(True), old, logits, mask, **kw)
    ref, _ = topk_distill_loss(logits, ids, t_lp, t([[1, 0]]))
    assert loss.item() == pytest.approx(2 * ref.item()) and stats["train/topk_loss"] == pytest.approx(2 * ref.item())
    with pytest.raises(ValueError, match="nothing to train on"):
        distill_loss(old, old, logits, mask, teacher_topk_ids=None, teacher_topk_logprobs=None)


# ---------------------------------------------------------------------------- Combine


# old logprobs -1 everywhere, 3 samples x 2 tokens, all valid:
#   s0: score +1 and a teacher (-0.5, -2)  -> A = 1 + (0.5, -1)   = (1.5, 0)
#   s1: teacher only (-1.5, -1), no score  -> A = 0 + (-0.5, 0)   = (-0.5, 0)
#   s2: score -1 only, teacher row is NaN   -> A = -1 + 0          = (-1, -1)
# ratio 1: loss = mean(-A) = -(1.5 + 0 - 0.5 + 0 - 1 - 1) / 6 = 1/6
# w_rl 2, w_opd 0.5: s0 (2.25, 1.5), s1 (-0.25, 0), s2 (-2, -2): sum -0.5 -> loss 0.5 / 6 = 1/12
COMBINE_OLD = [[-1.0, -1.0]] * 3
COMBINE_TEACHER = [[-0.5, -2.0], [-1.5, -1.0], [NAN, NAN]]
COMBINE_SCORES = [1.0, NAN, -1.0]


def test_combined_advantages_by_hand():
    old, mask = t(COMBINE_OLD), torch.ones(3, 2)
    adv, stats = combined_advantages(t(COMBINE_SCORES), t(COMBINE_TEACHER), old, mask)
    assert torch.equal(adv, t([[1.5, 0.0], [-0.5, 0.0], [-1.0, -1.0]]))
    assert stats["train/combine_rl_frac"] == pytest.approx(2 / 3)
    assert stats["train/combine_opd_frac"] == pytest.approx(2 / 3)
    assert stats["train/combine_both_frac"] == pytest.approx(1 / 3)
    assert stats["train/combine_no_signal_frac"] == 0.0
    assert stats["train/combine_zero_adv_frac"] == pytest.approx(2 / 6)


def test_combine_loss_by_hand_and_weights():
    old, mask = t(COMBINE_OLD), torch.ones(3, 2)
    loss, _ = combine_loss(old.clone().requires_grad_(True), old, t(COMBINE_SCORES), t(COMBINE_TEACHER), mask)
    assert loss.item() == pytest.approx(1 / 6)
    loss, _ = combine_loss(old.clone().requires_grad_(True), old, t(COMBINE_SCORES), t(COMBINE_TEACHER), mask,
                           w_rl=2.0, w_opd=0.5)
    assert loss.item() == pytest.approx(1 / 12)


def test_combine_explicit_presence_masks_ignore_filler_values():
    # A collator that fills missing teachers / scores with 0 must not turn the
    # filler into a signal: with has_* given, the filler is ignored (same as above).
    old, mask = t(COMBINE_OLD), torch.ones(3, 2)
    teacher = t([[-0.5, -2.0], [-1.5, -1.0], [0.0, 0.0]])  # s2 filler would read as +1, +1
    adv, _ = combined_advantages(t([1.0, 0.0, -1.0]), teacher, old, mask,
                                 has_score=t([1, 0, 1], dtype=torch.bool), has_teacher=t([1, 1, 0], dtype=torch.bool))
    assert torch.equal(adv, t([[1.5, 0.0], [-0.5, 0.0], [-1.0, -1.0]]))


def test_combine_without_teacher_is_binary_rl():
    old, mask = t(COMBINE_OLD), t([[1, 1], [1, 0], [0, 0]])
    adv, stats = combined_advantages(t([1.0, -1.0, NAN]), None, old, mask)
    assert torch.equal(adv, t([[1.0, 1.0], [-1.0, 0.0], [0.0, 0.0]]))
    assert stats["train/combine_no_signal_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="teacher_logprobs is None"):
        combined_advantages(t([1.0]), None, t([[0.0]]), t([[1]]), has_teacher=t([1], dtype=torch.bool))


# ---------------------------------------------------------------------------- Top-K distillation


def test_topk_distill_reverse_kl_by_hand():
    # student p = (0.4, 0.3, 0.2, 0.1) over V = 4; teacher top-2: id 1 -> 0.5, id 0 -> 0.3, tail 0.2
    # student on the same buckets: id 1 -> 0.3, id 0 -> 0.4, tail 0.2 + 0.1 = 0.3
    # KL(s || t) = 0.3 ln(0.3/0.5) + 0.4 ln(0.4/0.3) + 0.3 ln(0.3/0.2)
    #            = 0.3 (-0.510826) + 0.4 (0.287682) + 0.3 (0.405465)
    #            = -0.153248 + 0.115073 + 0.121640 = 0.083465
    logits = torch.log(t([[[0.4, 0.3, 0.2, 0.1]]])).requires_grad_(True)
    ids = torch.tensor([[[1, 0]]])
    t_lp = torch.log(t([[[0.5, 0.3]]]))
    loss, stats = topk_distill_loss(logits, ids, t_lp, torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.083465, abs=1e-6)
    assert stats["train/topk_teacher_mass"] == pytest.approx(0.8)
    assert stats["train/topk_student_mass"] == pytest.approx(0.7)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    # tail=False renormalises over the K tokens: s = (3/7, 4/7), t = (5/8, 3/8)
    # KL = 3/7 ln(24/35) + 4/7 ln(32/21) = 3/7 (-0.377294) + 4/7 (0.421213) = -0.161697 + 0.240693 = 0.078996
    loss, _ = topk_distill_loss(torch.log(t([[[0.4, 0.3, 0.2, 0.1]]])), ids, t_lp, torch.ones(1, 1), tail=False)
    assert loss.item() == pytest.approx(0.078996, abs=1e-6)


def test_topk_distill_zero_when_student_matches_and_safe_on_padding():
    # student == teacher on every bucket -> KL 0 (and a stationary point: grad 0)
    probs = t([0.5, 0.25, 0.125, 0.125])
    logits = torch.log(probs)[None, None].repeat(1, 2, 1).requires_grad_(True)  # (1, 2, 4)
    ids = torch.tensor([[[0, 1], [-1, -1]]])  # position 1 is padding: id -1, NaN logprobs
    t_lp = t([[[math.log(0.5), math.log(0.25)], [NAN, NAN]]])
    loss, _ = topk_distill_loss(logits, ids, t_lp, t([[1, 0]]))
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    loss.backward()
    assert torch.allclose(logits.grad, torch.zeros_like(logits), atol=1e-10)


def test_topk_distill_teacher_holding_all_mass_stays_finite():
    # teacher's K logprobs sum to 1 (tail 0): the tail floor keeps the loss finite
    logits = torch.zeros(1, 1, 3, requires_grad=True)
    loss, _ = topk_distill_loss(logits, torch.tensor([[[0, 1, 2]]]), torch.log(torch.full((1, 1, 3), 1 / 3)),
                                torch.ones(1, 1))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logits.grad).all()


# ---------------------------------------------------------------------------- KL and entropy


def test_kl_estimators_by_hand():
    # logprobs (-1, -2), ref (-1.5, -1): d = logp - ref = (0.5, -1)
    # k1 = d = (0.5, -1), mean -0.25
    # k2 = d^2 / 2 = (0.125, 0.5), mean 0.3125
    # k3: log r = ref - logp = (-0.5, 1): e^-0.5 - 1 + 0.5 = 0.106531; e^1 - 1 - 1 = 0.718282; mean 0.412406
    lp, ref, mask = t([[-1.0, -2.0]]), t([[-1.5, -1.0]]), torch.ones(1, 2)
    for kind, mean in [("k1", -0.25), ("k2", 0.3125), ("k3", 0.412406), ("low_var_kl", 0.412406)]:
        loss, stats = kl_loss(lp, ref, mask, kind=kind, coef=0.1)
        assert stats["train/kl"] == pytest.approx(mean, abs=1e-6)
        assert loss.item() == pytest.approx(0.1 * mean, abs=1e-7)
    # off by default: loss 0 (no gradient), but the KL is still measured
    lp_g = lp.clone().requires_grad_(True)
    loss, stats = kl_loss(lp_g, ref, mask)
    assert loss.item() == 0.0 and stats["train/kl"] == pytest.approx(0.412406, abs=1e-6)
    loss.backward()
    assert torch.equal(lp_g.grad, torch.zeros_like(lp))
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(lp, ref, "k4")


def test_low_var_kl_is_clamped():
    # log r = -30 - 0 clamps to -20: e^-20 - 1 + 20 = 19.000000002 -> clamped to 10
    assert kl_penalty(t([0.0]), t([-30.0]), "low_var_kl").item() == 10.0


def test_entropy_by_hand():
    # p = (0.5, 0.25, 0.25): H = 0.5 ln 2 + 2 * 0.25 ln 4 = 0.346574 + 0.693147 = 1.039721
    # uniform over 4: H = ln 4 = 1.386294
    logits = torch.log(t([[[0.5, 0.25, 0.25, 1e-300], [1.0, 1.0, 1.0, 1.0]]]))
    # (1e-300 keeps the logit finite; its p ln p is ~ -7e-298)
    h = entropy_from_logits(logits)
    assert torch.allclose(h, t([[1.039721, 1.386294]]), atol=1e-6)
    # bonus with coef 0.01 over both tokens: -0.01 * (1.039721 + 1.386294) / 2 = -0.012130
    logits_g = logits.clone().requires_grad_(True)
    loss, stats = entropy_bonus(logits_g, torch.ones(1, 2), coef=0.01)
    assert loss.item() == pytest.approx(-0.012130, abs=1e-6)
    assert stats["train/entropy"] == pytest.approx(1.213008, abs=1e-6)
    loss.backward()
    assert torch.isfinite(logits_g.grad).all()
    loss, stats = entropy_bonus(logits, torch.ones(1, 2))  # off by default, still measured
    assert loss.item() == 0.0 and stats["train/entropy"] == pytest.approx(1.213008, abs=1e-6)


# ---------------------------------------------------------------------------- off-policy


def test_tis_weights_by_hand():
    # trainer old - engine = (-1 - -1.5, -2 - -1, -0.5 - -1.5) = (0.5, -1, 1)
    # raw ratios (e^0.5, e^-1, e^1) = (1.648721, 0.367879, 2.718282); cap 2 -> (1.648721, 0.367879, 2)
    # mean weight 4.016600 / 3 = 1.338867; clip_frac 1/3; |engine - trainer| = (0.5, 1, 1): mean 0.833333, max 1
    # the 4th token is padding (NaN engine logprob): weight 1, not counted
    old, engine = t([[-1.0, -2.0, -0.5, 0.0]]), t([[-1.5, -1.0, -1.5, NAN]])
    mask = t([[1, 1, 1, 0]])
    w, stats = tis_weights(old, engine, mask)
    assert torch.allclose(w, t([[1.648721, 0.367879, 2.0, 1.0]]), atol=1e-6)
    assert stats["train/tis_weight_mean"] == pytest.approx(1.338867, abs=1e-6)
    assert stats["train/tis_weight_max"] == pytest.approx(2.718282, abs=1e-6)
    assert stats["train/tis_clip_frac"] == pytest.approx(1 / 3)
    assert stats["train/logprob_diff_abs_mean"] == pytest.approx(0.833333, abs=1e-6)
    assert stats["train/logprob_diff_abs_max"] == pytest.approx(1.0)
    # off: all ones, drift still measured
    w, stats = tis_weights(old, engine, mask, cap=None)
    assert torch.equal(w, torch.ones_like(w))
    assert stats["train/logprob_diff_abs_mean"] == pytest.approx(0.833333, abs=1e-6)
    assert logprob_diff_stats(old, old, mask)["train/logprob_diff_abs_mean"] == 0.0


def test_staleness_bound_by_hand():
    # one token per sample, all valid: current version 5, versions (5, 4, 1, 3, 6) -> staleness (0, 1, 4, 2, -1)
    # K = 2 keeps all but the 4-old one; K = 0 keeps 0 and the (newer) -1
    versions, ones = [5, 4, 1, 3, 6], torch.ones(5, dtype=torch.long)
    keep, dropped = staleness_token_mask(torch.tensor(versions), ones, 5, 2)
    assert keep.tolist() == [True, True, False, True, True] and dropped == 1
    keep, dropped = staleness_token_mask(torch.tensor(versions), ones, 5, 0)
    assert keep.tolist() == [True, False, False, False, True] and dropped == 3
    keep, dropped = staleness_token_mask(torch.tensor(versions), ones, 5, None)
    assert keep.all() and dropped == 0
    keep, dropped = staleness_token_mask([], [], 5, 2)
    assert keep.numel() == 0 and dropped == 0
    assert staleness_histogram(versions, 5) == {-1: 1, 0: 1, 1: 1, 2: 1, 4: 1}
    with pytest.raises(ValueError, match="max_staleness"):
        staleness_token_mask(torch.tensor(versions), ones, 5, -1)


def test_staleness_token_mask_by_hand():
    # current version 5, K = 1. Row 0: a response that started on v3 and ended on v6 after three
    # swaps; staleness per position (2, 2, 2, 1, 0, -1): the two valid v3 tokens go, the rest stay
    # (the prompt position is old too but was never valid, so it is not counted). Row 1: three
    # valid v3 tokens, all go.
    versions = t([[3, 3, 3, 4, 5, 6], [6, 3, 3, 3, 3, 3]], dtype=torch.long)
    mask = t([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.long)
    keep, removed = staleness_token_mask(versions, mask, 5, 1)
    assert keep.tolist() == [[False, False, False, True, True, True], [False, False, False, False, False, False]]
    assert removed == 2 + 3
    # K = 2: staleness 2 is allowed, every valid token stays
    keep, removed = staleness_token_mask(versions, mask, 5, 2)
    assert keep.tolist() == [[False, True, True, True, True, True], [False, True, True, True, False, False]]
    assert removed == 0
    # 1-D rows work as well (the trainer masks one sample at a time); None: no bound
    keep, removed = staleness_token_mask(torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]), 3, 0)
    assert keep.tolist() == [False, False, True] and removed == 2
    keep, removed = staleness_token_mask(torch.tensor([0, 0]), torch.tensor([1, 0]), 9, None)
    assert keep.tolist() == [True, False] and removed == 0
    with pytest.raises(ValueError, match="max_staleness"):
        staleness_token_mask(torch.tensor([1]), torch.tensor([1]), 1, -1)
    with pytest.raises(ValueError, match="differ in shape"):
        staleness_token_mask(torch.tensor([1, 2]), torch.tensor([1]), 1, 0)


# ---------------------------------------------------------------------------- plugins


GOOD_LOSS = '''
from clawloop.losses import ppo_clip_loss

def my_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
    loss, stats = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, **kwargs)
    return loss * 2, {"custom/doubled": 1}

def custom_loss(lp, old, adv, mask, **kw):
    return (lp * 0).sum(), {}

def too_few(logprobs, advantages):
    return logprobs.sum(), {}

def no_kwargs(logprobs, old_logprobs, advantages, mask):
    return logprobs.sum(), {}

def returns_list(logprobs, old_logprobs, advantages, mask, **kwargs):
    return [logprobs.sum(), {}]

def returns_vector(logprobs, old_logprobs, advantages, mask, **kwargs):
    return logprobs, {}

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "my_losses.py"
    path.write_text(textwrap.dedent(GOOD_LOSS))
    return path


def _ppo_inputs():
    return lp_with_ratios(PPO_RATIOS), torch.zeros(1, 4, dtype=torch.float64), t(PPO_ADV), torch.ones(1, 4)


def test_custom_loss_from_file_runs(plugin_file):
    fn = load_custom_loss(f"{plugin_file}:my_loss")
    knobs = {k: None for k in CUSTOM_LOSS_KWARGS} | {"eps_clip": 0.2, "eps_clip_high": 0.28, "agg": "token-mean"}
    loss, stats = fn(*_ppo_inputs(), **knobs)
    assert loss.item() == pytest.approx(2 * 0.03)  # the hand-worked PPO example, doubled
    assert stats == {"custom/doubled": 1.0}
    # no ":fn": the documented default name, custom_loss
    loss, _ = load_custom_loss(str(plugin_file))(*_ppo_inputs())
    assert loss.item() == 0.0


def test_custom_loss_from_module_path_and_builtin_satisfies_contract():
    fn = load_custom_loss("clawloop.losses.ppo:ppo_clip_loss")
    loss, _ = fn(*_ppo_inputs(), eps_clip=0.2, eps_clip_high=0.28, dual_clip=None, agg="token-mean",
                 denominator=None, is_weights=None)
    assert loss.item() == pytest.approx(0.03)
    assert load_callable("clawloop.losses:aggregate") is aggregate


@pytest.mark.parametrize(
    "name, match",
    [
        ("too_few", r"too_few\(logprobs, advantages\) does not match the expected signature "
                    r"fn\(logprobs, old_logprobs, advantages, mask, \*, eps_clip"),
        ("no_kwargs", r"no_kwargs\(logprobs, old_logprobs, advantages, mask\) does not match"),
        ("NOT_A_FUNCTION", "is a int, not a function"),
        ("missing_fn", "has no attribute 'missing_fn'; callables defined there: .*my_loss"),
    ],
)
def test_custom_loss_signature_errors(plugin_file, name, match):
    with pytest.raises(PluginError, match=match):
        load_custom_loss(f"{plugin_file}:{name}")


def test_custom_loss_return_value_is_checked(plugin_file):
    with pytest.raises(PluginError, match="returned list"):
        load_custom_loss(f"{plugin_file}:returns_list")(*_ppo_inputs())
    with pytest.raises(PluginError, match="scalar tensor"):
        load_custom_loss(f"{plugin_file}:returns_vector")(*_ppo_inputs())


def test_load_callable_errors(tmp_path):
    with pytest.raises(PluginError, match="no such file"):
        load_callable(f"{tmp_path}/nope.py:fn")
    with pytest.raises(PluginError, match="cannot import module 'clawloop.no_such_module'"):
        load_callable("clawloop.no_such_module:fn")
    with pytest.raises(PluginError, match="names no function"):
        load_callable("clawloop.losses")
    with pytest.raises(PluginError, match="not a function name"):
        load_callable("clawloop.losses:not-a-name")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(PluginError, match="importing .* failed: RuntimeError: boom at import"):
        load_callable(f"{broken}:fn")


def test_check_signature_message_shows_expected_and_found():
    def reward(turn, extra):
        return 0.0

    with pytest.raises(PluginError, match=r"custom reward: .*reward\(turn, extra\) does not match "
                                          r"the expected signature fn\(turn\)"):
        check_signature(reward, ["turn"], "custom reward")
    check_signature(lambda turn, extra=None: 0.0, ["turn"], "custom reward")


def test_step_denominator_every_mode():
    """The step-wide denominator of micro-batches; fixed-denominator is rows x a constant, no length in it."""
    from clawloop.losses import step_denominator

    a = torch.tensor([[1, 1, 0], [0, 0, 0]])  # 2 valid tokens, 1 non-empty row, 2 rows
    b = torch.tensor([[1, 1, 1, 1]])  # 4 tokens, 1 row
    assert step_denominator([a, b], "token-mean") == 6
    assert step_denominator([a, b], "seq-mean-token-mean") == 2 == step_denominator([a, b], "seq-mean-token-sum")
    assert step_denominator([a, b], "fixed-denominator", tokens_per_sample=10) == 30
    with pytest.raises(ValueError, match="tokens_per_sample"):
        step_denominator([a], "fixed-denominator")
