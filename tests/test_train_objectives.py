"""Trainer objectives and knobs on the real tiny model: every --loss-agg value, metrics that do not
depend on how a step is cut into micro-batches, continuous rewards, the PPO clip acting with
--num-steps-per-rollout, top-K distillation, hint selection, a teacher that is another model, the
teacher prompt of a continued assistant message, the teacher's token budget, LoRA without a copy
of the base model, and the train section's config errors."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from clawloop.config import ConfigError, load_config
from clawloop.records import Sample
from conftest import make_cfg

QUESTIONS = ["What is 12+7?", "What is 3+4?", "What is 25+17?", "Name a colour.", "What is 9+9?", "Say hi."]
ANSWERS = ["19", "The answer is 7.", "42", "blue", "It is 18.", "hello there, friend"]


def trainer_for(model_dir, tmp_path, **flags):
    from clawloop.trainer import Trainer

    # the raw-score objective these hand-worked numbers are written for (the default baseline, negative weight
    # and OPD target are tested in tests/test_learning_safety.py)
    raw = {"train__baseline": "none", "train__negative_weight": "1", "train__opd_target": "advantage",
           "train__opd_credit": "all", "train__anchor_coef": "0"}
    cfg = make_cfg(model_dir, tmp_path, **{"train__method": "binary", "train__lr": "1e-3", **raw, **flags})
    return Trainer(cfg, str(model_dir))


def samples_for(tok, n=6, rewards=None, hint=None, engine_lp=True, group=None):
    """Samples with real rendered prompts, different lengths, distinct rewards and engine logprobs."""
    from clawloop.gateway.render import render_prompt

    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        prompt = render_prompt(tok, msgs, None)
        resp = tok.encode(ANSWERS[i % len(ANSWERS)], add_special_tokens=False) + [tok.eos_token_id]
        lps = [-1.0 - 0.3 * ((i + k) % 5) for k in range(len(resp))] if engine_lp else [0.0] * len(resp)
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + lps, prompt_len=len(prompt),
                          reward=(rewards[i] if rewards is not None else [1.0, -1.0, 0.5][i % 3]),
                          hint=hint, messages=msgs, group_id=None if group is None else group[i]))
    return out


def grads_of_one_step(trainer, samples):
    """The gradients of one step (captured before the optimizer update) and its stats."""
    captured = {}
    update = trainer._optimizer_step

    def capture():
        captured["g"] = [p.grad.detach().clone() for p in trainer.params]
        return update()

    trainer._optimizer_step = capture
    stats = trainer.step(samples)
    return captured["g"], stats


TIMING = {"train/step_s", "train/tokens_per_s", "train/micro_batches"}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "fixed-denominator"])
def test_every_loss_agg_trains_and_micro_batching_changes_nothing(random_model_dir, tmp_path, agg):
    """Each --loss-agg value runs a step; cut into micro-batches (a 60-token budget) the step has the same
    gradients and the same metrics as one big batch: losses are shares that add up, maxima are maxima."""
    flags = {"train__loss_agg": agg, "train__fixed_denominator_tokens": "16", "train__tis_cap": "1.5"}
    big = trainer_for(random_model_dir, tmp_path, **flags)
    small = trainer_for(random_model_dir, tmp_path, train__micro_batch_tokens="60", **flags)
    samples = samples_for(big.tokenizer)
    g_big, s_big = grads_of_one_step(big, samples)
    g_small, s_small = grads_of_one_step(small, samples)
    assert s_big["train/micro_batches"] == 1 and s_small["train/micro_batches"] >= 3
    for a, b in zip(g_big, g_small):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert math.isfinite(s_big["train/pg_loss"]) and s_big["train/pg_loss"] != 0
    assert set(s_big) - TIMING == set(s_small) - TIMING
    for k in set(s_big) - TIMING:
        assert s_small[k] == pytest.approx(s_big[k], rel=1e-4, abs=1e-6), k


def test_fixed_denominator_loss_by_hand(random_model_dir, tmp_path):
    """--loss-agg fixed-denominator: sum over tokens of -A * w / (samples x fixed_denominator_tokens); with
    no engine logprobs w = 1 and the ratio is 1, so the loss is -(sum of score x tokens) / (n x F)."""
    tr = trainer_for(random_model_dir, tmp_path, train__loss_agg="fixed-denominator",
                     train__fixed_denominator_tokens="10", train__micro_batch_tokens="60")
    samples = samples_for(tr.tokenizer, rewards=[1.0, -0.5, 0.25, 2.0, -1.0, 0.75], engine_lp=False)
    st = tr.step(samples)
    want = -sum(s.reward * (len(s.tokens) - s.prompt_len) for s in samples) / (len(samples) * 10)
    assert st["train/micro_batches"] >= 3
    assert st["train/pg_loss"] == pytest.approx(want, rel=1e-5)
    token_mean = trainer_for(random_model_dir, tmp_path, train__micro_batch_tokens="60").step(samples)
    n_tok = sum(len(s.tokens) - s.prompt_len for s in samples)
    assert token_mean["train/pg_loss"] == pytest.approx(want * len(samples) * 10 / n_tok, rel=1e-5)


def test_continuous_rewards_reach_the_advantages_and_groups_are_centred(random_model_dir, tmp_path):
    """0.3 trains as 0.3, never as its sign; samples sharing a group id are centred on their group's mean
    (GRPO) with the same rule the rollout buffer uses; ungrouped ones keep their reward."""
    from clawloop.losses import group_normalize

    tr = trainer_for(random_model_dir, tmp_path)
    rewards = [0.3, 0.9, 0.0, 0.45, 0.3, -0.2]
    groups = ["a", "a", "a", "b", "b", None]
    samples = samples_for(tr.tokenizer, rewards=rewards, group=groups)
    scores, stats = tr.rl_scores(samples)
    want, _ = group_normalize(torch.tensor(rewards), groups)
    assert scores == pytest.approx(want.tolist()) and scores[-1] == pytest.approx(-0.2)
    assert stats["train/groups"] == 2 and stats["train/score_mean"] == pytest.approx(sum(rewards) / 6)
    # one ungrouped sample: its advantage on every token is exactly its reward
    one = samples_for(tr.tokenizer, n=1, rewards=[0.3], engine_lp=False)
    st = tr.step(one)
    assert st["train/combine_adv_mean"] == pytest.approx(0.3) and st["train/pg_loss"] == pytest.approx(-0.3)


def test_num_steps_per_rollout_makes_the_clip_act(random_model_dir, tmp_path):
    """One update: old logprobs are the forward's own, the ratio is exactly 1 and nothing is clipped.
    Four updates: old logprobs are taken before the first, the later mini-batches see the moved policy,
    and the clip acts (a large learning rate moves it past 1 + eps)."""
    flags = {"train__lr": "5e-2", "train__eps_clip": "0.05", "train__eps_clip_high": "0.05"}
    one = trainer_for(random_model_dir, tmp_path, **flags)
    samples = samples_for(one.tokenizer, n=6, rewards=[1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    st1 = one.step(samples)
    assert st1["train/updates"] == 1 and st1["train/ratio_max"] == 1.0 and st1["train/clip_frac"] == 0.0
    many = trainer_for(random_model_dir, tmp_path, train__num_steps_per_rollout="3", **flags)
    w0 = [p.detach().clone() for p in many.params]
    st3 = many.step(samples)
    assert st3["train/updates"] == 3 and st3["train/samples"] == 6 and st3["train/valid_tokens"] == st1["train/valid_tokens"]
    assert st3["train/clip_frac"] > 0 and st3["train/ratio_max"] > 1.05 and st3["train/approx_kl"] > 0
    assert many.version == 1 and many.step_count == 1
    assert any(not torch.equal(a, b) for a, b in zip(w0, many.params))


def test_entropy_is_measured_with_coef_zero_and_kl_only_with_a_coef(random_model_dir, tmp_path):
    tr = trainer_for(random_model_dir, tmp_path)
    st = tr.step(samples_for(tr.tokenizer))
    vocab = len(tr.tokenizer)
    assert 0 < st["train/entropy"] <= math.log(vocab) + 1e-4 and "train/kl" not in st
    kl = trainer_for(random_model_dir, tmp_path, train__kl_coef="0.1", train__lr="1e-2")
    kl.step(samples_for(kl.tokenizer))
    assert kl.step(samples_for(kl.tokenizer))["train/kl"] > 0


# ---------------------------------------------------------------------------- OPD teacher


def _manual_response_logprobs(model, prompt_ids, response_ids):
    """log-softmax of `model` over the response positions of prompt + response: (n, V)."""
    with torch.no_grad():
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        logits = model(input_ids=ids).logits[0].float()  # (L, V)
    a = len(prompt_ids) - 1
    return torch.log_softmax(logits[a:a + len(response_ids)], dim=-1)  # (n, V)


def _base_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def test_topk_distillation_collects_the_teacher_on_the_hinted_prompt_and_learns(random_model_dir, tmp_path):
    """--method opd --distill-topk 8: the teacher's top-8 comes from the frozen base on the hinted prompt;
    the loss is the top-K reverse KL alone (no PPO term), and it falls as the student moves."""
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer import teacher_messages

    tr = trainer_for(random_model_dir, tmp_path, train__method="opd", train__distill_topk="8", train__lr="1e-2",
                     train__opd_target="topk")
    samples = samples_for(tr.tokenizer, n=4, hint="Answer with just the number.")
    sig = tr.teacher_signals(samples, ["Answer with just the number."] * 4)
    s = samples[2]
    hinted = render_prompt(tr.tokenizer, teacher_messages(s.messages, "Answer with just the number."), None)
    want = _manual_response_logprobs(_base_model(random_model_dir), hinted, s.response_ids).topk(8, dim=-1)
    assert torch.equal(sig[2].topk_ids, want.indices)
    torch.testing.assert_close(sig[2].topk_logprobs, want.values, rtol=1e-4, atol=1e-5)
    st = tr.step(samples)
    assert "train/pg_loss" not in st and st["train/loss"] == pytest.approx(st["train/topk_loss"])
    assert st["train/topk_loss"] > 0

    # a learning canary: distilled towards a teacher that is another model, the top-K KL falls
    from clawloop.tinymodel.build import build_random_model

    other = build_random_model(tmp_path / "teacher", layers=1, hidden=32, seed=3)
    tr = trainer_for(random_model_dir, tmp_path, train__method="opd", train__distill_topk="8", train__lr="1e-2",
                     train__opd_target="topk",
                     train__teacher_model=str(other))
    kls = [tr.step(samples)["train/topk_kl"] for _ in range(8)]
    assert all(math.isfinite(k) for k in kls) and kls[-1] < 0.5 * kls[0], kls


def test_topk_inside_combine_adds_to_the_rl_term(random_model_dir, tmp_path):
    tr = trainer_for(random_model_dir, tmp_path, train__method="combine", train__distill_topk="4",
                     train__opd_target="topk")
    samples = samples_for(tr.tokenizer, n=4, hint="Answer with just the number.")
    st = tr.step(samples)
    assert st["train/combine_rl_frac"] == 1.0 and st["train/combine_opd_frac"] == 0.0  # OPD is the top-K term
    assert st["train/loss"] == pytest.approx(st["train/pg_loss"] + st["train/topk_loss"], rel=1e-5, abs=1e-7)
    assert st["train/topk_kl"] > 0


def test_opd_clip_bounds_the_teacher_minus_old_advantage(random_model_dir, tmp_path):
    hint = "Answer in capital letters, please."
    free = trainer_for(random_model_dir, tmp_path, train__method="opd")
    clipped = trainer_for(random_model_dir, tmp_path, train__method="opd", train__opd_clip="0.001")
    samples = samples_for(free.tokenizer, n=3, hint=hint)
    a = free.step(samples)
    b = clipped.step(samples)
    assert a["train/combine_opd_frac"] == 1.0
    assert abs(b["train/combine_adv_mean"]) <= 0.001 + 1e-7 < abs(a["train/combine_adv_mean"])


def test_hint_selection_longest_and_overlap(random_model_dir, tmp_path):
    """longest takes the longest candidate; overlap takes the one whose teacher puts the most mass on the
    student's top-K, computed here independently from plain forwards."""
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer import teacher_messages
    from clawloop.trainer.hints import topk_overlap

    cands = ["Answer with just the number.", "Reply in capital letters only, and nothing else at all.",
             "Be brief."]
    longest = trainer_for(random_model_dir, tmp_path, train__method="opd")
    samples = samples_for(longest.tokenizer, n=3)
    for s in samples:
        s.hint, s.hint_candidates = cands[0], cands
    hints, _ = longest.choose_hints(samples)
    assert hints == [cands[1]] * 3
    over = trainer_for(random_model_dir, tmp_path, train__method="opd", train__hint_selection="overlap",
                       train__hint_overlap_topk="5")
    hints, stats = over.choose_hints(samples)
    base = _base_model(random_model_dir)
    for s, h in zip(samples, hints):
        student_top = _manual_response_logprobs(base, s.tokens[:s.prompt_len], s.response_ids).topk(5).indices
        scores = []
        for c in cands:
            hinted = render_prompt(over.tokenizer, teacher_messages(s.messages, c), None)
            lp = _manual_response_logprobs(base, hinted, s.response_ids)
            scores.append(topk_overlap(lp.gather(-1, student_top)))
        assert h == cands[max(range(3), key=lambda i: (scores[i], len(cands[i])))], (scores, h)
    assert stats["train/hint_multi_candidate_samples"] == 3 and 0 < stats["train/hint_overlap"] <= 1
    # and the chosen hint is the one the teacher then sees
    st = over.step(samples)
    assert st["train/combine_opd_frac"] == 1.0


