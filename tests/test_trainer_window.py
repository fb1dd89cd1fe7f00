"""Trainer memory on long samples (issue #28 item 3): logits only for the loss window, logprobs in pieces.

A step computes the same loss and gradients whether a micro-batch is cut to its loss window or not,
and whatever the piece size of the logprobs: the window and the pieces change where the numbers are
computed, never what they are (to float rounding). And a long sample's step never holds logits of
its whole prompt. Real trainer, a random 2-layer model, CPU."""

from __future__ import annotations

import random

import pytest
import torch

from clawloop.records import Sample
from clawloop.trainer import batch as batch_mod
from clawloop.trainer import core
from conftest import make_cfg


def test_chunked_logprobs_are_the_whole_tensor_log_softmax_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 37, 50, generator=g, requires_grad=True)  # (B, W, V)
    targets = torch.randint(0, 50, (3, 37), generator=g)  # (B, W)
    whole = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)  # (B, W)
    (gw,) = torch.autograd.grad(whole.sum(), logits)
    for chunk in (1, 5, 36, 37, 1000):
        lp = core.chunked_logprobs(logits, targets, chunk)
        (gc,) = torch.autograd.grad(lp.sum(), logits)
        assert torch.equal(lp, whole) and torch.equal(gc, gw), chunk
    assert core.chunked_logprobs(logits[:, :0], targets[:, :0]).shape == (3, 0)


def test_loss_window_spans_every_trained_position_and_leaves_short_rows_whole():
    mask = torch.zeros(2, 3000, dtype=torch.long)
    mask[0, 2000:2010] = 1
    mask[1, 2500:2600] = 1
    assert batch_mod.loss_window(mask) == (2000, 2600)
    assert batch_mod.loss_window(mask, min_skip=3000) == (0, 3000)  # leaves out 2400 < 3000: whole rows
    assert batch_mod.loss_window(torch.zeros(2, 3000, dtype=torch.long)) == (0, 3000)  # nothing trains


def long_samples(vocab: int, prompt: int) -> list[Sample]:
    """Two agent turns after a long prompt, of unequal length (padding in the window), one sampled at T=0.7."""
    rng = random.Random(0)
    out = []
    for i, (reward, answer) in enumerate([(1.0, 24), (None, 40)]):
        n = prompt + 37 * i
        toks = [rng.randrange(3, vocab) for _ in range(n + answer)]
        out.append(Sample(tokens=toks, loss_mask=[0] * n + [1] * answer, prompt_len=n, reward=reward,
                          rollout_logprobs=[0.0] * n + [-1.5 - 0.01 * j for j in range(answer)],
                          sampling={"temperature": 0.7, "top_p": 1.0} if i else None))
    return out


def step_grads(model_dir, tmp_path, monkeypatch, *, window: bool, chunk: int, method: str, updates: int):
    monkeypatch.setattr(batch_mod, "WINDOW_MIN_SKIP", 0 if window else 10**9)
    monkeypatch.setattr(core, "LOGPROB_CHUNK", chunk)
    cfg = make_cfg(model_dir, tmp_path / f"d{window}{chunk}{method}{updates}", train__method=method,
                   train__num_steps_per_rollout=str(updates), train__lr="1e-3")
    trainer = core.Trainer(cfg, str(model_dir), device="cpu")
    seen: list[tuple[int, int]] = []
    tensorize = batch_mod.tensorize  # the function itself (a spy of an earlier call may be in core)

    def spy(*a, **kw):
        b = tensorize(*a, **kw)
        seen.append((b.start, b.end))
        return b

    monkeypatch.setattr(core, "tensorize", spy)
    grads: list[dict[str, torch.Tensor]] = []
    step = trainer._optimizer_step

    def keep():
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step()

    trainer._optimizer_step = keep
    stats = trainer.step(long_samples(len(trainer.tokenizer), 300))
    return stats, grads, seen


