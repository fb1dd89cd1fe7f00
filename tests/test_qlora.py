"""QLoRA (--load-in-4bit) on CPU: the trainer trains LoRA over an NF4 base, the hf engine serves the same
NF4 base with each published adapter on top, and the engine's logprobs are the trainer's (the project's
drift tolerance, `train/logprob_diff_abs_mean` < 1e-3). bitsandbytes 0.50's CPU backend runs all of it; its
AVX512-BF16 inference repack, which would cut autograd off below a layer, is switched off (`quant.py`)."""

from __future__ import annotations

import asyncio

import bitsandbytes as bnb  # .[dev] and .[qlora] pin it
import pytest
import torch

from clawloop.engines.base import AcceptsLora, GenerationRequest, LoraAdapter, SamplingParams
from clawloop.records import Sample
from conftest import make_cfg

QLORA = dict(model__load_in_4bit="true", train__use_lora="true", train__method="binary", train__lr="5e-2",
             train__lora_rank="4", train__lora_alpha="8")


def _linear4bit(model) -> list:
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


async def _sample(engine, prompt, n, seed0):
    async def one(i):
        ids, lps, ver = [], [], 0
        async for ev in engine.generate(GenerationRequest(prompt, SamplingParams(temperature=1.0, max_tokens=4,
                                                                                 seed=seed0 + i))):
            if ev.token_id is not None:
                ids.append(ev.token_id)
                lps.append(ev.logprob)
            ver = ev.policy_version
        return Sample(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                      rollout_logprobs=[0.0] * len(prompt) + lps, prompt_len=len(prompt),
                      reward=1.0 if ids and ids[0] % 2 == 0 else -1.0, policy_version=ver)
    return await asyncio.gather(*(one(i) for i in range(n)))


