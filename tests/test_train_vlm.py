"""Training a vision-language policy on the image turns it served: a tiny random Qwen2-VL behind a real gateway
(hf engine), turns captured token-exact with their images stored by sha256 under the data dir, the trainer
loading the image-text class and rebuilding the pixel inputs from those files. The trainer's logprobs of the
sampled ids match the served ones within the text tolerance (`train/logprob_diff_abs_mean` < 1e-3, as
tests/test_trainer.py holds a text model to), a step changes the weights (full and LoRA), the engine serves the
published version (whose new turns the trainer again matches), and a missing image skips its sample with a
metric and a warning."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math

import pytest
import torch
from conftest import Gateway, make_cfg
from test_vlm import data_url, image_part, png

from clawloop.records import Judgement, Sample

TOL = 1e-3
"""The text path's trainer/engine logprob tolerance (tests/test_trainer.py)."""


@pytest.fixture(scope="module")
def own_engine(vlm_dir):
    """An engine of this module's own: publishing trained weights must not leak into test_vlm.py's."""
    from clawloop.engines.hf import HFEngine

    eng = HFEngine(vlm_dir, device="cpu", dtype="float32", max_batch_size=8, max_model_len=1024)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture
def gw(own_engine, vlm_dir, tmp_path):
    g = Gateway(own_engine, vlm_dir, tmp_path / "data")
    yield g
    g.stop()


SHOTS = [png(seed=11), png(300, 120, seed=12)]


def conversations() -> list[list[dict]]:
    """One image; two images over a tool call; text only (a VLM's text turns train too)."""
    a, b = SHOTS
    return [
        [{"role": "user", "content": [{"type": "text", "text": "What is on the screen?"}, image_part(data_url(a))]}],
        [{"role": "user", "content": [{"type": "text", "text": "Click the button."}, image_part(data_url(a))]},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "computer", "arguments": '{"action": "click"}'}}]},
         {"role": "tool", "tool_call_id": "call_1",
          "content": [{"type": "text", "text": "clicked"}, image_part(data_url(b))]}],
        [{"role": "user", "content": "Say something."}],
    ]


def serve(gw, tag: str, seed: int) -> list:
    """Sample each conversation twice at temperature 1 through the gateway; the captured turns."""
    client = gw.client()
    for i, msgs in enumerate(conversations()):
        for k in range(2):
            client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=1.0, seed=seed + k,
                                           extra_body={"session_id": f"{tag}-{i}-{k}", "session_done": True})
    gw.store.flush()
    return [t for i in range(3) for k in range(2) for t in gw.store.session_turns(f"{tag}-{i}-{k}")]


def samples_of(turns: list) -> list[Sample]:
    """Binary-RL samples, grouped per conversation with rewards +1 / -1, so each group has a signal."""
    out = []
    for j, t in enumerate(turns):
        s = Sample.from_turn(t, Judgement(turn_id=t.id, score=1 if j % 2 == 0 else -1))
        s.group_id = f"g{j // 2}"
        out.append(s)
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_image_turns_train_token_exact_and_publish(gw, own_engine, vlm_dir, tmp_path, lora):
    from clawloop.trainer import Trainer

    flags = {"train__method": "binary", "train__lr": "1e-2", "train__negative_weight": "1"}
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="4")
    cfg = make_cfg(vlm_dir, tmp_path / "data", **flags)
    trainer = Trainer(cfg, str(vlm_dir))
    assert type(trainer.model.get_base_model() if lora else trainer.model).__name__ == \
        "Qwen2VLForConditionalGeneration"
    assert trainer.images is not None

    turns = serve(gw, "a", seed=1)
    assert len(turns) == 6 and all(t.response_ids for t in turns)
    n_pad = [t.prompt_ids.count(own_engine.image_token_id) for t in turns]
    assert n_pad == [12, 12, 24, 24, 0, 0]
    # the stored messages name the images by sha256; the trainer reads those files, nothing else
    stored = sorted(p.name for p in (tmp_path / "data" / "images").iterdir())
    assert stored == sorted(f"{hashlib.sha256(x).hexdigest()}.png" for x in SHOTS)

    before = {k: v.clone() for k, v in trainer.served_state_dict().items()}
    stats = trainer.step(samples_of(turns), served_version=own_engine.policy_version)
    assert stats["train/images"] == 6 and stats["train/image_samples_skipped"] == 0
    assert stats["train/samples"] == 6
    # one micro-batch, right-padded rows with 0, 1 and 2 images: each row's logprobs are its served ones
    assert stats["train/micro_batches"] == 1
    assert stats["train/logprob_diff_abs_mean"] < TOL and stats["train/logprob_diff_abs_max"] < TOL, stats
    after = trainer.served_state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("language_model" in k for k in changed)
    if lora:  # only the adapted projections move (merged into the served weights)
        assert all(k.endswith("proj.weight") for k in changed), changed[:5]

    # publish: the engine serves the new version, and its new image turns match the trainer's new weights
    v = own_engine.policy_version
    asyncio.run(_publish(own_engine, trainer.served_state_dict(), v + 1))
    assert own_engine.policy_version == v + 1
    turns2 = serve(gw, "b", seed=100)
    assert {t.policy_version for t in turns2} == {v + 1}
    stats2 = trainer.step(samples_of(turns2), served_version=own_engine.policy_version)
    assert stats2["train/logprob_diff_abs_mean"] < TOL and stats2["train/logprob_diff_abs_max"] < TOL, stats2
    asyncio.run(_publish(own_engine, before, v + 2))  # back to the base weights for the next test