def test_hint_helpers_by_hand():
    from clawloop.trainer.hints import hint_candidates, longest_hint, pick_by_overlap, topk_overlap

    s = Sample(tokens=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, 0.0], prompt_len=1, hint=" b ",
               hint_candidates=["aaa", "b", "", "cc"])
    assert hint_candidates(s) == ["b", "aaa", "cc"] and longest_hint(["b", "aaa", "cc", "ddd"]) == "aaa"
    lp = torch.log(torch.tensor([[0.5, 0.25], [0.125, 0.125]]))  # masses 0.75 and 0.25: mean 0.5
    assert topk_overlap(lp) == pytest.approx(0.5) and topk_overlap(torch.zeros(0, 3)) == 0.0
    assert pick_by_overlap(["x", "yy", "z"], [0.2, 0.5, 0.5]) == 1  # a tie goes to the longer hint
    assert pick_by_overlap(["x", "yy"], [0.9, 0.5]) == 0


def test_teacher_model_is_another_model_with_the_same_vocabulary(random_model_dir, tmp_path):
    from clawloop.tinymodel.build import build_random_model

    other = build_random_model(tmp_path / "teacher", layers=1, hidden=32, seed=5)
    cfg = load_config({"model__path": str(random_model_dir), "data_dir": str(tmp_path),
                       "train__teacher_model": str(other), "train__method": "opd", "train__opd_target": "advantage"},
                      env={})
    assert cfg.train.teacher == "model"  # --teacher-model alone says it
    from clawloop.trainer import Trainer

    tr = Trainer(cfg, str(random_model_dir))
    samples = samples_for(tr.tokenizer, n=2, hint="Answer with just the number.")
    sig = tr.teacher_signals(samples, [samples[0].hint] * 2)
    prompt = tr.teacher_prompt_ids(samples[1], samples[1].hint)
    want = _manual_response_logprobs(_base_model(other), prompt, samples[1].response_ids)
    got = torch.tensor(sig[1].logprobs[samples[1].prompt_len:])
    torch.testing.assert_close(got, want.gather(-1, torch.tensor(samples[1].response_ids)[:, None]).squeeze(-1),
                               rtol=1e-4, atol=1e-5)
    assert tr.step(samples)["train/combine_opd_frac"] == 1.0

    # a teacher with another vocabulary: a config error that names the key
    from transformers import AutoTokenizer

    odd = tmp_path / "odd-teacher"
    shutil.copytree(other, odd)
    tok = AutoTokenizer.from_pretrained(str(odd))
    tok.add_tokens(["<|not-in-the-policy|>"])
    tok.save_pretrained(str(odd))
    cfg.train.teacher_model = str(odd)
    with pytest.raises(ConfigError, match=r"train\.teacher_model: .* does not share the policy's tokenizer"):
        Trainer(cfg, str(random_model_dir))


