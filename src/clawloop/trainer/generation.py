"""Replies of a model to checks, as the gateway would render them: what the publish gate scores and rehearsal
replays (split out of `gate.py`). Sampled replies draw from generators seeded per batch, so the same checks
in the same order draw the same random numbers (the gate's common random numbers)."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import torch

BUILTIN_SEED = 27
"""Seed of the built-in checks' held-out questions (fixed: the baseline must be comparable across restarts)."""


def generate_replies(model: torch.nn.Module, tokenizer: Any, checks: list[Any], *, batch_size: int,
                     autocast_dtype: torch.dtype | None = None, temperature: float = 0.0,
                     seed: int = BUILTIN_SEED) -> list[str]:
    """Replies of `model` to every check (prompts rendered as the gateway renders them), in batches of
    checks with the same `max_tokens`, left-padded. `temperature` 0: greedy; else sampled (no top-k or
    top-p), each batch from a generator seeded by `seed` and its place, so a call with the same checks
    draws the same random numbers (the global RNG is left as it was)."""
    return [text for text, _, _ in generate_rows(model, tokenizer, checks, batch_size=batch_size,
                                                  autocast_dtype=autocast_dtype, temperature=temperature, seed=seed)]


def generate_rows(model: torch.nn.Module, tokenizer: Any, checks: list[Any], *, batch_size: int,
                  autocast_dtype: torch.dtype | None = None, temperature: float = 0.0,
                  seed: int = BUILTIN_SEED) -> list[tuple[str, list[int], list[int]]]:
    """`generate_replies` with the token ids: (reply text, prompt ids, response ids up to and including
    the stop token, when one came) per check."""
    from transformers import GenerationConfig

    from clawloop.gateway.render import render_prompt

    device = next(model.parameters()).device
    prompts = [render_prompt(tokenizer, c.messages, c.tools) for c in checks]
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None) or tokenizer.eos_token_id
    stops = set(eos) if isinstance(eos, list) else {eos}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    order = sorted(range(len(checks)), key=lambda i: (checks[i].max_tokens, len(prompts[i])))
    chunks = [(mt, rows[k:k + batch_size])
              for mt, group in itertools.groupby(order, key=lambda i: checks[i].max_tokens)
              for rows in [list(group)] for k in range(0, len(rows), batch_size)]
    replies: list[tuple[str, list[int], list[int]]] = [("", [], [])] * len(checks)
    for n, (mt, chunk) in enumerate(chunks):
        width = max(len(prompts[j]) for j in chunk)
        ids = torch.tensor([[pad] * (width - len(prompts[j])) + prompts[j] for j in chunk], device=device)  # (B, T)
        attn = torch.tensor([[0] * (width - len(prompts[j])) + [1] * len(prompts[j]) for j in chunk], device=device)
        sampled = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
            else {"do_sample": False}
        gc = GenerationConfig(max_new_tokens=mt, eos_token_id=eos, pad_token_id=pad, **sampled)
        ctx = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
               else contextlib.nullcontext())
        devices = [device] if device.type == "cuda" else []
        with torch.no_grad(), ctx, torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed * 1009 + n)
            out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gc)  # (B, T + new)
        for j, row in zip(chunk, out[:, width:].tolist()):
            end = next((k for k, t in enumerate(row) if t in stops), len(row))  # then only padding follows
            replies[j] = (tokenizer.decode(row[:end], skip_special_tokens=True).strip(), prompts[j],
                          row[:min(end + 1, len(row))])
    return replies