async def _publish(engine, weights, version):
    await engine.publish(weights, version)


def test_a_missing_or_altered_image_skips_its_sample_with_a_metric(gw, own_engine, vlm_dir, tmp_path, caplog):
    from clawloop.trainer import Trainer

    cfg = make_cfg(vlm_dir, tmp_path / "data", train__method="binary", train__lr="1e-3",
                   train__negative_weight="1")
    trainer = Trainer(cfg, str(vlm_dir))
    samples = samples_of(serve(gw, "m", seed=5))
    images = tmp_path / "data" / "images"
    second = images / f"{hashlib.sha256(SHOTS[1]).hexdigest()}.png"
    second.unlink()  # the tool result's image: the two-image turns lose it
    with caplog.at_level(logging.WARNING, logger="clawloop.trainer.vision"):
        stats = trainer.step(samples)
    assert stats["train/image_samples_skipped"] == 2 and stats["train/samples"] == 4
    assert "is not in" in caplog.text and "train/image_samples_skipped" in caplog.text

    # altered bytes under the same name are not the served image either
    first = images / f"{hashlib.sha256(SHOTS[0]).hexdigest()}.png"
    first.write_bytes(png(seed=99))
    trainer.images._cache.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="clawloop.trainer.vision"):
        stats = trainer.step(samples[:4])
    assert stats["train/image_samples_skipped"] == 4 and stats.get("train/skipped_step") == 1.0
    assert "do not hash to its name" in caplog.text

    # a prompt whose image parts name no stored image (an old GUI item's marker) is skipped, naming why
    s = samples[0]
    s.messages = [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "(screenshot, 9000 chars, saved as a file)"}}]}]
    stats = trainer.step([s])
    assert stats["train/image_samples_skipped"] == 1


def test_full_checkpoint_of_a_vlm_round_trips(vlm_dir, tmp_path):
    """A VLM's checkpoint is saved under transformers' names, which differ from its modules': it loads back."""
    from clawloop.trainer import Trainer
    from clawloop.trainer.checkpoint import load_checkpoint, save_checkpoint

    cfg = make_cfg(vlm_dir, tmp_path / "data", train__method="binary")
    a = Trainer(cfg, str(vlm_dir))
    with torch.no_grad():
        for p in a.model.parameters():
            p.add_(0.01)
    path = save_checkpoint(a, tmp_path / "ckpt", cursor=0)
    b = Trainer(cfg, str(vlm_dir))
    load_checkpoint(b, path)
    sa, sb = a.served_state_dict(), b.served_state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_opd_on_image_turns_trains_their_rl_signal_and_counts_them_untaught(gw, own_engine, vlm_dir, tmp_path):
    """OPD gives image samples no teacher yet (the hinted prompt would need its placeholders expanded): a
    combine step on hinted image turns trains their RL signal, the text turns get the teacher, and the
    image ones are counted."""
    from clawloop.trainer import Trainer

    cfg = make_cfg(vlm_dir, tmp_path / "data", train__method="combine", train__lr="1e-3",
                   train__negative_weight="1")
    trainer = Trainer(cfg, str(vlm_dir))
    samples = samples_of(serve(gw, "o", seed=7))
    for s in samples:
        s.hint = "Click the OK button."
    stats = trainer.step(samples, served_version=own_engine.policy_version)
    assert stats["train/hint_image_samples_untaught"] == 4 and stats["train/samples"] == 6
    assert stats["train/logprob_diff_abs_max"] < TOL and math.isfinite(stats["train/loss"])