def test_teacher_prompt_keeps_a_continued_assistant_message(random_model_dir, tmp_path):
    """A turn that continued the assistant's prefilled answer (continue_final_message): the teacher's
    prompt ends inside the same assistant message, like the student's, with the hint in the user's."""
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer import teacher_messages

    tr = trainer_for(random_model_dir, tmp_path, train__method="opd")
    tok = tr.tokenizer
    msgs = [{"role": "user", "content": "What is 12+7?"}, {"role": "assistant", "content": "The answer is"}]
    prompt = render_prompt(tok, msgs, None, continue_final=True)
    resp = tok.encode(" 19.", add_special_tokens=False) + [tok.eos_token_id]
    s = Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
               rollout_logprobs=[0.0] * (len(prompt) + len(resp)), prompt_len=len(prompt), hint="Be brief.",
               messages=msgs)
    plain = samples_for(tok, n=1, hint="Be brief.")[0]
    seen = []
    hook = tr.frozen.register_forward_pre_hook(lambda m, a, kw: seen.extend(kw["input_ids"].tolist()),
                                               with_kwargs=True)
    try:
        tr.teacher_logprobs_for([s, plain])
    finally:
        hook.remove()
    want = render_prompt(tok, teacher_messages(msgs, "Be brief."), None, continue_final=True)
    tail = tok.encode("The answer is", add_special_tokens=False)
    assert want[-len(tail):] == tail == prompt[-len(tail):]
    want_plain = render_prompt(tok, teacher_messages(plain.messages, "Be brief."), None)  # the generation prompt
    rows = {tuple(r[:len(want)]) for r in seen} | {tuple(r[:len(want_plain)]) for r in seen}
    assert tuple(want) in rows and tuple(want_plain) in rows
    assert any(r[:len(want) + len(resp)] == want + resp for r in seen)


