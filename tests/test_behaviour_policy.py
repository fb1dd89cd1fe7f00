"""The behaviour policy of a turn sampled at temperature != 1 or top_p < 1: worked by hand,
then through a trainer step on the random model."""

from __future__ import annotations

import math

import pytest
import torch

from clawloop.losses import behaviour_logprobs


def test_behaviour_logprobs_by_hand():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]]))  # (1, 1, 3): probabilities .5 .3 .2
    tgt = torch.tensor([[1]])
    one = torch.tensor([1.0])
    # T = 1, top_p = 1: the raw logprob.
    assert behaviour_logprobs(logits, tgt, one, one).item() == pytest.approx(math.log(0.3), abs=1e-6)
    # T = 2: softmax(log p / 2) = sqrt(p) / sum sqrt(p).
    z = math.sqrt(0.5) + math.sqrt(0.3) + math.sqrt(0.2)
    got = behaviour_logprobs(logits, tgt, torch.tensor([2.0]), one).item()
    assert got == pytest.approx(math.log(math.sqrt(0.3) / z), abs=1e-6)
    # top_p = 0.6: the nucleus is {0.5, 0.3} (0.5 before the second token <= 0.6; 0.8 before the third > 0.6).
    got = behaviour_logprobs(logits, tgt, one, torch.tensor([0.6])).item()
    assert got == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)
    # Greedy: a point mass on the sampled (argmax) token.
    assert behaviour_logprobs(logits, torch.tensor([[0]]), torch.tensor([0.0]), one).item() == 0.0


def test_rows_keep_their_own_parameters():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]], [[0.5, 0.3, 0.2]]]))  # (2, 1, 3)
    tgt = torch.tensor([[1], [1]])
    got = behaviour_logprobs(logits, tgt, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.6]))  # (2, 1)
    assert got[0, 0].item() == pytest.approx(math.log(0.3), abs=1e-6)
    assert got[1, 0].item() == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)


def _sample(trainer, sampling):
    from clawloop.records import Sample
    from clawloop.trainer.core import token_logprobs

    tok = trainer.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                     tokenize=True)
    prompt = list(prompt["input_ids"] if not isinstance(prompt, list) else prompt)
    resp = tok.encode("The answer is 4.", add_special_tokens=False)
    seq = torch.tensor([prompt + resp])
    with torch.no_grad():
        lp, _ = token_logprobs(trainer.model, seq, torch.ones_like(seq))
    n = len(prompt)
    engine = [0.0] * n + lp[0, n - 1:].tolist()  # the engine's raw logprobs equal the trainer's
    return Sample(tokens=prompt + resp, loss_mask=[0] * n + [1] * len(resp), rollout_logprobs=engine,
                  prompt_len=n, reward=1.0, sampling=sampling)


def test_trainer_corrects_for_the_sampling_temperature(random_model_dir, tmp_path):
    from conftest import make_cfg

    from clawloop.trainer.core import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-9")
    tr = Trainer(cfg, str(random_model_dir))
    raw = tr.step([_sample(tr, {"temperature": 1.0, "top_p": 1.0, "seed": None, "logprobs": "raw"})])
    assert raw["train/tempered_samples"] == 0
    assert raw["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy, untempered: w = 1
    hot = tr.step([_sample(tr, {"temperature": 0.5, "top_p": 0.9, "seed": 3, "logprobs": "raw"})])
    assert hot["train/tempered_samples"] == 1
    # Sampled sharper than the raw policy: the behaviour put more mass on these tokens, weights move off 1.
    assert abs(hot["train/tis_weight_mean"] - 1.0) > 1e-3
    unknown = tr.step([_sample(tr, None)])  # imported turns without sampling: the raw convention
    assert unknown["train/tempered_samples"] == 0


def test_constrained_turns_weigh_by_the_allowed_mass_and_do_not_count_as_drift(random_model_dir, tmp_path):
    """A turn sampled under a grammar reports logprobs renormalised over the allowed ids: higher than
    the trainer's raw ones by -log(mass). TIS weighs each token by that mass (< 1: the masked
    distribution's importance weight); the engine/trainer drift metric does not read it as drift."""
    from conftest import make_cfg

    from clawloop.trainer.core import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-9")
    tr = Trainer(cfg, str(random_model_dir))
    s = _sample(tr, {"temperature": 1.0, "top_p": 1.0, "seed": None, "logprobs": "constrained"})
    mass = 0.5  # say the grammar allowed half the model's mass at every response token
    s.rollout_logprobs = [lp - math.log(mass) if m else lp for lp, m in zip(s.rollout_logprobs, s.loss_mask)]
    out = tr.step([s])
    assert out["train/tis_weight_mean"] == pytest.approx(mass, abs=1e-3)
    assert out["train/logprob_diff_abs_mean"] == pytest.approx(0.0, abs=1e-6)
    assert out["train/constrained_frac"] == 1.0
    s.sampling = dict(s.sampling, logprobs="raw")  # the same numbers claimed raw: that is drift
    assert tr.step([s])["train/logprob_diff_abs_mean"] == pytest.approx(math.log(2), abs=1e-3)
