"""Build the embedded tiny chat model: no download, a few minutes on CPU.

    python -m clawloop.tinymodel.build [--out DIR] [--seed 0] [--steps N] [--force] [--if-missing]
    clawloop tiny-model ...                      # the same

Steps: train the tokenizer on the synthetic corpus (cached), initialise a
small Qwen2 (tied embeddings), pre-train it on freshly generated conversations
with the loss on assistant tokens only, evaluate it greedily on held-out
questions, and write it atomically (temp dir + rename) in Hugging Face format
with a `build_info.json`. Seeded: the same seed gives the same data, init and
batch order (bitwise equality also needs the same torch build and threads).

`build_random_model` makes the same kind of folder with random weights in
about a second, for tests.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from clawloop.tinymodel import corpus
from clawloop.tinymodel.tokenizer import (IM_END, PAD, PAUSE, VOCAB_SIZE, render_chat, save_tokenizer,
                                          train_tokenizer, wrap_tokenizer)

MODEL_NAME = "tiny-chat-v1"
TOKENIZER_CORPUS = 20_000
"""Conversations the BPE is trained on (corpus seed 0; every tiny model shares the tokenizer)."""


@dataclass
class TinyModelArgs:
    """The recipe of the tiny model. Defaults are what `clawloop tiny-model` builds."""

    layers: int = 4
    """Transformer blocks."""
    hidden: int = 128
    """Residual width; heads are 32 wide."""
    intermediate: int = 512
    """MLP width."""
    arith_steps: int = 0
    """Optional warm-up: steps on bare one-question arithmetic before the mixed corpus.
    (It finds the carry circuit early, but the mixed phase then wipes most of it out and
    the warm-up's high-LR steps are lost to facts and styles: measured 51 % addition,
    20 % facts vs 68 % / 84 % with the final phase instead.)"""
    steps: int = 1600
    """Optimizer steps on the mixed corpus; one fresh batch of generated conversations each."""
    batch_size: int = 64
    """Conversations per step."""
    arith_replay: int = 16
    """Arithmetic conversations (random styles) beside every mixed batch."""
    replay_weight: float = 0.5
    """Weight of the replay's own token-mean loss beside the mixed conversations' one.
    (Pooled into one token mean, the replay's few tokens are ~3 % of the loss.)"""
    final_steps: int = 800
    """Final phase: batches of arithmetic in random styles (plain random order), each with
    `final_mixed` mixed conversations beside them. Arithmetic is learnt last, while the
    mixed rows keep styles and facts from fading."""
    final_mixed: int = 16
    """Mixed conversations per final-phase batch (their own token-mean loss, × `final_weight`)."""
    final_weight: float = 1.0
    """Weight of the mixed rows' loss in the final phase."""
    final_tool_rows: int = 6
    """Calculator conversations added to the side rows of every final-phase batch (the call
    copies the question's operands). Copying is learnt last too: with tool use only in the
    mixed corpus the model made the exact call 5 % of the time (issue #27 item 5)."""
    final_bare: float = 0.0
    """Share of the final phase's arithmetic asked for a bare answer by an instruction (on top of
    the bare answers among the unprompted styles): a small model computes worst when the digits
    come first (bench/bare_form_skill.py: 0.46 bare against 0.92 after "The answer is")."""
    final_facts: float = 0.0
    """Share of the final phase's rows that are fact questions (asked and answered as its arithmetic is,
    `final_bare` of them asked for a bare answer): the bare form is where facts are weakest too."""
    pauses: int = 0
    """`PAUSE` tokens after every assistant header of the chat template: positions the model computes in
    before its answer's first token. Without them the bare form is where it computes worst (the digits
    come first; bench/bare_form_skill.py: 0.46-0.69 right against 0.92-0.96 after "The answer is")."""
    structured: bool = True
    """Short-JSON replies and calls to unseen tools in the mixed corpus (`corpus.generate_corpus`'s
    `structured`); False builds on the corpus as it was before them (the 2026-11-23 recipe)."""
    long_every: int = 0
    """Every this many steps (0: never), one conversation behind a long agent-style system prompt
    and tool list (`corpus.generate_long_context_corpus`, up to ~30 k tokens) beside the batch, its
    own token-mean loss × `long_weight`: OpenClaw sends ~29 k tokens before the user's message, and
    a model trained on short prompts answers fragments there. Cheap on a GPU, hours on 2 CPU cores."""
    long_weight: float = 0.5
    """Weight of a long-prompt row's loss."""
    long_max_chars: int = 120_000
    """Longest long prompt, in characters (~4 per token): 120 000 is OpenClaw's ~29 k tokens; on a CPU
    a row that long takes ~15 s a step, so a CPU build caps it lower."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10 %)."""
    warmup: int = 60
    """Warm-up steps."""
    weight_decay: float = 0.01
    """AdamW weight decay on matrices (not on norms and biases)."""
    bf16: bool = True
    """bf16 autocast for the forward pass (fp32 master weights; ~1.3x faster on CPUs with bf16 support)."""
    eval_questions: int = 800
    """Held-out questions in the final evaluation."""
    init_from: str = ""
    """A built tiny model's folder to start from instead of random weights (same tokenizer): with
    `steps 0` a short final phase on top of it, e.g. more bare-form arithmetic for a model already built."""


def cache_dir() -> Path:
    """Where built models and the tokenizer are cached: $CLAWLOOP_CACHE or ~/.cache/clawloop."""
    return Path(os.environ.get("CLAWLOOP_CACHE") or Path.home() / ".cache" / "clawloop")


SHIPPED_DIR = Path(__file__).resolve().parent / MODEL_NAME
"""The default model as shipped with the package (built by `clawloop tiny-model`, weights + tokenizer +
build_info.json with each file's sha256), so the first start trains nothing."""


def default_model_dir() -> Path:
    """The tiny model to serve: one you built (`clawloop tiny-model` writes to the cache) wins over
    the shipped copy; with neither, the cache folder (where a build goes)."""
    built = cache_dir() / MODEL_NAME
    if _is_built(built) or not _is_built(SHIPPED_DIR):
        return built
    return SHIPPED_DIR


def file_checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file of a model folder but build_info.json (what build_info records)."""
    out = {}
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and f.name != "build_info.json":
            out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


# ---------------------------------------------------------------- tokenizer


def _tokenizer_key() -> str:
    """Changes whenever the corpus or tokenizer code changes, so a stale cache is never used."""
    h = hashlib.sha256(str(VOCAB_SIZE).encode())
    for mod in ("corpus.py", "tokenizer.py"):
        h.update((Path(__file__).parent / mod).read_bytes())
    return h.hexdigest()[:12]


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    path = cache_dir() / f"tokenizer-{_tokenizer_key()}.json"
    if path.exists():
        return path.read_text()
    # Without the short-JSON kinds: they came later, and the tokenizer (shipped, and shared by every
    # tiny model and the tests' random ones) stays the one trained before them.
    texts = (render_chat(c["messages"], c.get("tools"))
             for c in corpus.generate_corpus(TOKENIZER_CORPUS, seed=0, structured=False))
    text = train_tokenizer(texts).to_str()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return text


def load_tokenizer(pauses: int = 0):
    """The tiny model's tokenizer (a transformers fast tokenizer with the chat template), cached; with
    `pauses`, the template puts that many `PAUSE` tokens after each assistant header."""
    from tokenizers import Tokenizer

    return wrap_tokenizer(Tokenizer.from_str(_tokenizer_json()), pauses)


# ---------------------------------------------------------------- model


def _config(tok, layers: int, hidden: int, intermediate: int):
    from transformers import Qwen2Config

    heads = max(1, hidden // 32)
    return Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=2048,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def _save(model, tok, out: Path, info: dict[str, Any] | None = None) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None)
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tok, out)
    # Keys older transformers (and so older vLLM) read, beside 5.x's rope_parameters/dtype.
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("torch_dtype", "float32")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if info is not None:
        info = {**info, "files": file_checksums(out)}
        (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")


def _write_atomically(out: Path, write: Callable[[Path], None], force: bool) -> Path:
    """`write(tmp)` into a temp dir beside `out`, then rename it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}"
    try:
        write(tmp)
        if out.exists():
            if not force:  # someone else finished first: theirs is as good as ours
                return out
            old = out.parent / f".{out.name}.old-{os.getpid()}-{time.time_ns()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_random_model(out: str | Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """The tiny model's tokenizer with a randomly initialised Qwen2, saved in HF format (about a second)."""
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out)
    tok = load_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config(tok, layers, hidden, 4 * hidden))
    info = {"name": "random", "params": sum(p.numel() for p in model.parameters()), "seed": seed}
    return _write_atomically(out, lambda d: _save(model, tok, d, info), force=True)


