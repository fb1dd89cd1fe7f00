"""Learning that does no harm (issue #27): the default objective teaches the form a user asks for
without pushing down what the model already gets right.

The situation the persona evaluation trains on, on the shipped tiny model: most answers have the right
result in the wrong form ("The answer is 19." to a student who wants "19"), scored -1 with the hint
"Answer with just the number."; the rare bare answer is scored +1. With the old defaults every method
pushed down the right digits (bench/RESULTS.md "Why the loop made the model worse"); these tests fail
on them. Pure-function tests of the two mechanisms (the mean baseline, the OPD divergence cut) are
worked by hand.
"""

from __future__ import annotations

import pytest
import torch

from clawloop.losses import (
    anchor_kl_loss,
    anchor_positions,
    centre_rewards,
    combined_advantages,
    nucleus_mass_loss,
    running_baseline,
    teacher_nucleus,
    until_divergence,
)
from conftest import make_cfg

FIXED_EPS = {"train__adam_eps_rel": "0"}
"""AdamW's fixed eps 1e-8: every weight steps ~lr whatever its gradient (the default before `--adam-eps-rel`)."""
OLD = {"train__baseline": "none", "train__negative_weight": "1", "train__opd_credit": "all",
       "train__opd_target": "advantage", "train__anchor_coef": "0", "train__adam_eps_rel": "0"}


# ---------------------------------------------------------------- pure functions, by hand


def test_running_baseline_is_the_leave_one_out_mean_by_hand():
    r = torch.tensor([1.0, -1.0, -1.0, -1.0])
    # each sample: the mean of the other three and the history [-1, -1]
    got = running_baseline(r, [-1.0, -1.0])
    assert got.tolist() == pytest.approx([-1.0, (1 - 1 - 1 - 1 - 1) / 5, -0.6, -0.6])
    assert running_baseline(torch.tensor([0.3])).tolist() == [0.0]  # alone, no history: raw reward kept
    assert running_baseline(torch.tensor([0.3]), [1.0]).tolist() == pytest.approx([1.0])
    with pytest.raises(ValueError):
        running_baseline(torch.tensor([float("nan")]))


def test_centre_rewards_baseline_groups_and_negative_weight_by_hand():
    """What `Trainer.rl_scores` runs. Ungrouped rewards (1, -1, -1), no history: leave-one-out baselines
    -1, 0, 0 -> 2, -1, -1; negative weight 0.5 -> 2, -0.5, -0.5. The group g (0.5, -0.5) is centred on its
    mean 0 and keeps its sign: the negative weight is for live turns only."""
    r = torch.tensor([1.0, -1.0, -1.0, 0.5, -0.5])
    groups = [None, None, None, "g", "g"]
    got, stats = centre_rewards(r, groups, negative_weight=0.5)
    assert got.tolist() == pytest.approx([2.0, -0.5, -0.5, 0.5, -0.5])
    assert stats["train/baseline"] == pytest.approx(-1 / 3) and stats["train/score_mean"] == pytest.approx(-0.2)
    assert stats["train/groups"] == 1.0
    # the caller already recorded this batch in the window [1, -1, -1, 1]: each baseline is the mean of the
    # window without the reward itself, (0 - x) / 3 -> 1 + 1/3, -1 - 1/3 (x 0.5), no group stats without groups
    got, stats = centre_rewards(r[:3], groups[:3], history=[1.0, -1.0, -1.0, 1.0], history_has_batch=True,
                                negative_weight=0.5)
    assert got.tolist() == pytest.approx([4 / 3, -2 / 3, -2 / 3]) and "train/groups" not in stats
    # baseline none, negative weight 1: the raw rewards
    got, _ = centre_rewards(r[:3], groups[:3], baseline="none")
    assert got.tolist() == pytest.approx([1.0, -1.0, -1.0])


