"""Logprob drift of the 4-bit path on the shipped tiny model (CPU), three numbers:

1. engine vs trainer: the hf engine serving the NF4 base with each published adapter, against the
   trainer's NF4 + LoRA recomputation of the same sampled tokens (`train/logprob_diff_abs_mean` / `_max`
   over STEPS Binary-RL steps, lr 5e-2 so the adapters move);
2. what `quant._keep_unpacked` avoids: bitsandbytes' AVX512-BF16 repacked inference against the unpacked
   layers, same NF4 bytes, on one batch of the tiny model's corpus-like prompts;
3. the quantization itself: the NF4 base against the float32 base (what a full-precision server would
   differ by, the reason --load-in-4bit is refused with --backend vllm).

Run: `nice -n 10 .venv/bin/python bench/qlora_drift.py` (about a minute).
"""

from __future__ import annotations

import asyncio
import tempfile

import torch

STEPS = 4


def main() -> None:
    from transformers import AutoModelForCausalLM

    from clawloop.config import load_config
    from clawloop.engines.base import GenerationRequest, SamplingParams
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.quant import load_4bit, nf4_config
    from clawloop.records import Sample
    from clawloop.tinymodel.build import SHIPPED_DIR
    from clawloop.trainer import Trainer

    torch.set_num_threads(2)
    path = str(SHIPPED_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config({"model__path": path, "data_dir": tmp, "model__load_in_4bit": "true",
                           "train__use_lora": "true", "train__method": "binary", "train__lr": "5e-2"}, env={})
        trainer = Trainer(cfg, path)
        engine = HFEngine(path, device="cpu", dtype="float32", load_in_4bit=True)
        prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 12+7?"}], None)

        async def run() -> list[dict]:
            await engine.start()
            out = []
            try:
                for step in range(STEPS):
                    samples = []
                    for i in range(8):
                        ids, lps = [], []
                        p = SamplingParams(temperature=1.0, max_tokens=16, seed=100 * step + i)
                        async for ev in engine.generate(GenerationRequest(prompt, p)):
                            if ev.token_id is not None:
                                ids.append(ev.token_id)
                                lps.append(ev.logprob)
                        samples.append(Sample(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                                              rollout_logprobs=[0.0] * len(prompt) + lps, prompt_len=len(prompt),
                                              reward=1.0 if ids and ids[0] % 2 == 0 else -1.0,
                                              policy_version=engine.policy_version))
                    out.append(trainer.step(samples, served_version=engine.policy_version))
                    await engine.publish(trainer.lora_adapter(), trainer.version)
            finally:
                await engine.stop()
            return out

        stats = asyncio.run(run())
    print(f"1. engine vs trainer, NF4 + LoRA, {STEPS} steps x 8 samples x <=16 tokens:")
    for i, s in enumerate(stats):
        print(f"   step {i + 1}: mean {s['train/logprob_diff_abs_mean']:.2e}  max {s['train/logprob_diff_abs_max']:.2e}")

    ids = torch.tensor([prompt * 2])  # (1, T)
    unpacked = load_4bit(AutoModelForCausalLM, path, torch.float32, torch.device("cpu"))
    packed = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, quantization_config=nf4_config(
        torch.float32), device_map={"": "cpu"})  # bitsandbytes' default: repacked on the first no-grad eval
    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        lp = {k: torch.log_softmax(m.eval()(ids).logits.float(), -1)
              for k, m in (("unpacked", unpacked), ("packed", packed), ("full", full))}
    d = (lp["packed"] - lp["unpacked"]).abs()
    print(f"2. bitsandbytes' AVX512-BF16 repack vs unpacked NF4 (same bytes), {ids.shape[1]} positions x full "
          f"vocabulary: mean {d.mean():.2e}  max {d.max():.2e}")
    d = (lp["unpacked"] - lp["full"]).abs()
    print(f"3. NF4 base vs float32 base: mean {d.mean():.2e}  max {d.max():.2e}")


if __name__ == "__main__":
    main()