# ---------------------------------------------------------------- data

_ASSISTANT = re.compile(re.escape("<|im_start|>assistant\n") + "(?:" + re.escape(PAUSE) + r")*(.*?"
                        + re.escape(IM_END) + ")", re.S)


def encode_conversations(tok, conversations: list[dict[str, Any]],
                         processes: int = 1) -> list[tuple[list[int], list[int]]]:
    """(input ids, loss mask) per conversation; the mask is 1 on assistant tokens
    (content, tool calls and the closing <|im_end|>) and 0 on everything else.
    `processes` > 1 encodes chunks in forked worker processes (a GPU build's data)."""
    if processes > 1 and len(conversations) > 10_000:
        import multiprocessing as mp

        global _FORK_TOK
        _FORK_TOK = tok
        chunk = -(-len(conversations) // (processes * 4))
        pieces = [conversations[i:i + chunk] for i in range(0, len(conversations), chunk)]
        with mp.get_context("fork").Pool(processes) as pool:
            return [row for part in pool.map(_encode_forked, pieces) for row in part]
    texts = [render_chat(c["messages"], c.get("tools"), template=tok.chat_template) for c in conversations]
    out = []
    for text, e in zip(texts, tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)):
        spans = [m.span(1) for m in _ASSISTANT.finditer(text)]
        mask = [int(any(s <= a and b <= e for s, e in spans)) for a, b in e.offsets]
        out.append((e.ids, mask))
    return out