@pytest.mark.parametrize("method,updates", [("binary", 1), ("combine", 2)])
def test_a_step_is_the_same_with_and_without_the_window_and_pieces(random_model_dir, tmp_path, monkeypatch,
                                                                   method, updates):
    """`combine` covers the base weights' logits (the anchor, windowed too), TIS at T=0.7 (the behaviour
    logprobs read the window's targets) and a no-grad old-logprob pass before two updates."""
    ref, ref_g, seen_whole = step_grads(random_model_dir, tmp_path, monkeypatch, window=False, chunk=10**6,
                                        method=method, updates=updates)
    got, got_g, seen = step_grads(random_model_dir, tmp_path, monkeypatch, window=True, chunk=7, method=method,
                                  updates=updates)
    assert all(a == 0 for a, _ in seen_whole) and all(a >= 299 for a, _ in seen)  # the window left the prompt out
    for k in ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/tis_weight_mean"):
        if k in ref:
            assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-7), k
    assert len(got_g) == len(ref_g) == updates
    for gg, rg in zip(got_g, ref_g):
        assert gg.keys() == rg.keys() and rg
        for n in rg:
            assert torch.allclose(gg[n], rg[n], rtol=1e-4, atol=1e-7), (n, float((gg[n] - rg[n]).abs().max()))
    assert any(float(g.abs().sum()) > 0 for g in ref_g[0].values())


def test_a_long_samples_step_never_holds_its_prompts_logits(random_model_dir, tmp_path, monkeypatch):
    """The model is asked for logits of the window only: never as many positions as the prompt."""
    asked: list[int] = []
    window_logits = core.window_logits

    def spy(model, tokens, attn, start, end, **kw):
        asked.append(end - start)
        out = window_logits(model, tokens, attn, start, end, **kw)
        assert out.shape[1] == end - start
        return out

    monkeypatch.setattr(core, "window_logits", spy)
    cfg = make_cfg(random_model_dir, tmp_path / "d", train__method="combine")
    trainer = core.Trainer(cfg, str(random_model_dir), device="cpu")
    trainer.step(long_samples(len(trainer.tokenizer), 2000))
    assert asked and max(asked) <= 40 + 37 + 24, asked  # the answers' span, not 2000 prompt positions


def test_window_logprobs_are_the_whole_forwards_and_the_batch_lines_up_with_them(random_model_dir, tmp_path,
                                                                                  monkeypatch):
    """Against an independent reference: the model's whole-row logits, log_softmax, gathered at the next
    token; and every (B, W) tensor of a windowed micro-batch is the whole row's columns start..end-1."""
    monkeypatch.setattr(batch_mod, "WINDOW_MIN_SKIP", 0)
    cfg = make_cfg(random_model_dir, tmp_path / "d", train__method="binary")
    trainer = core.Trainer(cfg, str(random_model_dir), device="cpu")
    samples = long_samples(len(trainer.tokenizer), 300)
    whole = batch_mod.tensorize(samples, [None, None], [1.0, float("nan")], pad_id=trainer.pad_id,
                                device=torch.device("cpu"), window=False)
    b = batch_mod.tensorize(samples, [None, None], [1.0, float("nan")], pad_id=trainer.pad_id,
                            device=torch.device("cpu"), window=True)
    a, e = b.start, b.end
    assert (a, e) == (299, 300 + 37 + 40 - 1) and b.mask.sum() == whole.mask.sum() == 24 + 40
    assert torch.equal(b.mask, whole.mask[:, a:e]) and torch.equal(b.engine_lp, whole.engine_lp[:, a:e])
    assert torch.equal(b.targets, b.tokens[:, 1:][:, a:e])
    with torch.no_grad():
        logits = trainer.model(input_ids=b.tokens, attention_mask=b.attn, use_cache=False).logits[:, :-1]  # (B, L-1, V)
        ref = torch.log_softmax(logits.float(), -1).gather(-1, b.tokens[:, 1:, None]).squeeze(-1)  # (B, L-1)
        lp, win = core.token_logprobs(trainer.model, b.tokens, b.attn, want_logits=True, start=a, end=e)
    assert torch.allclose(lp, ref[:, a:e], atol=1e-5) and torch.allclose(win, logits[:, a:e], atol=1e-5)
