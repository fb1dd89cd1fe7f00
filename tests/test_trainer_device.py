"""Where the trainer runs: device resolution (CPU tests that fake what torch
sees), the CPU-offloaded optimizer compared with the plain one on CPU, and
`gpu`-marked tests that run a real step on CUDA (skipped without a device)."""

from __future__ import annotations

import logging

import pytest
import torch

from clawloop.config import ConfigError
from clawloop.records import Sample
from clawloop.trainer.device import resolve_train_device
from conftest import make_cfg, needs_part

needs_cuda = needs_part("gpu", not torch.cuda.is_available() and "torch sees no CUDA device")


def fake_cuda(monkeypatch, count: int) -> None:
    """Make torch report `count` CUDA devices, for the resolution function only (nothing is allocated)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# ---------------------------------------------------------------------------- resolution


def test_auto_is_cpu_without_cuda(monkeypatch, caplog):
    fake_cuda(monkeypatch, 0)
    assert resolve_train_device("auto") == torch.device("cpu")
    assert resolve_train_device("cpu", ["0"]) == torch.device("cpu")
    with caplog.at_level(logging.WARNING):
        assert resolve_train_device("auto", ["1"]) == torch.device("cpu")
    assert "no CUDA device" in caplog.text


def test_auto_matches_this_machine():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_train_device("auto").type == expected


def test_train_gpus_pick_the_first_id(monkeypatch, caplog):
    fake_cuda(monkeypatch, 4)
    assert resolve_train_device("auto") == torch.device("cuda", 0)
    assert resolve_train_device("cuda") == torch.device("cuda", 0)
    assert resolve_train_device("auto", ["2"]) == torch.device("cuda", 2)
    with caplog.at_level(logging.WARNING):
        assert resolve_train_device("cuda", ["3", "1"]) == torch.device("cuda", 3)
    assert "uses cuda:3 only" in caplog.text
    # an explicit cuda:N wins over TRAIN_GPUS
    assert resolve_train_device("cuda:1", ["2"]) == torch.device("cuda", 1)
    # TRAIN_GPUS as the config reads it from the environment
    from clawloop.config import load_config

    cfg = load_config({}, env={"TRAIN_GPUS": "2,3"})
    assert cfg.train.train_gpus == ["2", "3"]
    assert resolve_train_device(cfg.train.device, cfg.train.train_gpus) == torch.device("cuda", 2)


@pytest.mark.parametrize("device,gpus,count,match", [
    ("cuda", [], 0, "no CUDA device"),
    ("cuda:0", [], 0, "no CUDA device"),
    ("cuda:4", [], 4, "cuda:4 does not exist"),
    ("auto", ["7"], 2, "train.train_gpus: cuda:7 does not exist"),
    ("tpu", [], 1, "must be auto, cpu, cuda or cuda:N"),
    ("cuda:x", [], 1, "must be auto, cpu, cuda or cuda:N"),
    ("auto", ["gpu0"], 1, "GPU ids"),
])
def test_bad_devices_are_config_errors(monkeypatch, device, gpus, count, match):
    fake_cuda(monkeypatch, count)
    with pytest.raises(ConfigError, match=match):
        resolve_train_device(device, gpus)


def test_trainer_and_build_loop_resolve_from_config(random_model_dir, tmp_path, monkeypatch):
    import clawloop.apps.train as train_app
    from clawloop.naming import open_store
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__device="cpu")
    assert Trainer(cfg, str(random_model_dir)).device == torch.device("cpu")
    asked = []

    def spy(device, gpus):
        asked.append((device, list(gpus)))
        return torch.device("cpu")

    monkeypatch.setattr(train_app, "resolve_train_device", spy)
    cfg = make_cfg(random_model_dir, tmp_path, train__device="cuda:1", train__train_gpus="1,2")
    store = open_store(cfg)
    try:
        tl = train_app.build_loop(cfg, None, store)
    finally:
        store.close()
    assert asked == [("cuda:1", ["1", "2"])] and tl.trainer.device == torch.device("cpu")


# ---------------------------------------------------------------------------- helpers


def samples_for(trainer, n=4, hint=None):
    tok = trainer.tokenizer
    prompt = tok.encode("What is 12+7?", add_special_tokens=False)
    out = []
    for i in range(n):
        resp = tok.encode(["19", "The answer is 19.", "nineteen", "20"][i % 4], add_special_tokens=False)
        resp = resp + [tok.eos_token_id]
        out.append(Sample(tokens=prompt + resp, loss_mask=[0] * len(prompt) + [1] * len(resp),
                          rollout_logprobs=[0.0] * len(prompt) + [-2.0] * len(resp), prompt_len=len(prompt),
                          reward=1.0 if i % 2 == 0 else -1.0, hint=hint,
                          messages=[{"role": "user", "content": "What is 12+7?"}]))
    return out


def trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def optimizer_state_devices(trainer) -> set[str]:
    """Where AdamW's moments live (the `step` counter's place depends on the kernel, not on offload)."""
    return {v.device.type for st in trainer.opt.state.values() for k, v in st.items()
            if torch.is_tensor(v) and k != "step"}


# ---------------------------------------------------------------------------- offload on CPU


@pytest.mark.parametrize("lora", [False, True])
def test_offloaded_optimizer_matches_the_plain_one(random_model_dir, tmp_path, lora):
    """The offload path (forced on for a CPU trainer) steps CPU masters and copies them back: after
    two steps the weights equal those of the plain optimizer, and its state is on the CPU."""
    from clawloop.trainer import Trainer

    flags = dict(train__method="binary", train__lr="1e-2", train__offload_optimizer_state="true")
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="4")
    cfg = make_cfg(random_model_dir, tmp_path, **flags)
    plain = Trainer(cfg, str(random_model_dir))  # on CPU the flag alone does nothing
    offloaded = Trainer(cfg, str(random_model_dir), _force_offload=True)
    assert not plain.offload and plain.masters is None
    assert offloaded.offload and offloaded.opt.param_groups[0]["params"][0] is not offloaded.params[0]
    before = trainable(plain)
    for _ in range(2):
        plain.step(samples_for(plain))
        offloaded.step(samples_for(offloaded))
    a, b = trainable(plain), trainable(offloaded)
    assert sum(float((a[k] - before[k]).abs().sum()) for k in a) > 0, "the step must change the weights"
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0, msg=k)
    assert optimizer_state_devices(offloaded) == {"cpu"}
    for p, m in zip(offloaded.params, offloaded.masters):
        assert m.device.type == "cpu" and m.dtype == torch.float32 and torch.equal(p.detach().cpu(), m)


def test_offload_flag_on_cpu_is_a_logged_no_op(random_model_dir, tmp_path, caplog):
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__offload_optimizer_state="true")
    with caplog.at_level(logging.INFO, logger="clawloop.trainer.core"):
        t = Trainer(cfg, str(random_model_dir))
    assert not t.offload and "nothing to offload" in caplog.text


def test_offloaded_checkpoint_resumes_into_the_masters(random_model_dir, tmp_path):
    """Resuming must refresh the CPU masters from the loaded weights, or the next step would
    undo the checkpoint: the resumed step equals the uninterrupted one."""
    from clawloop.trainer import Trainer
    from clawloop.trainer.checkpoint import load_checkpoint, save_checkpoint

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-2",
                   train__offload_optimizer_state="true")
    first = Trainer(cfg, str(random_model_dir), _force_offload=True)
    first.step(samples_for(first))
    path = save_checkpoint(first, tmp_path / "ckpt", cursor=0)
    resumed = Trainer(cfg, str(random_model_dir), _force_offload=True)
    load_checkpoint(resumed, path)
    first.step(samples_for(first))
    resumed.step(samples_for(resumed))
    a, b = trainable(first), trainable(resumed)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0, msg=k)


def test_no_autocast_on_cpu(random_model_dir, tmp_path):
    from clawloop.trainer import Trainer

    t = Trainer(make_cfg(random_model_dir, tmp_path, train__method="binary"), str(random_model_dir))
    dtypes = []
    t.model.lm_head.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    t.step(samples_for(t))
    assert t.autocast_dtype is None and dtypes == [torch.float32]


# ---------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lora", [False, True])
def test_step_on_cuda(random_model_dir, tmp_path, lora):
    """Every parameter on the GPU, forwards under bf16 autocast with float32 masters, a finite loss,
    changed weights, CPU tensors out; teacher, reference and entropy paths all run there."""
    from clawloop.trainer import Trainer

    flags = dict(train__method="combine", train__lr="1e-3", train__kl_coef="0.01", train__entropy_coef="0.01",
                 train__device="cuda")
    if lora:
        flags.update(train__use_lora="true", train__lora_rank="4")
    t = Trainer(make_cfg(random_model_dir, tmp_path, **flags), str(random_model_dir))
    assert t.device.type == "cuda" and t.autocast_dtype == torch.bfloat16
    assert all(p.device.type == "cuda" for p in t.model.parameters())
    with t.frozen_model() as base:  # the copy under full fine-tuning; under LoRA the model, adapter off
        assert all(p.device.type == "cuda" for p in base.parameters())
    assert all(p.dtype == torch.float32 for p in t.params)
    seen = []

    def hook(mod, inp, out):
        seen.append((out.dtype, torch.is_autocast_enabled("cuda")))

    lm_head = t.model.get_output_embeddings()
    lm_head.register_forward_hook(hook)
    before = trainable(t)
    stats = t.step(samples_for(t, hint="Answer with just the number."))
    assert seen and all(d == torch.bfloat16 and on for d, on in seen)
    assert torch.isfinite(torch.tensor(stats["train/pg_loss"])) and stats["train/tokens"] > 0
    # combine's OPD term is the top-K distillation (--opd-target topk, the default), not an advantage
    assert stats["train/combine_rl_frac"] == 1.0 and stats["train/topk_teacher_mass"] > 0
    assert torch.isfinite(torch.tensor(stats["train/topk_loss"]))
    assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("train/kl_loss", "train/entropy"))
    after = trainable(t)
    assert sum(float((after[k] - before[k]).abs().sum()) for k in after) > 0
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in t.model.parameters())
    assert optimizer_state_devices(t) == {"cuda"}
    served = t.served_state_dict()
    assert served and all(v.device.type == "cpu" for v in served.values())
    if lora:
        adapter = t.lora_adapter()
        assert all(v.device.type == "cpu" for v in adapter.state_dict.values())


@pytest.mark.gpu
@needs_cuda
def test_offload_on_cuda_keeps_optimizer_state_on_cpu(random_model_dir, tmp_path):
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-3", train__device="cuda",
                   train__offload_optimizer_state="true")
    off = Trainer(cfg, str(random_model_dir))
    plain = Trainer(make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-3",
                             train__device="cuda"), str(random_model_dir))
    assert off.offload and not plain.offload
    for _ in range(2):
        off.step(samples_for(off))
        plain.step(samples_for(plain))
    assert optimizer_state_devices(off) == {"cpu"} and optimizer_state_devices(plain) == {"cuda"}
    assert all(p.device.type == "cuda" for p in off.model.parameters())
    for p, m in zip(off.params, off.masters):
        assert m.device.type == "cpu" and torch.equal(p.detach().cpu(), m)
    a, b = trainable(plain), trainable(off)
    for k in a:  # same math; CUDA's atomics in the embedding backward allow a little noise
        torch.testing.assert_close(b[k], a[k], atol=1e-4, rtol=0, msg=k)


@pytest.mark.gpu
@needs_cuda
def test_checkpoint_on_cuda_round_trips(random_model_dir, tmp_path):
    from clawloop.trainer import Trainer
    from clawloop.trainer.checkpoint import load_checkpoint, save_checkpoint, weights_fingerprint

    cfg = make_cfg(random_model_dir, tmp_path, train__method="binary", train__lr="1e-3", train__device="cuda")
    t = Trainer(cfg, str(random_model_dir))
    t.step(samples_for(t))
    path = save_checkpoint(t, tmp_path / "ckpt", cursor=3)
    t2 = Trainer(cfg, str(random_model_dir))
    state = load_checkpoint(t2, path)
    assert state["cursor"] == 3 and t2.step_count == 1
    assert weights_fingerprint(t2.served_state_dict()) == pytest.approx(weights_fingerprint(t.served_state_dict()),
                                                                        abs=1e-6)
    assert optimizer_state_devices(t2) == {"cuda"}
    t2.step(samples_for(t2))  # the loaded optimizer state steps on the GPU