def test_teacher_forward_honours_the_token_budget(random_model_dir, tmp_path):
    tr = trainer_for(random_model_dir, tmp_path, train__method="opd", train__micro_batch_tokens="80")
    samples = samples_for(tr.tokenizer, n=6, hint="Answer with just the number.")
    shapes = []
    hook = tr.frozen.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        tr.teacher_logprobs_for(samples)
    finally:
        hook.remove()
    assert len(shapes) > 1 and sum(b for b, _ in shapes) == 6
    assert all(b * L <= 80 or b == 1 for b, L in shapes), shapes


def test_lora_keeps_no_copy_of_the_base_model(random_model_dir, tmp_path):
    """Under LoRA the frozen teacher and the KL reference are the model with its adapter off: no deepcopy,
    and still exactly the base weights after the adapter has trained."""
    tr = trainer_for(random_model_dir, tmp_path, train__method="opd", train__use_lora="true", train__lora_rank="4",
                     train__lr="5e-2", train__kl_coef="0.1")
    assert tr.frozen is None
    samples = samples_for(tr.tokenizer, n=3, hint="Answer with just the number.")
    for _ in range(3):
        tr.step(samples)
    assert tr.last["train/kl"] > 0  # the adapter moved the policy away from the base
    sig = tr.teacher_signals(samples, [samples[0].hint] * 3)
    s = samples[0]
    want = _manual_response_logprobs(_base_model(random_model_dir), tr.teacher_prompt_ids(s, s.hint), s.response_ids)
    got = torch.tensor(sig[0].logprobs[s.prompt_len:])
    torch.testing.assert_close(got, want.gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1),
                               rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- config


