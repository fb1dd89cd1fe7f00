"""clawloop's trainer against TRL's GRPOTrainer: seconds per GRPO step and trained tokens/s, on CPU.

    .venv/bin/pip install -e ".[bench]"        # trl, datasets
    .venv/bin/python bench/train_vs_trl.py [--model DIR | --shape 8x512] [--steps 5] [--reps 2] [--variants full,lora]
    .venv/bin/python bench/train_vs_trl.py --shape 8x512 --profile    # where clawloop's step time goes

`--shape LxH` benches a random Qwen2 of L layers x H wide (the tiny model's
tokenizer, MLP 4H; 4x128 is the tiny model's shape, 8x512 has 32 M parameters),
built into a temporary folder.

One step, on either side: sample `--group` completions for each of `--prompts`
prompts (temperature 1, at most `--max-tokens` tokens), reward each (+1 for a
bare answer, -1 otherwise), normalise the rewards within each group (mean and
std), then one forward/backward over the batch and one AdamW step.

- clawloop: HFEngine generates the whole group concurrently (continuous
  batching), `group_normalize` gives per-token advantages, `Trainer.step`
  trains, and the new weights are published to the engine. All of it is inside
  the timed step, publish included: TRL generates from the live model and needs
  no weight sync, so clawloop pays for its separate serving copy here.
- TRL: `GRPOTrainer.train()` with its own generation (transformers `generate`,
  no vLLM), num_iterations=1, beta=0; a callback times on_step_begin →
  on_step_end, which spans generation, reward, loss, backward and optimizer step.

Same model, prompts (in the same order; checked), batch, group size,
completion length, float32, learning rate, Adam betas, PPO clip (0.2 / 0.28),
grad clip and torch threads on both. TRL's speed-costly defaults that clawloop
does not have are turned off (gradient checkpointing, bf16 autocast), so the
comparison does not flatter clawloop. Each repetition builds both sides fresh,
takes one untimed warm-up step on each, then `--steps` timed steps; which side
goes first alternates between repetitions so drift on a shared machine hits both.

Trained tokens = completion tokens in the batch (the eos included); tokens/s =
their sum over the sum of step times. "train" is the step without generation
(and without clawloop's publish): reward, loss, forward, backward, optimizer.
A round is one repetition of one variant, both sides; the ratio quoted is the
median over rounds of (clawloop tokens/s) / (TRL tokens/s), since on a shared
machine neighbouring runs compare better than pooled ones. Prints a table,
then one JSON line.

`--profile` runs the clawloop side only and splits its step into generate,
forward, log_softmax + gather, loss, backward, clip + AdamW, the trainer's
other Python, and publish (wall time per phase, wrappers around each call).

Differences that remain: the completions are sampled, so the two sides train on
different tokens (equal in number only when every completion runs to the
limit); TRL's step also computes entropies and metrics for its logs; clawloop
checks its rollouts against the engine's logprobs (truncated IS), TRL without
vLLM has none to check. OpenMP waits passively on both sides (see below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# Before torch loads libgomp. Spinning OpenMP workers make 2-thread torch on a
# busy machine erratic (a forward pass from 6 ms to seconds), and unevenly so:
# libgomp stops spinning when a process holds more OpenMP threads than CPUs,
# which the clawloop side does (its engine thread has its own team) and TRL
# does not. Passive waiting is the same rule for both sides.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SIDES = ("clawloop", "trl")


@dataclass
class Timing:
    """Timed (non warm-up) steps of one side of one variant, all repetitions."""

    step_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """Trained (completion) tokens per step."""
    generate_s: list[float] = field(default_factory=list)
    """The generation part of each step (clawloop: engine; TRL: `_generate_single_turn`)."""
    publish_s: list[float] = field(default_factory=list)
    """clawloop only: handing the new weights to the engine (TRL generates from the trained model)."""
    reward_mean: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)
    """tokens/s of each repetition (round)."""

    def train_s(self) -> list[float]:
        """Per step: the step without generation and publish."""
        pub = self.publish_s or [0.0] * len(self.step_s)
        if len(self.generate_s) != len(self.step_s):
            return []
        return [s - g - p for s, g, p in zip(self.step_s, self.generate_s, pub)]

    def summary(self) -> dict[str, float | None]:
        total = sum(self.step_s)
        return {
            "steps": len(self.step_s),
            "s_per_step_median": statistics.median(self.step_s),
            "s_per_step_mean": total / len(self.step_s),
            "tokens_per_step": sum(self.tokens) / len(self.tokens),
            "tokens_per_s": sum(self.tokens) / total,
            "generate_s_median": statistics.median(self.generate_s) if self.generate_s else None,
            "publish_s_median": statistics.median(self.publish_s) if self.publish_s else None,
            "train_s_median": statistics.median(self.train_s()) if self.train_s() else None,
            "train_tokens_per_s": sum(self.tokens) / sum(self.train_s()) if self.train_s() else None,
            "reward_mean": sum(self.reward_mean) / len(self.reward_mean),
        }


def reward_bare(text: str) -> float:
    """+1 when the reply is only the answer (`bare` style), else -1: the same on both sides."""
    from clawloop.tinymodel.corpus import fits_style

    return 1.0 if fits_style(text, "bare") else -1.0


def make_questions(n: int, seed: int) -> list[str]:
    from clawloop.tinymodel.corpus import heldout_questions

    return [q["question"] for q in heldout_questions(n, seed=seed)]


# ---------------------------------------------------------------- clawloop


async def capture_group(engine, prompt_ids: list[int], n: int, max_tokens: int,
                        seed: int) -> list[tuple[list[int], list[float], int]]:
    """`n` completions of one prompt, concurrently: (response ids, engine logprobs, policy version) each."""
    from clawloop.engines.base import GenerationRequest, SamplingParams

    async def one(i: int):
        ids, lps, version = [], [], 0
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed + i)
        async for ev in engine.generate(GenerationRequest(prompt_ids, params)):
            if ev.token_id is not None:
                ids.append(ev.token_id)
                lps.append(ev.logprob)
            version = ev.policy_version
        return ids, lps, version

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def build_samples(prompt_ids: list[list[int]], completions, rewards: list[float], group_ids: list[int]):
    """GRPO samples: the group-normalised reward on every response token, 0 on the prompt."""
    from clawloop.losses.advantages import group_normalize
    from clawloop.records import Sample

    adv, _ = group_normalize(torch.tensor(rewards), group_ids, std_normalize=True)  # (B,)
    samples = []
    for (ids, lps, version), g, a in zip(completions, group_ids, adv.tolist()):
        p = prompt_ids[g]
        samples.append(Sample(tokens=p + ids, loss_mask=[0] * len(p) + [1] * len(ids),
                              rollout_logprobs=[0.0] * len(p) + lps, prompt_len=len(p),
                              reward=None, advantages=[0.0] * len(p) + [a] * len(ids),
                              policy_version=version, group_id=str(g)))
    return samples


@contextlib.contextmanager
def time_phases(trainer, phases: dict[str, float]):
    """Wrap the trainer's model forward, logprob taking, loss, backward and optimizer step so that each
    adds its wall time to `phases` (the bench's --profile; the wrappers cost microseconds a call).
    The module and class level wrappers are taken off again on exit."""
    import clawloop.trainer.core as core

    undo = [(core, "token_logprobs", core.token_logprobs), (torch.Tensor, "backward", torch.Tensor.backward)]

    def wrap(obj, name: str, key: str) -> None:
        f = getattr(obj, name)

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)

    wrap(trainer.model, "forward", "forward")
    wrap(core, "token_logprobs", "forward + logprobs")  # minus forward: log_softmax + gather
    wrap(trainer, "_tensorize", "tensorize (pad)")
    wrap(trainer, "_set_old", "old lp, TIS, advantages")
    wrap(trainer, "_loss", "loss + entropy metric")
    wrap(torch.Tensor, "backward", "backward")
    wrap(trainer, "_optimizer_step", "clip + AdamW")
    try:
        yield
    finally:
        for obj, name, f in undo:
            setattr(obj, name, f)


async def clawloop_run(model: str, questions: list[list[str]], a: argparse.Namespace, lora: bool,
                       tmp: str, phases: dict[str, float] | None = None) -> Timing:
    """One repetition: fresh engine and trainer, a warm-up step, then `len(questions) - 1` timed steps.
    With `phases`, the timed steps' trainer phases are added up there (--profile)."""
    from clawloop.config import load_config
    from clawloop.engines.hf import HFEngine
    from clawloop.gateway.render import render_prompt
    from clawloop.trainer.core import Trainer

    cfg = load_config({"model__path": model, "data_dir": tmp, "train__method": "binary",
                       "train__use_lora": str(lora).lower(), "train__lora_rank": str(a.lora_rank),
                       "train__lora_alpha": str(2 * a.lora_rank), "train__lr": str(a.lr),
                       "train__seed": str(a.seed)}, env={})
    engine = HFEngine(model, device="cpu", dtype="float32", max_batch_size=max(32, a.prompts * a.group),
                      threads=a.threads)
    trainer = Trainer(cfg, model, tokenizer=engine.tokenizer)
    tok = engine.tokenizer
    inner: dict[str, float] = {}
    timing = Timing()
    await engine.start()
    profiling = contextlib.ExitStack()
    try:
        if phases is not None:
            profiling.enter_context(time_phases(trainer, inner))
        for step, qs in enumerate(questions):
            t0 = time.perf_counter()
            # render → capture → judge → build samples → train step → publish; TRL also tokenizes in its step
            prompt_ids = [render_prompt(tok, [{"role": "user", "content": q}], None) for q in qs]
            groups = await asyncio.gather(*(capture_group(engine, p, a.group, a.max_tokens,
                                                          seed=a.seed * 1_000_003 + step * 1000 + 100 * g)
                                            for g, p in enumerate(prompt_ids)))
            t_gen = time.perf_counter()
            completions = [c for grp in groups for c in grp]
            group_ids = [g for g in range(len(prompt_ids)) for _ in range(a.group)]
            rewards = [reward_bare(tok.decode(ids, skip_special_tokens=True)) for ids, _, _ in completions]
            samples = build_samples(prompt_ids, completions, rewards, group_ids)
            t_step = time.perf_counter()
            trainer.step(samples, served_version=engine.policy_version)
            t_pub = time.perf_counter()
            await engine.publish(trainer.served_state_dict(), trainer.version)
            dt = time.perf_counter() - t0
            if step == 0:
                inner.clear()
                continue  # warm-up
            if phases is not None:
                for k, v in {"generate": t_gen - t0, "reward + samples": t_step - t_gen,
                             "trainer.step": t_pub - t_step, "publish": t0 + dt - t_pub, "step": dt}.items():
                    phases[k] = phases.get(k, 0.0) + v
            timing.step_s.append(dt)
            timing.generate_s.append(t_gen - t0)
            timing.publish_s.append(t0 + dt - t_pub)
            timing.tokens.append(sum(len(ids) for ids, _, _ in completions))
            timing.reward_mean.append(sum(rewards) / len(rewards))
        if engine.policy_version != len(questions):
            raise RuntimeError(f"served policy version {engine.policy_version} after {len(questions)} steps")
    finally:
        profiling.close()
        await engine.stop()
    if phases is not None:
        inner["log_softmax + gather"] = inner.pop("forward + logprobs", 0.0) - inner.get("forward", 0.0)
        inner["trainer: other Python"] = phases["trainer.step"] - sum(inner.values())
        for k, v in inner.items():
            phases[k] = phases.get(k, 0.0) + v
        phases["steps"] = phases.get("steps", 0) + len(timing.step_s)
    return timing


# ---------------------------------------------------------------- TRL


def trl_run(model: str, questions: list[list[str]], a: argparse.Namespace, lora: bool, tmp: str,
            target_modules: list[str]) -> Timing:
    """One repetition: a fresh GRPOTrainer, a warm-up step, then `len(questions) - 1` timed steps."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    timing = Timing()
    seen: list[tuple[list[str], int, float]] = []  # per step: prompts, completion tokens, mean reward

    def bare_answer(prompts, completions, completion_ids, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [reward_bare(t) for t in texts]
        seen.append(([p[-1]["content"] for p in prompts], sum(len(c) for c in completion_ids),
                     sum(rewards) / len(rewards)))
        return rewards

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0 = 0.0
            self.step_s: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.step_s.append(time.perf_counter() - self.t0)

    # TRL turns checkpointing on by default; transformers 5 renamed the knob.
    no_ckpt = ({"activation_checkpointing": False} if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
               else {"gradient_checkpointing": False})
    config = GRPOConfig(
        output_dir=tmp, use_cpu=True, bf16=False, **no_ckpt, seed=a.seed,
        per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=a.max_tokens, temperature=1.0,
        num_iterations=1, beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2, epsilon_high=0.28,
        learning_rate=a.lr, lr_scheduler_type="constant", weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.98,
        max_grad_norm=1.0, max_steps=len(questions), shuffle_dataset=False,
        report_to="none", save_strategy="no", logging_steps=10_000, disable_tqdm=True,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                                 target_modules=target_modules, task_type="CAUSAL_LM")
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for qs in questions for q in qs])
    timer = StepTimer()
    trainer = GRPOTrainer(model=policy, reward_funcs=bare_answer, args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=peft_config, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # it prints the final train metrics as a dict
    gen_s: list[float] = []
    generate = getattr(trainer, "_generate_single_turn", None)
    if generate is not None:  # a private method: time it when this TRL version has it
        def timed_generate(*args, **kw):
            t = time.perf_counter()
            try:
                return generate(*args, **kw)
            finally:
                gen_s.append(time.perf_counter() - t)

        trainer._generate_single_turn = timed_generate
    trainer.train()

    if len(timer.step_s) != len(questions) or len(seen) != len(questions):
        raise RuntimeError(f"TRL took {len(timer.step_s)} steps and {len(seen)} generations, "
                           f"expected {len(questions)} of each")
    for step, (qs, _, _) in enumerate(seen):
        want = [q for q in questions[step] for _ in range(a.group)]
        if qs != want:
            raise RuntimeError(f"TRL step {step} trained on other prompts than clawloop: {qs} != {want}")
    timing.step_s = timer.step_s[1:]
    timing.tokens = [n for _, n, _ in seen[1:]]
    timing.reward_mean = [r for _, _, r in seen[1:]]
    timing.generate_s = gen_s[1:] if len(gen_s) == len(questions) else []
    del trainer, policy
    gc.collect()
    return timing


# ---------------------------------------------------------------- driver


def run_side(side: str, model: str, questions: list[list[str]], a: argparse.Namespace, lora: bool,
             target_modules: list[str]) -> Timing:
    with tempfile.TemporaryDirectory(prefix=f"clawloop-bench-{side}-") as tmp:
        if side == "clawloop":
            return asyncio.run(clawloop_run(model, questions, a, lora, tmp))
        return trl_run(model, questions, a, lora, tmp, target_modules)


def _rounded(x):
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def report(results: dict[str, dict[str, Timing]], a: argparse.Namespace, model: str,
           load: tuple[float, float]) -> list[dict]:
    """Print the table; return one row per variant for the JSON line."""
    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(f"\nGRPO step on CPU, {a.threads} torch threads, load average {load[0]:.1f} -> {load[1]:.1f}; "
          f"{a.prompts} prompts x group {a.group}, <= {a.max_tokens} completion tokens; "
          f"{a.steps} timed steps x {a.reps} reps per side; model {model}")
    print(f"{'variant':<8} {'side':<9} {'s/step p50':>10} {'s/step mean':>11} {'gen s p50':>9} {'pub s p50':>9} "
          f"{'train s p50':>11} {'tok/step':>8} {'tok/s':>8} {'train tok/s':>11} {'reward':>7}")
    rows = []
    for v, by_side in results.items():
        s = {side: by_side[side].summary() for side in SIDES}
        for side in SIDES:
            x = s[side]
            print(f"{v:<8} {side:<9} {x['s_per_step_median']:>10.3f} {x['s_per_step_mean']:>11.3f} "
                  f"{cell(x['generate_s_median']):>9} {cell(x['publish_s_median']):>9} "
                  f"{cell(x['train_s_median']):>11} {x['tokens_per_step']:>8.1f} {x['tokens_per_s']:>8.1f} "
                  f"{cell(x['train_tokens_per_s']):>11} {x['reward_mean']:>7.2f}")
        rounds = [c / t for c, t in zip(by_side["clawloop"].rounds, by_side["trl"].rounds)]
        train = (s["clawloop"]["train_tokens_per_s"] / s["trl"]["train_tokens_per_s"]
                 if s["trl"]["train_tokens_per_s"] else None)
        row = {"variant": v, "clawloop": s["clawloop"], "trl": s["trl"],
               "tokens_per_s_ratio": s["clawloop"]["tokens_per_s"] / s["trl"]["tokens_per_s"],
               "tokens_per_s_ratio_rounds": rounds, "tokens_per_s_ratio_median": statistics.median(rounds),
               "train_tokens_per_s_ratio": train,
               "s_per_step_ratio": s["trl"]["s_per_step_median"] / s["clawloop"]["s_per_step_median"]}
        rows.append(row)
        print(f"{v:<8} {'ratio':<9} {row['s_per_step_ratio']:>9.2f}x {'':>11} {'':>9} {'':>9} {'':>11} {'':>8} "
              f"{row['tokens_per_s_ratio']:>7.2f}x {'-' if train is None else f'{train:.2f}x':>11}   "
              f"clawloop / TRL; median over rounds {row['tokens_per_s_ratio_median']:.2f}x "
              f"({', '.join(f'{r:.2f}' for r in rounds)}; goal >= 2x)")
    return rows


def report_profile(phases: dict[str, dict[str, float]]) -> None:
    """--profile: clawloop's step, phase by phase, ms per step and share of the step."""
    order = ["generate", "reward + samples", "trainer.step", "tensorize (pad)", "forward", "log_softmax + gather",
             "old lp, TIS, advantages", "loss + entropy metric", "backward", "clip + AdamW", "trainer: other Python",
             "publish"]
    for v, p in phases.items():
        n, step = p["steps"], p["step"]
        print(f"\nclawloop {v}: {1e3 * step / n:.1f} ms per step ({n:.0f} timed steps)")
        for k in order:
            inside = k not in ("generate", "reward + samples", "trainer.step", "publish")
            print(f"  {'  ' if inside else ''}{k:<{26 if inside else 28}} {1e3 * p.get(k, 0.0) / n:8.1f} ms "
                  f"{100 * p.get(k, 0.0) / step:6.1f} %")


def random_model(shape: str, seed: int, tmp: str) -> str:
    """A random Qwen2 of `shape` (LxH: layers x hidden) in `tmp`."""
    from clawloop.tinymodel.build import build_random_model

    try:
        layers, hidden = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape: expected LAYERSxHIDDEN like 8x512, got {shape!r}") from None
    return str(build_random_model(Path(tmp) / f"random-{layers}x{hidden}", layers=layers, hidden=hidden, seed=seed))


def resolve_model(path: str) -> str:
    if path:
        if not Path(path).exists():
            raise SystemExit(f"--model {path}: no such folder")
        return path
    from clawloop.tinymodel.build import build_tiny_model, default_model_dir

    path = str(default_model_dir())
    if not Path(path).exists():
        print(f"building the tiny model into {path} (a few minutes; or pass --model DIR)", flush=True)
        build_tiny_model()
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="HF model dir (default: the tiny model, built if missing)")
    ap.add_argument("--shape", default="", help="LAYERSxHIDDEN: a random Qwen2 of that shape instead of --model")
    ap.add_argument("--profile", action="store_true", help="clawloop only: where its step time goes")
    ap.add_argument("--prompts", type=int, default=2, help="distinct prompts per step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt (GRPO group size)")
    ap.add_argument("--max-tokens", type=int, default=16, help="longest completion")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side per repetition (after one warm-up)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions per variant; the side going first alternates")
    ap.add_argument("--variants", default="full,lora", help="comma-separated: full, lora")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--lora-rank", type=int, default=16, help="LoRA rank; alpha = 2 x rank on both sides")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if any(v not in ("full", "lora") for v in variants) or not variants:
        ap.error(f"--variants: expected full and/or lora, got {a.variants!r}")
    if a.model and a.shape:
        ap.error("--model and --shape: one or the other")
    with tempfile.TemporaryDirectory(prefix="clawloop-bench-model-") as tmp:
        return bench(a, variants, random_model(a.shape, a.seed, tmp) if a.shape else "")