_FORK_TOK = None


def _encode_forked(conversations: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    return encode_conversations(_FORK_TOK, conversations)


def _batches(lengths: list[int], batch_size: int, rng: random.Random, bucket: int) -> list[list[int]]:
    """Batches in a seeded random order; within each window of `bucket` batches the
    conversations are sorted by length (less padding). Keep windows small: a batch
    of same-length arithmetic is a batch of one template and one digit count,
    and on such batches the model does not learn addition at all (measured:
    0 % after 1000 steps of bucket-32 batches vs 87 % with random ones).
    `bucket=1` gives plain random batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * bucket
    batches = []
    for i in range(0, len(order), chunk):
        group = sorted(order[i:i + chunk], key=lambda j: lengths[j]) if bucket > 1 else order[i:i + chunk]
        batches += [group[k:k + batch_size] for k in range(0, len(group), batch_size)]
    rng.shuffle(batches)
    return batches


# ---------------------------------------------------------------- train


def _lr_at(step: int, args: TinyModelArgs, total: int | None = None) -> float:
    """Linear warm-up, then one cosine decay to 10 % over all phases. (Restarting
    it for the mixed phase follows style instructions better but forgets addition:
    measured 0 % vs 38 % with the same replay.)"""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    total = total if total is not None else args.arith_steps + args.steps + args.final_steps
    p = (step - args.warmup) / max(1, total - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _conversations(args: TinyModelArgs, seed: int) -> tuple[list[dict[str, Any]], dict[str, range]]:
    """Every conversation the build trains on, and where each part of it lies."""
    B = args.batch_size
    convs: list[dict[str, Any]] = []
    parts: dict[str, range] = {}
    for name, items in (
            ("warm", corpus.generate_arithmetic_corpus(args.arith_steps * B, seed=seed + 1)),
            ("replay", corpus.generate_arithmetic_corpus(args.steps * args.arith_replay, seed=seed + 1, styled=True)),
            ("mixed", corpus.generate_corpus(args.steps * B + args.final_steps * args.final_mixed, seed=seed + 1,
                                             structured=args.structured)),
            ("final", corpus.generate_arithmetic_corpus(args.final_steps * B, seed=seed + 2, styled=True,
                                                        instructed_bare=args.final_bare, facts=args.final_facts)),
            ("calc", corpus.generate_calculator_corpus(args.final_steps * args.final_tool_rows, seed=seed + 3)),
            ("long", corpus.generate_long_context_corpus(
                (args.arith_steps + args.steps + args.final_steps) // args.long_every if args.long_every else 0,
                seed=seed + 4, max_chars=args.long_max_chars))):
        parts[name] = range(len(convs), len(convs) + len(items))
        convs.extend(items)
    return convs, parts


def _plan(args: TinyModelArgs, seed: int, parts: dict[str, range],
          lengths: list[int]) -> list[tuple[list[int], list[int], float]]:
    """Per step: (main rows, side rows, weight of the side rows' own token-mean loss); every
    `long_every`-th step also a long-prompt row (`_long_rows`).

    1. warm-up: `arith_steps` batches of bare arithmetic, plain random order;
    2. mixed: `steps` length-bucketed batches of the mixed corpus, each with
       `arith_replay` styled arithmetic rows beside it (weight `replay_weight`);
    3. final: `final_steps` batches of styled arithmetic, plain random order, each
       with `final_mixed` mixed rows and `final_tool_rows` calculator conversations
       beside it (weight `final_weight`).
    """
    rng = random.Random(f"batches-{seed}")
    B = args.batch_size
    warm, replay, mixed, final, calc = (parts[k] for k in ("warm", "replay", "mixed", "final", "calc"))
    # (_long_rows reads the "long" part by step index; it is not in these tuples)
    plan: list[tuple[list[int], list[int], float]] = []
    for b in _batches([1] * len(warm), B, rng, bucket=1)[:args.arith_steps]:
        plan.append(([warm[i] for i in b], [], 0.0))
    n_mixed = args.steps * B
    for k, b in enumerate(_batches([lengths[mixed[i]] for i in range(n_mixed)], B, rng, bucket=32)[:args.steps]):
        plan.append(([mixed[i] for i in b], list(replay[k * args.arith_replay:(k + 1) * args.arith_replay]),
                     args.replay_weight))
    for k, b in enumerate(_batches([1] * len(final), B, rng, bucket=1)[:args.final_steps]):
        side = list(mixed[n_mixed + k * args.final_mixed:n_mixed + (k + 1) * args.final_mixed])
        side += calc[k * args.final_tool_rows:(k + 1) * args.final_tool_rows]
        plan.append(([final[i] for i in b], side, args.final_weight))
    return plan


def _long_rows(args: TinyModelArgs, parts: dict[str, range], n_steps: int) -> dict[int, int]:
    """Step index -> the long-prompt conversation beside it (every `long_every`-th step)."""
    if not args.long_every:
        return {}
    steps = range(args.long_every - 1, n_steps, args.long_every)
    return {step: parts["long"][k] for k, step in enumerate(steps) if k < len(parts["long"])}


def _fit_plan(plan: list, done: int, per_step: float, budget_s: float) -> list:
    """`plan` thinned, past its first `done` steps, to what fits in `budget_s` more seconds at
    `per_step` seconds a step: steps kept evenly spread so every phase keeps its share."""
    rest = plan[done:]
    fit = max(1, int(budget_s / per_step))
    if fit >= len(rest):
        return plan
    keep = [rest[round(i * (len(rest) - 1) / max(1, fit - 1))] for i in range(fit)] if fit > 1 else rest[-1:]
    return plan[:done] + keep


def pretrain(model, tok, args: TinyModelArgs, seed: int, log: Callable[[str], Any] = print,
             device: str = "cpu", max_train_seconds: float | None = None) -> list[float]:
    """Next-token loss on assistant tokens over the phases of `_plan`, all data fresh.

    `max_train_seconds`: after 50 steps the remaining plan is thinned evenly (every phase keeps
    its share, the lr schedule is recomputed over what is left) so training ends in time."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    t0 = time.perf_counter()
    convs, parts = _conversations(args, seed)
    encoded = encode_conversations(tok, convs, processes=int(os.environ.get("CLAWLOOP_BUILD_PROCS", "1")))
    del convs
    lengths = [len(ids) for ids, _ in encoded]
    plan = _plan(args, seed, parts, lengths)
    longs = _long_rows(args, parts, len(plan))
    plan = [(m, s, w, longs.get(k)) for k, (m, s, w) in enumerate(plan)]
    rows = [np.asarray(ids, dtype=np.int32) for ids, _ in encoded]
    labels_rows = [np.where(np.asarray(m, dtype=bool), r, -100).astype(np.int32) for r, (_, m) in zip(rows, encoded)]
    del encoded
    log(f"data: {len(lengths)} conversations, {sum(lengths)} tokens, longest {max(lengths)} "
        f"({time.perf_counter() - t0:.1f}s)")
    dev = torch.device(device)
    model.to(dev)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            **({"fused": True} if dev.type == "cuda" else {}))
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    def token_mean_loss(rows: list[int]):
        """Mean next-token loss over the assistant tokens of `rows`, padded to their own longest."""
        T = max(lengths[i] for i in rows)
        ids_np = np.full((len(rows), T), tok.pad_token_id, dtype=np.int64)
        labels_np = np.full((len(rows), T), -100, dtype=np.int64)
        for r, i in enumerate(rows):
            ids_np[r, :lengths[i]] = rows_ids[i]
            labels_np[r, :lengths[i]] = labels_rows[i]
        ids = torch.from_numpy(ids_np).to(dev, non_blocking=True)  # (B, T)
        labels = torch.from_numpy(labels_np).to(dev, non_blocking=True)  # (B, T)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=ids).logits  # (B, T, V); right padding needs no mask under causal attention
        return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                               ignore_index=-100)

    from clawloop.progress import Progress

    rows_ids = rows
    bar = Progress(len(plan), "tiny-model training", every_s=30.0)
    step = 0
    while step < len(plan):
        main, side, weight, long_row = plan[step]
        if max_train_seconds and step == 50:
            until = float(os.environ.get("CLAWLOOP_TRAIN_UNTIL") or 0)  # a device lease's end (epoch s)
            if until:
                max_train_seconds = min(max_train_seconds, time.perf_counter() - t0 + until - time.time())
            elapsed = time.perf_counter() - t0
            planned = len(plan)
            plan = _fit_plan(plan, 50, elapsed / 50, max_train_seconds - elapsed)
            if len(plan) < planned:
                log(f"time budget {max_train_seconds:.0f}s: {planned} steps thinned to {len(plan)} "
                    f"({elapsed / 50 * 1000:.0f} ms a step)")
                bar.total = len(plan)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, args, len(plan))
        opt.zero_grad(set_to_none=True)
        # Main and side rows in separate passes (gradients add up): each group is padded only
        # to its own longest row, and the side rows' loss is their own token mean, weighted.
        loss = token_mean_loss(main)
        loss.backward()
        loss = loss.item()
        if side:
            side_loss = weight * token_mean_loss(side)
            side_loss.backward()
            loss += side_loss.item()
        if long_row is not None:
            long_loss = args.long_weight * token_mean_loss([long_row])
            long_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss)
        recent = sum(losses[-100:]) / len(losses[-100:])
        bar.update(1, note=f"loss {recent:.4f}")
        if not bar.tty and ((step + 1) % 100 == 0 or step + 1 == len(plan)):
            log(f"step {step + 1}/{len(plan)}  loss {recent:.4f}  lr {_lr_at(step, args, len(plan)):.2e}  "
                f"{time.perf_counter() - t0:.0f}s")
        step += 1
    bar.close()
    model.eval()
    return losses