def test_qlora_trains_on_nf4_and_the_engine_serves_the_adapters(random_model_dir, tmp_path, engine):
    """`engine`: the session's full-precision engine on the same model, for the weights' size."""
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.quant import weight_bytes
    from clawloop.trainer import Trainer
    from clawloop.trainer.checkpoint import load_checkpoint, save_checkpoint, weights_fingerprint

    cfg = make_cfg(random_model_dir, tmp_path, **QLORA)
    trainer = Trainer(cfg, str(random_model_dir))
    full, engine = engine, HFEngine(random_model_dir, device="cpu", dtype="float32", load_in_4bit=True)
    assert isinstance(engine, AcceptsLora) and engine.accepts_lora_adapters
    layers = _linear4bit(trainer.model)
    assert len(layers) == 2 * 7 and len(_linear4bit(engine.model)) == 2 * 7  # q k v o gate up down per layer
    packed0 = [m.weight.detach().clone() for m in layers]
    assert all(p.dtype == torch.uint8 for p in packed0)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    lora0 = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert weight_bytes(engine.model) < weight_bytes(full.model)
    prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 12+7?"}], None)
    base_ptr = _linear4bit(engine.model)[0].weight.data_ptr()

    async def main():
        await engine.start()
        try:
            for step in range(2):
                samples = await _sample(engine, prompt, 4, seed0=100 * step)
                stats = trainer.step(samples, served_version=engine.policy_version)
                assert stats["train/logprob_diff_abs_mean"] < 1e-3, stats  # serving computes what training does
                assert stats["train/logprob_diff_abs_max"] < 1e-3, stats
                await engine.publish(trainer.lora_adapter(), trainer.version)
            with pytest.raises(ValueError, match="LoRA adapters only"):
                await engine.publish(trainer.served_state_dict(), trainer.version + 1)
            published = trainer.lora_adapter()
            # what a resume checks (TrainerLoop.publish_resumed): the engine holds the trained weights
            assert weights_fingerprint(engine.state_dict()) == pytest.approx(
                weights_fingerprint(trainer.served_state_dict()), abs=1e-3)
            # after the last publish, the served version is the trained one: same logprobs on a fresh turn
            samples = await _sample(engine, prompt, 2, seed0=999)
            return trainer.step(samples, served_version=engine.policy_version), published
        finally:
            await engine.stop()

    last, published = asyncio.run(main())
    assert last["train/logprob_diff_abs_mean"] < 1e-3, last
    assert engine.policy_version == 2 and trainer.step_count == 3
    # the base never moved; the adapters did; every published version wraps the same base bytes
    assert all(torch.equal(a, m.weight) for a, m in zip(packed0, layers))
    moved = sum(float((p.detach() - lora0[n]).abs().sum()) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert moved > 0
    served = _linear4bit(engine.model)
    assert served[0].weight.data_ptr() == base_ptr and len(served) == 14
    sd = engine.model.state_dict()
    k = next(k for k in published.state_dict if "lora_B" in k)
    assert torch.equal(sd[k.replace(".weight", ".default.weight")], published.state_dict[k])
    assert float(published.state_dict[k].abs().sum()) > 0  # B starts at 0: this one was trained
    # a checkpoint holds the adapter; a fresh 4-bit trainer resumes it exactly
    ckpt = save_checkpoint(trainer, tmp_path / "ckpt", cursor=0)
    resumed = Trainer(cfg, str(random_model_dir))
    load_checkpoint(resumed, ckpt)
    assert resumed.step_count == trainer.step_count
    after = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert all(torch.equal(after[n], p) for n, p in trainer.model.named_parameters() if p.requires_grad)


def test_a_full_precision_engine_refuses_an_adapter(engine):
    with pytest.raises(ValueError, match="needs --load-in-4bit"):
        engine._prepare_model(LoraAdapter(state_dict={}, config={}))


# -- on a GPU (`make test-gpu`, scripts/gpu_check.sh): the same path in bf16 on CUDA, and its memory --------------
def _cuda_why() -> str:
    return "" if torch.cuda.is_available() else "torch sees no CUDA device"


@pytest.mark.gpu
def test_qlora_on_cuda_serves_what_it_trains(random_model_dir, tmp_path):
    """Trainer (bf16 autocast over the NF4 base) and engine (bf16) on one GPU: the drift stays small."""
    from conftest import require_or_skip

    require_or_skip("gpu", _cuda_why())
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer import Trainer

    cfg = make_cfg(random_model_dir, tmp_path, train__device="cuda", **QLORA)
    trainer = Trainer(cfg, str(random_model_dir))
    engine = HFEngine(random_model_dir, device="cuda", dtype="bfloat16", load_in_4bit=True)
    assert len(_linear4bit(trainer.model)) == 14 and trainer.model.device.type == "cuda"
    prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 12+7?"}], None)

    async def main():
        await engine.start()
        try:
            out = []
            for step in range(3):
                samples = await _sample(engine, prompt, 4, seed0=100 * step)
                out.append(trainer.step(samples, served_version=engine.policy_version))
                await engine.publish(trainer.lora_adapter(), trainer.version)
            return out
        finally:
            await engine.stop()

    stats = asyncio.run(main())
    drift = [s["train/logprob_diff_abs_mean"] for s in stats]
    print("qlora cuda drift (mean |engine - trainer| logprob per step):", drift)
    assert max(drift) < 2e-2, drift  # bf16 on both sides: kernels differ by batch shape, not by weights
    assert engine.policy_version == 3


@pytest.mark.gpu
def test_qlora_memory_on_cuda(tmp_path):
    """GPU memory per base parameter, NF4 against bf16, LoRA r=16 on every linear layer, one AdamW step."""
    from conftest import require_or_skip

    require_or_skip("gpu", _cuda_why())
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "qlora_memory.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "CLAWLOOP_BENCH_DEVICE": "cuda"})
    print(out.stdout)
    assert out.returncode == 0, out.stderr[-3000:]
    ratio = float(out.stdout.split("nf4 / bf16: weights ")[1].split(",")[0])
    assert ratio < 0.35