def _cfg(**flags):
    return load_config({"data_dir": "/tmp/unused", **flags}, env={})


@pytest.mark.parametrize("flags,key", [
    ({"train__teacher": "http://127.0.0.1:9000/v1"}, r"train\.teacher must be one of frozen, policy, model"),
    ({"train__teacher": "live"}, r"train\.teacher must be one of"),
    ({"train__teacher": "model"}, r"train\.teacher_model: --teacher model needs --teacher-model"),
    ({"train__teacher": "policy", "train__teacher_model": "/m"}, r"train\.teacher: --teacher-model is given"),
    ({"train__distill_topk": "8", "train__method": "binary"}, r"train\.distill_topk: .* needs --method opd"),
    ({"train__num_steps_per_rollout": "0"}, r"train\.num_steps_per_rollout"),
    ({"train__fixed_denominator_tokens": "0"}, r"train\.fixed_denominator_tokens"),
    ({"train__hint_selection": "random"}, r"train\.hint_selection must be one of longest, overlap"),
    ({"train__loss_agg": "mean"}, r"train\.loss_agg must be one of"),
])
def test_train_config_errors_name_the_key(flags, key):
    with pytest.raises(ConfigError, match=key):
        _cfg(**flags)


def test_train_flags_parse():
    from clawloop.config import build_parser

    ns = build_parser().parse_args(["--loss-agg", "fixed-denominator", "--distill-topk", "16", "--method", "opd",
                                    "--hint-selection", "overlap", "--num-steps-per-rollout", "4",
                                    "--teacher", "policy", "--opd-clip", "2.5"])
    cfg = load_config(vars(ns), env={})
    t = cfg.train
    assert (t.loss_agg, t.distill_topk, t.hint_selection, t.num_steps_per_rollout, t.teacher, t.opd_clip) == \
        ("fixed-denominator", 16, "overlap", 4, "policy", 2.5)


def test_merge_stats_by_hand():
    from clawloop.trainer.metrics import merge_stats

    parts = [({"train/pg_loss": 0.5, "train/ratio_max": 1.2, "train/clip_frac": 0.0, "train/valid_tokens": 10,
               "train/combine_rl_frac": 1.0}, 10, 1),
             ({"train/pg_loss": -0.25, "train/ratio_max": 1.1, "train/clip_frac": 0.5, "train/valid_tokens": 30,
               "train/combine_rl_frac": 0.0}, 30, 3)]
    m = merge_stats(parts)
    assert m == {"train/pg_loss": 0.25, "train/ratio_max": 1.2, "train/clip_frac": 0.375, "train/valid_tokens": 40,
                 "train/combine_rl_frac": 0.25}
    assert merge_stats(parts, losses="mean")["train/pg_loss"] == 0.125