def test_anchor_positions_by_hand():
    """Row 0 has no score (NaN) and no advantages: every valid position but its divergence point (the first
    disagreement, position 1). Row 1 (score 1) and row 2 (its own advantages) have an RL term: none.
    Row 3 scored 0 carries no RL signal: all its valid positions (the teacher never disagrees)."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    scores = torch.tensor([float("nan"), 1.0, float("nan"), 0.0])
    has_pre = torch.tensor([False, False, True, False])
    agrees = torch.tensor([[True, False, False], [True, True, False], [False, True, True], [True, True, False]])
    got = anchor_positions(mask, scores, has_pre, agrees)
    assert got.tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0], [1, 1, 0]]
    assert anchor_positions(mask, scores, has_pre).tolist()[0] == [1, 1, 1]  # no teacher: no divergence point


def test_opd_divergence_cut_by_hand():
    """Tokens: t0 agreed (teacher-old +0.5 kept), t1 agreed but negative (-0.4 spared to 0), t2 the first
    disagreement (-3 kept: the blame lands there), t3 agreed after it (0), t4 disagreed after it (0)."""
    old = torch.tensor([[-1.0, -0.5, -1.0, -0.2, -2.0]])
    teacher = torch.tensor([[-0.5, -0.9, -4.0, -1.2, -5.0]])
    agrees = torch.tensor([[True, True, False, True, False]])
    mask = torch.ones(1, 5)
    adv, stats = combined_advantages(torch.tensor([float("nan")]), teacher, old, mask, w_rl=0.0, w_opd=1.0,
                                     teacher_agrees=agrees)
    assert adv.tolist()[0] == pytest.approx([0.5, 0.0, -3.0, 0.0, 0.0])
    assert stats["train/opd_after_divergence_frac"] == pytest.approx(2 / 5)
    every, _ = combined_advantages(torch.tensor([float("nan")]), teacher, old, mask, w_rl=0.0, w_opd=1.0)
    assert every.tolist()[0] == pytest.approx([0.5, -0.4, -3.0, -1.0, -3.0])  # OPD as published
    # the RL term is added on every token, cut or not
    both, _ = combined_advantages(torch.tensor([1.0]), teacher, old, mask, w_rl=1.0, w_opd=1.0,
                                  teacher_agrees=agrees)
    assert both.tolist()[0] == pytest.approx([1.5, 1.0, -2.0, 1.0, 1.0])


def test_teacher_trust_by_hand():
    """One row, vocabulary (a, b, c), sampled a, b, c, a. Position 0: the teacher agrees (top-1 a) and is surer
    (log 0.9 > the student's top log 0.5): counts. Position 1: it would write c, but its preference c over b
    (log 0.4 - log 0.3) is weaker than the student's b over c (log 0.8 - log 0.1): an unsure teacher, no
    divergence. Position 2: it would write a, preferring it over c by log(0.9 / 0.01), more than the student's
    c over a, log(0.5 / 0.3): the divergence point. Position 3: agrees but less sure (0.4 < 0.6): not taught."""
    from clawloop.losses import teacher_trust, trusted_agreement

    student = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.3, 0.2, 0.5], [0.6, 0.2, 0.2]]]).log()  # (1, 4, 3)
    teacher = torch.tensor([[[0.9, 0.05, 0.05], [0.3, 0.3, 0.4], [0.9, 0.09, 0.01], [0.4, 0.3, 0.3]]]).log()
    y = torch.tensor([[0, 1, 2, 0]])
    t_top = teacher.argmax(-1)  # (1, 4): a, c, a, a
    agrees = t_top == y
    lp = student.gather(-1, y[..., None])[..., 0]
    t_lp = teacher.gather(-1, y[..., None])[..., 0]
    has = torch.tensor([True])
    trusted = teacher_trust(agrees, t_lp, t_top, teacher.max(-1).values, lp, student, has)
    assert trusted.tolist() == [[True, False, True, False]]
    eff = trusted_agreement(agrees, trusted, has)
    assert eff.tolist() == [[True, True, False, True]]
    mask = torch.ones(1, 4)
    assert (until_divergence(eff, mask) & trusted).tolist() == [[True, False, True, False]]
    # a row without a teacher is never trusted and keeps its own agreement
    assert not teacher_trust(agrees, t_lp, t_top, teacher.max(-1).values, lp, student, torch.tensor([False])).any()


def test_nucleus_mass_loss_by_hand():
    """Teacher top-3 probs 0.6, 0.25, 0.15 with top_p 0.8: the nucleus is the first two (0.6 < 0.8, then
    0.85 >= 0.8 stops it). Student probs over a 4-token vocabulary [0.1, 0.2, 0.3, 0.4] with the teacher's
    ids [2, 0, 1]: mass in the nucleus = p(2) + p(0) = 0.4, loss -log 0.4. The gradient moves mass into
    the nucleus and keeps the ratio p(2) / p(0) = 3 inside it."""
    t_lp = torch.tensor([[[0.6, 0.25, 0.15]]]).log()
    assert teacher_nucleus(t_lp, 0.8).tolist() == [[[True, True, False]]]
    assert teacher_nucleus(t_lp, 0.5).tolist() == [[[True, False, False]]]  # the top-1 always
    logits = torch.tensor([[[0.1, 0.2, 0.3, 0.4]]]).log().requires_grad_(True)
    ids = torch.tensor([[[2, 0, 1]]])
    loss, stats = nucleus_mass_loss(logits, ids, t_lp, torch.ones(1, 1), top_p=0.8)
    assert float(loss) == pytest.approx(-torch.tensor(0.4).log().item())
    assert stats["train/nucleus_student_mass"] == pytest.approx(0.4) and stats["train/nucleus_size"] == 2
    loss.backward()
    # d(-log M)/d logit_v = p_v - p_v * 1[v in N] / M: inside -> p_v (1 - 1/M), outside -> p_v
    want = [0.1 * (1 - 1 / 0.4), 0.2, 0.3 * (1 - 1 / 0.4), 0.4]
    assert logits.grad[0, 0].tolist() == pytest.approx(want, abs=1e-6)
    # the gradient depends on the nucleus as a set, not on the teacher's order inside it: a teacher that
    # prefers id 0 over id 2 gives the same gradient, and the student's favourite (id 2) gains most
    other = logits.detach().clone().requires_grad_(True)
    loss2, _ = nucleus_mass_loss(other, torch.tensor([[[0, 2, 1]]]), t_lp, torch.ones(1, 1), top_p=0.8)
    loss2.backward()
    assert other.grad[0, 0].tolist() == pytest.approx(logits.grad[0, 0].tolist())
    stepped = torch.softmax(logits.detach() - 0.5 * logits.grad, -1)[0, 0]
    assert float(stepped[2] / stepped[0]) > 3.0 and float(stepped[[0, 2]].sum()) > 0.4
    # masked positions contribute nothing
    loss0, _ = nucleus_mass_loss(logits.detach(), ids, t_lp, torch.zeros(1, 1))
    assert float(loss0) == 0.0


def test_anchor_kl_by_hand():
    """Policy [0.5, 0.5] against reference [0.25, 0.75] at the one anchored position: KL = 0.5 ln 2 +
    0.5 ln(2/3); a masked position (policy far from the reference) adds nothing; coef scales it; the
    gradient pulls the policy towards the reference."""
    import math

    logits = torch.tensor([[[0.5, 0.5], [0.99, 0.01]]]).log().requires_grad_(True)  # (1, 2, 2)
    ref = torch.tensor([[[0.25, 0.75], [0.01, 0.99]]]).log()
    mask = torch.tensor([[1.0, 0.0]])
    want = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    loss, stats = anchor_kl_loss(logits, ref, mask, coef=2.0)
    assert float(loss) == pytest.approx(2 * want) and stats["train/anchor_kl"] == pytest.approx(want)
    loss.backward()
    assert float(logits.grad[0, 0, 1]) < 0 < float(logits.grad[0, 0, 0])  # descent raises token 1 (ref 0.75)
    assert logits.grad[0, 1].abs().sum() == 0


def test_negative_weight_and_baseline_in_the_trainers_scores(random_model_dir, tmp_path):
    from clawloop.trainer import Trainer
    from test_train_objectives import samples_for

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary")
    tr = Trainer(cfg, str(random_model_dir))
    assert (cfg.train.baseline, cfg.train.negative_weight, cfg.train.opd_credit, cfg.train.opd_target) == \
        ("mean", 0.0, "divergence", "topk")
    s = samples_for(tr.tokenizer, n=4, rewards=[1.0, -1.0, -1.0, -1.0])
    scores, stats = tr.rl_scores(s)
    # baselines -1, -1/3, -1/3, -1/3 -> advantages 2, -2/3 x 0 (negative weight 0)
    assert scores == pytest.approx([2.0, 0.0, 0.0, 0.0]) and stats["train/baseline"] == pytest.approx(-0.5)
    assert list(tr.reward_history) == [1.0, -1.0, -1.0, -1.0]
    old = Trainer(make_cfg(random_model_dir, tmp_path, train__method="binary", **OLD), str(random_model_dir))
    assert old.rl_scores(s)[0] == pytest.approx([1.0, -1.0, -1.0, -1.0])


# ---------------------------------------------------------------- the tiny model keeps its arithmetic


def _sample(tok, question, answer_text, score, hint, eos=True):
    from clawloop.gateway.render import render_prompt
    from clawloop.records import Sample

    msgs = [{"role": "user", "content": question}]
    prompt = render_prompt(tok, msgs, None)
    resp = tok.encode(answer_text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    n = len(prompt)
    return Sample(tokens=prompt + resp, loss_mask=[0] * n + [1] * len(resp), rollout_logprobs=[0.0] * (n + len(resp)),
                  prompt_len=n, reward=score, hint=hint, messages=msgs)


def _bare_answer_logprob(tr, samples):
    rows = [(s.tokens[:s.prompt_len], s.tokens[s.prompt_len:]) for s in samples]
    return sum(float(r["lp"].sum()) for r in tr.score_responses(tr.model, rows)) / len(samples)


@pytest.fixture(scope="module")
def tiny_model():
    from clawloop.tinymodel.build import default_model_dir

    path = default_model_dir()
    if not (path / "model.safetensors").exists():
        pytest.skip(f"the tiny model is not built at {path}")
    return path


def test_default_binary_learns_the_form_and_keeps_the_arithmetic(tiny_model, tmp_path):
    """4 steps at the tiny model's default rate (`auto_lr`) on 15 right-result/wrong-form answers scored -1 and 1 bare
    answer scored +1: with the defaults (mean baseline, negative weight 0) the bare right answers of OTHER
    held-out questions keep their probability and the accepted answer gains; with the old raw score the
    same steps cost those answers most of a nat (0.9 on the shipped model; the test fails on the old code). The OPD and combine
    defaults are measured where this microscope cannot judge them, in the persona evaluation
    (bench/RESULTS.md "Why the loop made the model worse")."""
    from clawloop.tinymodel.corpus import heldout_questions, render_answer, style_instruction
    from clawloop.trainer import Trainer

    qs = [q for q in heldout_questions(40, seed=3) if q["skill"] in ("add", "sub")][:24]
    hint = style_instruction("bare")

    def run(flags):
        cfg = make_cfg(tiny_model, tmp_path, train__method="binary", train__rollout_batch_size="16", **flags)
        tr = Trainer(cfg, str(tiny_model), device="cpu")
        tok = tr.tokenizer
        batch = [_sample(tok, q["question"], render_answer(q["answer"], "sentence"), -1.0, hint) for q in qs[:15]]
        batch.append(_sample(tok, qs[15]["question"], qs[15]["answer"], 1.0, None))
        probes = [_sample(tok, q["question"], q["answer"], 0.0, None) for q in qs[16:]]
        before, good = _bare_answer_logprob(tr, probes), _bare_answer_logprob(tr, batch[15:])
        for _ in range(4):
            tr.step(list(batch))
        return _bare_answer_logprob(tr, probes) - before, _bare_answer_logprob(tr, batch[15:]) - good

    kept, gained = run({})
    assert kept > -0.2, f"the bare right answers of other questions lost {-kept:.2f} nats"
    assert gained > 0.3, f"the accepted answer gained only {gained:.2f} nats"
    lost, _ = run(OLD)
    assert lost < -0.5, f"the old settings were expected to damage the arithmetic, got {lost:.2f}"


@pytest.mark.parametrize("anchor_rl", [True, False])
def test_the_trainer_anchors_what_no_signal_names(random_model_dir, tmp_path, monkeypatch, anchor_rl):
    """combine: a corrected answer (score -1, hint; no RL term under negative weight 0) is anchored on every
    response position but its divergence point; an accepted answer (an RL term) on every response position
    with `--anchor-rl` (a KL-regularised policy gradient), not at all without it (the default)."""
    import clawloop.trainer.core as core
    from clawloop.trainer import Trainer
    from test_train_objectives import samples_for

    cfg = make_cfg(random_model_dir, tmp_path, train__method="combine", train__anchor_rl=str(anchor_rl).lower(),
                   train__opd_trust="all", train__num_steps_per_rollout="1")  # both rows in one update
    tr = Trainer(cfg, str(random_model_dir))
    seen = {}
    real = core.anchor_kl_loss

    def spy(logits, ref_logits, mask, **kw):
        seen["mask"] = mask.detach().clone()
        return real(logits, ref_logits, mask, **kw)

    monkeypatch.setattr(core, "anchor_kl_loss", spy)
    samples = samples_for(tr.tokenizer, n=2, rewards=[-1.0, 1.0], hint="Answer with just the number.")
    samples[1] = samples[1].__class__(**{**samples[1].__dict__, "hint": None})
    tr.step(samples)
    b = tr._tensorize(samples, tr.teacher_signals(samples, [s.hint for s in samples]), [0.0, 2.0], ref=False)
    first = until_divergence(b.teacher_agrees, b.mask) & ~b.teacher_agrees.bool()  # (B, L-1)
    order = sorted(range(2), key=lambda i: len(samples[i].tokens))  # micro-batch rows are sorted by length
    m = seen["mask"]
    corrected, accepted = order.index(0), order.index(1)
    if anchor_rl:
        n_resp = len(samples[1].tokens) - samples[1].prompt_len
        assert float(m[accepted].sum()) == n_resp
    else:
        assert float(m[accepted].sum()) == 0
    want = b.mask[0].bool() & ~first[0]
    assert m[corrected].bool()[:want.shape[0]].tolist() == want.tolist() and int(want.sum()) > 0


def test_anchor_weights_scale_each_position_by_hand():
    """`weights` scale each position's KL; the denominator stays the masked positions' count."""
    logits = torch.tensor([[[2.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [1.0, 1.0]]])  # (B=2, T=2, V=2)
    ref = torch.zeros_like(logits)  # a uniform reference
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])

    def kl(row):
        p = torch.softmax(row, -1)
        return float((p * (p.log() - torch.log(torch.tensor(0.5)))).sum())

    plain, _ = anchor_kl_loss(logits, ref, mask, coef=2.0)
    weighted, _ = anchor_kl_loss(logits, ref, mask, coef=2.0, weights=torch.tensor([[0.25, 0.25], [1.0, 1.0]]))
    k00, k01, k10 = kl(logits[0, 0]), kl(logits[0, 1]), kl(logits[1, 0])
    assert float(plain) == pytest.approx(2.0 * (k00 + k01 + k10) / 3)
    assert float(weighted) == pytest.approx(2.0 * (0.25 * (k00 + k01) + k10) / 3)
    with pytest.raises(ValueError, match="weights"):
        anchor_kl_loss(logits, ref, mask, coef=1.0, weights=torch.ones(2, 3))


def test_anchor_rl_coef_weights_only_the_rl_rows(random_model_dir, tmp_path, monkeypatch):
    """--anchor-rl-coef: the accepted answer (an RL term) is held at its own coefficient, the corrected one
    (no RL term) at --anchor-coef, in the same step."""
    import clawloop.trainer.core as core
    from clawloop.trainer import Trainer
    from test_train_objectives import samples_for

    cfg = make_cfg(random_model_dir, tmp_path, train__method="combine", train__anchor_rl="true",
                   train__anchor_rl_coef="0.25", train__anchor_coef="2.0", train__num_steps_per_rollout="1")
    tr = Trainer(cfg, str(random_model_dir))
    seen = {}
    real = core.anchor_kl_loss

    def spy(logits, ref_logits, mask, **kw):
        seen.update(kw, mask=mask.detach().clone())
        return real(logits, ref_logits, mask, **kw)

    monkeypatch.setattr(core, "anchor_kl_loss", spy)
    samples = samples_for(tr.tokenizer, n=2, rewards=[-1.0, 1.0], hint="Answer with just the number.")
    samples[1] = samples[1].__class__(**{**samples[1].__dict__, "hint": None})
    tr.step(samples)
    order = sorted(range(2), key=lambda i: len(samples[i].tokens))  # micro-batch rows are sorted by length
    corrected, accepted = order.index(0), order.index(1)
    w, m = seen["weights"], seen["mask"].bool()
    assert seen["coef"] == 2.0
    assert w[accepted][m[accepted]].tolist() == pytest.approx([0.125] * int(m[accepted].sum()))  # 0.25 via coef 2
    assert set(w[corrected][m[corrected]].tolist()) == {1.0} and int(m[corrected].sum()) > 0


def test_binary_has_the_anchor_only_with_anchor_rl(random_model_dir, tmp_path):
    from clawloop.trainer import Trainer

    assert not Trainer(make_cfg(random_model_dir, tmp_path, train__method="binary"), str(random_model_dir)).anchors
    assert Trainer(make_cfg(random_model_dir, tmp_path, train__method="binary", train__anchor_rl="true"),
                   str(random_model_dir)).anchors


def test_opd_trusts_the_teacher_only_where_it_is_surer(fragile_model, tmp_path):
    """The teacher persona's case: right results in the wrong form ("The answer is 61.") scored -1 with the
    hint "End your answer with an exclamation mark.". The hint makes the tiny teacher unsure of the digits
    (its logprob of the right ones -1.1 against the student's -0.1, its top-1 digit right about half the time),
    so with `--opd-trust all` the divergence point often lands on a digit and the "!" is not taught there.
    With the default (`surer`) 4 OPD steps teach the exclaimed answer of OTHER held-out questions more
    (+0.51 nats against +0.36 with `all`, the old objective: the test fails on it) and both keep the
    right digits (the anchor holds them)."""
    tiny_model = fragile_model  # the contrast is measured where the damage shows (conftest.fragile_model)
    from clawloop.tinymodel.corpus import heldout_questions, render_answer, style_instruction
    from clawloop.trainer import Trainer

    qs = [q for q in heldout_questions(60, seed=4) if q["skill"] in ("add", "sub")][:32]
    hint = style_instruction("exclaim")

    def run(trust):
        # AdamW's fixed eps, as measured then: with the relative eps (the default since) neither setting moves
        # the digits and both teach the "!" alike (+0.26 / +0.25): the trust's effect is read where it is visible
        cfg = make_cfg(tiny_model, tmp_path, train__method="opd", train__lr="2e-4", train__rollout_batch_size="16",
                       train__opd_trust=trust, train__adam_eps_rel="0")
        tr = Trainer(cfg, str(tiny_model), device="cpu")
        tok = tr.tokenizer
        batch = [_sample(tok, q["question"], render_answer(q["answer"], "sentence"), -1.0, hint) for q in qs[:16]]
        probes = [_sample(tok, q["question"], render_answer(q["answer"], "exclaim"), 0.0, None) for q in qs[16:]]


        def digits():  # the right digits after "The answer is ", per question
            rows = [(p.tokens[:p.prompt_len], p.tokens[p.prompt_len:]) for p in probes]
            out = 0.0
            for (_, resp), r in zip(rows, tr.score_responses(tr.model, rows)):
                out += sum(float(lp) for t, lp in zip(resp, r["lp"]) if tok.decode([t]).strip().isdigit())
            return out / len(rows)

        before, d_before = _bare_answer_logprob(tr, probes), digits()
        for _ in range(4):
            tr.step(list(batch))
        return _bare_answer_logprob(tr, probes) - before, digits() - d_before

    gained, kept = run("surer")
    gained_all, lost = run("all")
    print(f"surer: exclaim answer {gained:+.2f}, digits {kept:+.2f}; all: {gained_all:+.2f}, {lost:+.2f}")
    assert kept > -0.2 and lost > -0.2, f"the right digits of other questions lost {-kept:.2f} / {-lost:.2f} nats"
    # the "!" is reached: no digit the unsure teacher would write otherwise stands in for the divergence point
    assert gained > gained_all + 0.1, f"the exclaimed answers gained {gained:.2f} nats, {gained_all:.2f} with all"


def _teacher_persona_steps(tiny_model, tmp_path, flags):
    """6 combine steps on the teacher persona's situation (half the answers "The answer is N!" accepted, half
    "The answer is N." corrected with the hint): the change of the right digits' and of the "!"'s logprob
    on other held-out sums, and the (lr, updates a batch) used."""
    from clawloop.tinymodel.corpus import heldout_questions, render_answer
    from clawloop.trainer import Trainer

    qs = [q for q in heldout_questions(200, seed=3) if q["skill"] in ("add", "sub")]
    train, probe = qs[:64], qs[64:96]

    cfg = make_cfg(tiny_model, tmp_path, train__method="combine", train__rollout_batch_size="16", **flags)
    tr = Trainer(cfg, str(tiny_model), device="cpu")
    tok = tr.tokenizer
    probes = [(s.tokens[:s.prompt_len], s.tokens[s.prompt_len:]) for s in
              (_sample(tok, q["question"], render_answer(q["answer"], "exclaim"), 0.0, None, eos=False)
               for q in probe)]
    digit = [[tok.decode([t]).strip().isdigit() for t in r] for _, r in probes]

    def measure():
        scored = tr.score_responses(tr.model, probes)
        d = [float(lp) for s, m in zip(scored, digit) for lp, is_d in zip(s["lp"], m) if is_d]
        return sum(d) / len(d), sum(float(s["lp"][-1]) for s in scored) / len(scored)

    d0, b0 = measure()
    for k in range(6):
        tr.step([_sample(tok, q["question"], render_answer(q["answer"], "exclaim"), 1.0, None) if j % 2 == 0
                 else _sample(tok, q["question"], render_answer(q["answer"], "sentence"), -1.0,
                              "End your answer with an exclamation mark.")
                 for j, q in enumerate(train[16 * (k % 4):16 * (k % 4) + 16])])
    d, b = measure()
    return d - d0, b - b0, (tr.lr, tr.tc.num_steps_per_rollout)


def test_two_half_rate_updates_a_batch_keep_the_arithmetic(fragile_model, tmp_path):
    """What `bench/anchor_replay.py` found (bench/RESULTS.md "Why the loop made the model worse" 7a): on the
    teacher persona's situation (half the answers "The answer is N!" accepted, half "The answer is N." corrected
    with the hint), 6 steps of combine, two updates of 2.5e-4 a batch raise the "!" of other held-out sums as
    much as one update of 5e-4 and cost their right digits a quarter of it (the 2026-11-27 build: -0.16 against
    -0.68 nats; the build shipped since loses 0.15-0.16 either way). Not the default: in the persona evaluation end to end the student lost more right results
    with it (7c). Measured with AdamW's fixed eps, as then (the relative eps keeps the digits either way:
    the next test)."""
    tiny_model = fragile_model  # the contrast is measured where the damage shows (conftest.fragile_model)
    half = {"train__lr": "2.5e-4", "train__num_steps_per_rollout": "2", **FIXED_EPS}
    digits, bang, schedule = _teacher_persona_steps(tiny_model, tmp_path, half)
    old_digits, old_bang, old_schedule = _teacher_persona_steps(tiny_model, tmp_path, FIXED_EPS)
    assert schedule == (2.5e-4, 2) and old_schedule == (5e-4, 1)  # the second: the default
    assert bang > 0.4 and bang > 0.9 * old_bang, (bang, old_bang)
    assert digits > -0.3, f"the right digits of other sums lost {-digits:.2f} nats"
    assert old_digits < -0.5 and digits > 0.5 * old_digits, (digits, old_digits)


def test_the_relative_eps_teaches_the_form_and_keeps_the_digits(fragile_model, tmp_path):
    """RESULTS "Why the loop made the model worse" 10: AdamW with a fixed eps of 1e-8 moves every weight ~lr
    a step however small its gradient, and on a batch of 16 answers most weights' gradients are noise (the
    median 40x under the RMS): 6 combine steps of the teacher persona's situation cost the right digits of
    other held-out sums ~0.7 nats. With the default `--adam-eps-rel 1` (eps = the gradient's RMS) the same
    steps keep the digits and still teach the "!" (fails on the code before it, where the default was the
    second run)."""
    tiny_model = fragile_model  # the contrast is measured where the damage shows (conftest.fragile_model)
    digits, bang, _ = _teacher_persona_steps(tiny_model, tmp_path, {})
    fixed_digits, fixed_bang, _ = _teacher_persona_steps(tiny_model, tmp_path, FIXED_EPS)
    print(f"relative eps: digits {digits:+.2f}, '!' {bang:+.2f}; fixed eps: {fixed_digits:+.2f}, {fixed_bang:+.2f}")
    assert fixed_digits < -0.5, f"the fixed eps was expected to cost the digits, got {fixed_digits:.2f}"
    assert digits > -0.15, f"the right digits of other sums lost {-digits:.2f} nats with the relative eps"
    assert bang > 0.3, f"the '!' of other sums gained only {bang:.2f} nats"
