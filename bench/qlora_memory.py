"""Memory per parameter of a 4-bit (NF4, --load-in-4bit) base against a bf16 base, LoRA on both (CPU).

Each mode runs in a fresh process (clean peak RSS): load a random Qwen2 of LAYERS x HIDDEN (the linear
layers are ~99 % of its parameters, as in a real 4 B model), put a rank-16 LoRA on every linear layer, run
one forward + backward over a (1, SEQ) batch and one AdamW step. Printed per base parameter: the weights'
bytes as they sit in memory (`quant.weight_bytes`), the process's RSS growth over the load, and over the
whole step (peak). Run: `nice -n 10 .venv/bin/python bench/qlora_memory.py` (a few minutes on 2 busy cores). With
CLAWLOOP_BENCH_DEVICE=cuda the same on the GPU, memory from torch's allocator (tests/test_qlora.py runs it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LAYERS, HIDDEN, SEQ, RANK = 8, 1024, 256, 16


def rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def settle() -> None:
    """Give freed heap back to the OS and restart the peak (VmHWM) count from here."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_mode(model_dir: str, mode: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from clawloop.quant import load_4bit, weight_bytes

    torch.manual_seed(0)
    torch.set_num_threads(2)
    dev = torch.device(os.environ.get("CLAWLOOP_BENCH_DEVICE", "cpu"))
    cuda = dev.type == "cuda"
    mem = (lambda: torch.cuda.memory_allocated() / 2**20) if cuda else rss_mib
    r0 = mem()
    if mode == "nf4":
        model = load_4bit(AutoModelForCausalLM, model_dir, torch.bfloat16, dev)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(dev)
        with torch.no_grad():  # out of the checkpoint's mmap into the heap, as the 4-bit weights are
            for p in model.parameters():
                p.data = p.data.clone()
    # a 4-bit layer's parameter holds two weights per byte: count the weights it stands for
    n_params = sum(math.prod(p.quant_state.shape) if getattr(p, "quant_state", None) is not None else p.numel()
                   for p in model.parameters())
    wb = weight_bytes(model)
    settle()
    r_load, file_load = mem(), (0.0 if cuda else rss_mib("RssFile"))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=targets,
                                             task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (1, SEQ), device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else rss_mib("VmHWM")
    return {"mode": mode, "device": str(dev), "base_params": n_params, "lora_params": sum(p.numel() for p in params),
            "weight_bytes_per_param": wb / n_params, "load_rss_bytes_per_param": (r_load - r0) * 2**20 / n_params,
            "step_peak_rss_mib": peak, "rss_before_load_mib": r0, "rss_after_load_mib": r_load, "file_rss_after_load_mib": file_load, "loss": float(loss)}


def bf16_checkpoint(model_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    m.save_pretrained(model_dir)


def main() -> None:
    if len(sys.argv) == 3:
        print(json.dumps(run_mode(sys.argv[1], sys.argv[2])))
        return
    from clawloop.tinymodel.build import build_random_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_random_model(Path(tmp) / "m", layers=LAYERS, hidden=HIDDEN))
        bf16_checkpoint(model_dir)  # as real checkpoints ship
        rows = []
        for mode in ("bf16", "nf4"):
            out = subprocess.run([sys.executable, __file__, model_dir, mode], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"random Qwen2 {LAYERS} layers x {HIDDEN} hidden, LoRA r={RANK} on all linear layers, seq {SEQ}, "
          f"on {rows[0]['device']} ({'torch allocator' if rows[0]['device'] != 'cpu' else 'process RSS'})")
    for r in rows:
        print(f"{r['mode']:5s} base {r['base_params'] / 1e6:.1f} M params, LoRA {r['lora_params'] / 1e6:.2f} M: "
              f"weights {r['weight_bytes_per_param']:.3f} B/param, load RSS {r['load_rss_bytes_per_param']:.3f} "
              f"B/param, RSS before load {r['rss_before_load_mib']:.0f} MiB, after {r['rss_after_load_mib']:.0f} (file-backed "
              f"{r['file_rss_after_load_mib']:.0f}, anonymous "
              f"{r['rss_after_load_mib'] - r['file_rss_after_load_mib']:.0f}), "
              f"train step peak {r['step_peak_rss_mib']:.0f}")
    a, b = rows
    print(f"nf4 / bf16: weights {b['weight_bytes_per_param'] / a['weight_bytes_per_param']:.3f}, step peak "
          f"{(b['step_peak_rss_mib'] - b['rss_before_load_mib']) / (a['step_peak_rss_mib'] - a['rss_before_load_mib']):.3f}"
          " (the step's peak over the pre-load RSS)")


if __name__ == "__main__":
    main()