def bench(a: argparse.Namespace, variants: list[str], model: str) -> int:
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as e:
        raise SystemExit(f"{e.name} is missing: pip install -e '.[bench]' (trl, datasets)") from None

    import transformers

    from clawloop.config import TrainConfig

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices from inside TRL/transformers
    torch.set_num_threads(a.threads)
    model = model or resolve_model(a.model)
    label = f"random {a.shape} ({model})" if a.shape else model
    target_modules = list(TrainConfig().lora_target_modules)
    n_steps = 1 + a.steps  # warm-up + timed
    flat = make_questions(a.reps * len(variants) * n_steps * a.prompts, a.seed)

    if a.profile:
        phases: dict[str, dict[str, float]] = {}
        for i, v in enumerate(variants):
            qs = flat[i * n_steps * a.prompts:(i + 1) * n_steps * a.prompts]
            questions = [qs[j * a.prompts:(j + 1) * a.prompts] for j in range(n_steps)]
            phases[v] = {}
            for _ in range(a.reps):
                with tempfile.TemporaryDirectory(prefix="clawloop-bench-clawloop-") as tmp:
                    asyncio.run(clawloop_run(model, questions, a, v == "lora", tmp, phases[v]))
        print(f"\nmodel {label}; {a.prompts} prompts x group {a.group}, <= {a.max_tokens} completion tokens; "
              f"{a.threads} torch threads")
        report_profile(phases)
        return 0

    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, Timing]] = {v: {s: Timing() for s in SIDES} for v in variants}
    block = 0
    for v in variants:
        for rep in range(a.reps):
            # The same prompts for both sides within a repetition; new ones each repetition.
            qs = flat[block * n_steps * a.prompts:(block + 1) * n_steps * a.prompts]
            questions = [qs[i * a.prompts:(i + 1) * a.prompts] for i in range(n_steps)]
            block += 1
            order = SIDES if rep % 2 == 0 else SIDES[::-1]
            for side in order:
                t = run_side(side, model, questions, a, v == "lora", target_modules)
                r = results[v][side]
                r.step_s += t.step_s
                r.tokens += t.tokens
                r.generate_s += t.generate_s
                r.publish_s += t.publish_s
                r.reward_mean += t.reward_mean
                r.rounds.append(sum(t.tokens) / sum(t.step_s))
                print(f"  {v:<4} rep {rep} {side:<8} s/step {statistics.median(t.step_s):.3f}  "
                      f"tokens/step {sum(t.tokens) / len(t.tokens):.1f}", flush=True)

    load_after = os.getloadavg()[0]
    rows = report(results, a, label, (load_before, load_after))
    print(json.dumps({"bench": "train_vs_trl", "model": label, "trl": trl.__version__,
                      "transformers": transformers.__version__, "torch": torch.__version__,
                      "threads": a.threads, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "cpus": os.cpu_count(),
                      "loadavg_1m": [round(load_before, 2), round(load_after, 2)], "prompts": a.prompts,
                      "group": a.group, "max_tokens": a.max_tokens, "steps": a.steps, "reps": a.reps,
                      "results": [_rounded(r) for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