# ---------------------------------------------------------------- evaluate


def generate_replies(model, tok, prompts: list[dict[str, Any]], max_new_tokens: int = 32,
                     batch_size: int = 100, sample_seed: int | None = None) -> list[str]:
    """Replies to `{"messages", "tools"?}` prompts, decoded without special tokens:
    greedy, or sampled at temperature 1 (seeded) when `sample_seed` is given."""
    import torch

    sampling: dict[str, Any] = {"do_sample": False}
    if sample_seed is not None:
        sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
        torch.manual_seed(sample_seed)
    texts = [render_chat(p["messages"], p.get("tools"), add_generation_prompt=True, template=tok.chat_template)
             for p in prompts]
    replies: list[str] = []
    tok.padding_side = "left"
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], add_special_tokens=False, padding=True, return_tensors="pt").to(model.device)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id, **sampling)
            new = out[:, enc["input_ids"].shape[1]:]  # (B, new)
            replies += tok.batch_decode(new, skip_special_tokens=True)
    return [r.strip() for r in replies]


def evaluate(model, tok, n: int = 800, seed: int = 0) -> dict[str, Any]:
    """Greedy accuracy on held-out questions.

    - `answer/<skill>`: the reply holds the right answer (any style), over all prompts;
    - `style/<placement>`: the reply fits the asked style, instruction in the system
      message, the user message (prefix or suffix), or a "Hint:";
    - `unprompted/<style>`: share of each style with no instruction, sampled at temperature 1
      (greedy decoding would always pick the same style; `none`: fits no style);
    - `correction`: after an answer in another style and a user correction, the reply fits;
    - `tool_call`: with a calculator tool, the reply is a calculator call with the right expression;
    - `answer/long`, `long_tool_call`: the same behind a long agent-style system prompt and tool list.
    """
    rng = random.Random(f"eval-{seed}")
    questions = corpus.heldout_questions(n, seed=seed)
    conditions = ("none",) + corpus.PLACEMENTS
    prompts, meta = [], []
    for i, q in enumerate(questions):
        cond = conditions[i % len(conditions)]
        style = rng.choice(corpus.STYLES)
        if cond == "none":
            msgs = [{"role": "user", "content": q["question"]}]
        else:
            msgs = corpus.instruct(q["question"], corpus.style_instruction(style, rng), cond)
        prompts.append({"messages": msgs})
        meta.append((q, cond, style))
    for q in questions[:n // 4]:  # corrections
        first = rng.choice(corpus.STYLES)
        wanted = rng.choice([s for s in corpus.STYLES if s != first])
        prompts.append({"messages": [{"role": "user", "content": q["question"]},
                                     {"role": "assistant", "content": corpus.render_answer(q["answer"], first)},
                                     {"role": "user", "content": corpus.correction_for(wanted, rng)}]})
        meta.append((q, "correction", wanted))
    arith = [q for q in questions if q["skill"] != "fact"][:n // 8]
    for q in arith:
        prompts.append({"messages": [{"role": "user", "content": q["question"]}], "tools": [corpus.CALCULATOR_TOOL]})
        meta.append((q, "tool_call", None))

    replies = generate_replies(model, tok, prompts)
    # Behind a long agent-style system prompt and tool list (as OpenClaw sends): the answer, and
    # the calculator call when the calculator is among the tools.
    long_prompts, long_meta = [], []
    for k, q in enumerate(questions[:max(2, n // 16)]):
        system, tools = corpus.long_preamble(rng, int(math.exp(rng.uniform(math.log(1_500), math.log(120_000)))))
        calc = q["skill"] != "fact" and k % 2 == 1
        long_prompts.append({"messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": q["question"]}],
                             "tools": tools + ([corpus.CALCULATOR_TOOL] if calc else [])})
        long_meta.append((q, "long_tool_call" if calc else "long", None))
    prompts += long_prompts
    meta += long_meta
    # One at a time (no padding, so no (T, T) mask), on the CPU: on a GPU, generate's SDPA path
    # allocated a 20 GiB attention matrix for one ~36 k-token prompt (H100, transformers 5.17).
    cpu_model = model if model.device.type == "cpu" else copy.deepcopy(model).to("cpu")
    replies += generate_replies(cpu_model, tok, long_prompts, batch_size=1)
    hits: dict[str, list[bool]] = {}
    unprompted: dict[str, int] = {s: 0 for s in corpus.STYLES + ("none",)}
    plain = [p for p, (_, cond, _) in zip(prompts, meta) if cond == "none"]
    for reply in generate_replies(model, tok, plain, sample_seed=seed):
        unprompted[corpus.classify_style(reply) or "none"] += 1
    for reply, (q, cond, style) in zip(replies, meta):
        if cond in ("tool_call", "long_tool_call"):
            want = json.dumps({"name": "calculator", "arguments": {"expression": q["expression"]}})
            hits.setdefault(cond, []).append(reply.replace("\n", "") == f"<tool_call>{want}</tool_call>")
            continue
        if cond == "long":
            hits.setdefault("answer/long", []).append(corpus.extract_answer(reply) == q["answer"].lower())
            continue
        if cond == "correction":
            hits.setdefault("correction", []).append(corpus.fits_style(reply, style))
            continue
        hits.setdefault(f"answer/{q['skill']}", []).append(corpus.extract_answer(reply) == q["answer"].lower())
        if cond != "none":
            key = "user" if cond in ("prefix", "suffix") else cond
            hits.setdefault(f"style/{key}", []).append(corpus.fits_style(reply, style))
    report: dict[str, Any] = {k: round(sum(v) / len(v), 3) for k, v in sorted(hits.items())}
    total = sum(unprompted.values())
    report.update({f"unprompted/{s}": round(c / total, 3) for s, c in unprompted.items()})
    report["examples"] = [{"prompt": p["messages"][-1]["content"], "reply": r} for p, r in
                          list(zip(prompts, replies))[:len(conditions) * 2]]
    return report


# ---------------------------------------------------------------- build


def _is_built(out: Path) -> bool:
    return (out / "config.json").exists() and (out / "build_info.json").exists()


def build_tiny_model(out: str | Path | None = None, seed: int = 0, steps: int | None = None, force: bool = False,
                     log: Callable[[str], Any] = print, *, threads: int | None = None,
                     args: TinyModelArgs | None = None, device: str = "cpu",
                     max_train_seconds: float | None = None) -> Path:
    """Build (or reuse, unless `force`) the pre-trained tiny chat model; returns its folder.
    `device`: where it trains and is evaluated (`cuda` on a GPU machine); it is saved from the CPU."""
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out) if out else cache_dir() / MODEL_NAME
    if _is_built(out) and not force:
        log(f"tiny model already built at {out} (--force rebuilds it)")
        return out
    args = args or TinyModelArgs()
    if steps is not None:
        args.steps = steps
    torch.set_num_threads(threads or min(8, os.cpu_count() or 1))
    t_start = time.perf_counter()
    tok = load_tokenizer(args.pauses)
    torch.manual_seed(seed)
    if args.init_from:
        model = Qwen2ForCausalLM.from_pretrained(args.init_from, torch_dtype=torch.float32)
        if model.config.vocab_size < len(tok):
            raise ValueError(f"--init-from {args.init_from}: its vocabulary ({model.config.vocab_size}) lacks "
                             f"this tokenizer's {len(tok)} tokens (different --pauses?)")
        args.layers, args.hidden = model.config.num_hidden_layers, model.config.hidden_size
        args.intermediate = model.config.intermediate_size
    else:
        model = Qwen2ForCausalLM(_config(tok, args.layers, args.hidden, args.intermediate))
    params = sum(p.numel() for p in model.parameters())
    log(f"tiny model: {params / 1e6:.2f}M parameters, vocab {len(tok)}, {args.arith_steps} arithmetic + "
        f"{args.steps} mixed + {args.final_steps} final steps x {args.batch_size} conversations, {torch.get_num_threads()} threads")
    losses = pretrain(model, tok, args, seed, log, device=device, max_train_seconds=max_train_seconds)
    train_s = time.perf_counter() - t_start
    report = evaluate(model, tok, n=args.eval_questions, seed=seed)
    model.to("cpu")
    seconds = time.perf_counter() - t_start
    info = {"name": MODEL_NAME, "params": params, "seed": seed, "steps": len(losses), "train_seconds": round(train_s, 1),
            "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
            "seconds": round(seconds, 1), "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
            "threads": torch.get_num_threads(), "args": asdict(args),
            "accuracy": {k: v for k, v in report.items() if k != "examples"}, "examples": report["examples"]}
    if args.init_from:  # what it was trained on top of: that build's files and recipe
        start = Path(args.init_from)
        before = json.loads((start / "build_info.json").read_text()) if (start / "build_info.json").exists() else {}
        info["start"] = {"files": file_checksums(start), "name": before.get("name"), "steps": before.get("steps"),
                         "args": before.get("args"), "start": before.get("start")}
    _write_atomically(out, lambda d: _save(model, tok, d, info), force=True)
    log(format_report(info))
    log(f"wrote {out}")
    return out


def format_report(info: dict[str, Any]) -> str:
    acc = info["accuracy"]
    lines = [f"parameters: {info['params']:,}   build time: {info['seconds']:.0f}s "
             f"(training {info['train_seconds']:.0f}s)   final loss: {info['final_loss']}"]
    lines.append("exact answer:     " + "  ".join(f"{k.split('/')[1]} {v:.0%}" for k, v in acc.items()
                                                 if k.startswith("answer/")))
    lines.append("style following:  " + "  ".join(f"{k.split('/')[1]} {v:.0%}" for k, v in acc.items()
                                                 if k.startswith("style/"))
                 + f"  correction {acc.get('correction', 0):.0%}")
    lines.append("no instruction:   " + "  ".join(f"{k.split('/')[1]} {v:.0%}" for k, v in acc.items()
                                                 if k.startswith("unprompted/")))
    lines.append(f"tool call:        {acc.get('tool_call', 0):.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clawloop tiny-model",
                                description="Build the embedded tiny chat model (no download, a few minutes on CPU).")
    p.add_argument("--out", default=None, help=f"Output folder (default: {cache_dir() / MODEL_NAME}; it is then "
                                               "served instead of the shipped copy).")
    p.add_argument("--seed", type=int, default=0, help="Seed for data, init and batch order.")
    p.add_argument("--steps", type=int, default=None, help=f"Steps on the mixed corpus (default {TinyModelArgs.steps}; plus "
                   f"{TinyModelArgs.final_steps} final arithmetic steps).")
    p.add_argument("--force", action="store_true", help="Rebuild even if the model exists.")
    p.add_argument("--if-missing", action="store_true",
                   help="Exit at once if the model exists (the shipped copy counts, unless --out is given).")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores, at most 8).")
    p.add_argument("--device", default="cpu", help="Where to train: cpu (default) or cuda.")
    p.add_argument("--scale", type=float, default=1.0,
                   help="Multiply the mixed and final steps (a GPU build uses more of them).")
    p.add_argument("--long-every", type=int, default=None,
                   help=f"A long agent-style prompt beside every N-th step (default {TinyModelArgs.long_every}; 0: none).")
    p.add_argument("--tool-rows", type=int, default=None,
                   help=f"Calculator conversations beside each final-phase batch (default {TinyModelArgs.final_tool_rows}).")
    p.add_argument("--final-steps", type=int, default=None,
                   help=f"Final-phase arithmetic steps (default {TinyModelArgs.final_steps}).")
    p.add_argument("--eval-questions", type=int, default=None,
                   help=f"Held-out questions in the closing evaluation (default {TinyModelArgs.eval_questions}).")
    p.add_argument("--init-from", default=None,
                   help="Start from this built model's weights instead of random ones (with --steps 0: a final "
                        "phase on top of it).")
    p.add_argument("--final-bare", type=float, default=None,
                   help=f"Share of final-phase arithmetic asked for a bare answer (default {TinyModelArgs.final_bare}).")
    p.add_argument("--final-facts", type=float, default=None,
                   help=f"Share of final-phase rows that are facts (default {TinyModelArgs.final_facts}).")
    p.add_argument("--pauses", type=int, default=None,
                   help=f"Pause tokens after each assistant header of the template (default {TinyModelArgs.pauses}).")
    p.add_argument("--no-structured", dest="structured", action="store_false", default=None,
                   help="Leave the short-JSON replies and calls to unseen tools out of the mixed corpus.")
    p.add_argument("--long-max-chars", type=int, default=None,
                   help=f"Longest long prompt in characters (default {TinyModelArgs.long_max_chars}).")
    p.add_argument("--lr", type=float, default=None, help=f"Peak learning rate (default {TinyModelArgs.lr}).")
    p.add_argument("--layers", type=int, default=None, help=f"Transformer blocks (default {TinyModelArgs.layers}).")
    p.add_argument("--batch-size", type=int, default=None, help=f"Conversations per step (default {TinyModelArgs.batch_size}).")
    p.add_argument("--max-train-seconds", type=float, default=None,
                   help="Thin the plan evenly after 50 steps so training ends within this many seconds.")
    a = p.parse_args(argv)
    present = Path(a.out) if a.out else default_model_dir()
    if a.if_missing and _is_built(present) and not a.force:
        print(f"tiny model present at {present}", file=sys.stderr)
        return 0
    out = Path(a.out) if a.out else cache_dir() / MODEL_NAME
    args = TinyModelArgs()
    if a.steps is not None:
        args.steps = a.steps
    if a.final_steps is not None:
        args.final_steps = a.final_steps
    args.steps, args.final_steps = round(args.steps * a.scale), round(args.final_steps * a.scale)
    for key, value in (("long_every", a.long_every), ("final_tool_rows", a.tool_rows), ("layers", a.layers),
                       ("batch_size", a.batch_size), ("final_bare", a.final_bare), ("final_facts", a.final_facts),
                       ("long_max_chars", a.long_max_chars), ("lr", a.lr), ("structured", a.structured),
                       ("pauses", a.pauses), ("init_from", a.init_from),
                       ("eval_questions", a.eval_questions)):
        if value is not None:
            setattr(args, key, value)
    build_tiny_model(out, seed=a.seed, force=a.force, threads=a.threads, args=args, device=a.device,
                     max_train_seconds=a.max_train_seconds, log=lambda s: print(s, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
