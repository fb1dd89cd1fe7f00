"""Constrained JSON that ends within max_tokens: the rule both engines apply, and vLLM's logits processor.

A grammar keeps every token valid but cannot make a weak model *end* its JSON: it may write digits or
string characters until max_tokens, and the client gets an object cut in the middle (issue #28). In the
last N tokens of the budget, while the output is inside an unclosed JSON value (`inside_json`), the row
takes the likeliest allowed token that only closes what is open (`pick_closer`: a `"` in a string, a
`}`/`]` outside one), or else a `,` that moves on to a required member; where neither is allowed (a key's
name, a value after `:`) it samples as usual.

The hf engine calls these helpers itself (`engines/grammar.py`, `engines/hf.py`). vLLM runs `JsonClose`
in its own environment (the vLLM venv's Python, without clawloop installed): clawloop starts the servers
it owns with

    PYTHONPATH=<this folder> ... --logits-processors clawloop_json_close:JsonClose

and sends, per constrained request, `sampling_params.extra_args` = {"clawloop_close_within": N,
"clawloop_json_anchors": [...]} (`grammar.json_anchors`: where JSON starts in the output). vLLM applies
the grammar's bitmask to the logits before the logits processors and takes its raw logprobs before them
too, so, as in the hf engine, this shapes the choice only: the logprobs reported are the constrained
distribution's. Imports nothing from clawloop.
"""

from __future__ import annotations

from typing import Any

import torch

CLOSING_CHARS = frozenset('"}]')
PUNCTUATION = frozenset('"}],: \n')
JSON_STARTS = frozenset('{["-0123456789tfn')
CLOSE_WITHIN = "clawloop_close_within"
ANCHORS = "clawloop_json_anchors"


def inside_json(text: str, anchors: tuple[str, ...] | list[str]) -> str | None:
    """Where `text` (the output so far) ends in an unclosed JSON value that started right after the
    last of `anchors` in it (see `grammar.json_anchors`): "string" in an open string, "container" in an
    open object or array outside a string, None outside JSON."""
    start = -1
    for a in anchors:
        at = 0 if a == "" else text.rfind(a)
        if at >= 0:
            start = max(start, at + len(a))
    region = text[start:].lstrip() if start >= 0 else ""  # a reasoning block's end has a gap after it
    if not region or region[0] not in JSON_STARTS:
        return None  # nothing yet, or free text (a branch of the format without JSON)
    depth, in_string, escaped = 0, False, False
    for ch in region:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth <= 0:
                return None  # the value closed: what follows is the tag's end or free text
    return "string" if in_string else "container" if depth > 0 else None


def closing_tiers(tokenizer: Any, vocab_size: int) -> dict[str, torch.Tensor]:
    """(vocab_size,) bool masks of the ids that close: "string" (a `"`, perhaps followed by JSON's own
    punctuation, as a tokenizer merges `":` or `"}}`), "container" (`}`/`]`, perhaps with whitespace),
    "mover" (a `,`, perhaps with the space and quote after it). Merged forms matter: a model that
    writes `":` after a key, made to write `"` alone, goes off its own tokenization."""
    n = min(vocab_size, len(tokenizer))
    ids = list(range(n))
    texts = [tokenizer.convert_tokens_to_string([t]) if t else "" for t in tokenizer.convert_ids_to_tokens(ids)]

    def where(keep: Any) -> torch.Tensor:
        m = torch.zeros(vocab_size, dtype=torch.bool)
        m[[i for i, t in zip(ids, texts) if t and keep(t)]] = True
        return m

    return {"string": where(lambda t: t[0] == '"' and set(t[1:]) <= PUNCTUATION),
            "container": where(lambda t: t[0] in "}]" and set(t) <= CLOSING_CHARS - {'"'} | set(" \n")),
            "mover": where(lambda t: t[0] == "," and set(t) <= set(', "'))}


def pick_closer(masked: torch.Tensor, tiers: dict[str, torch.Tensor], where: str) -> int | None:
    """The likeliest id under `masked` (one row's logits, the grammar's -inf applied) that closes what is
    open at `where` (`inside_json`), else a `,`; None when the grammar allows neither here."""
    allowed = torch.isfinite(masked)
    for tier in (tiers[where], tiers["mover"]):
        pick = allowed & tier.to(masked.device)
        if bool(pick.any()):
            return int(torch.where(pick, masked, torch.full_like(masked, float("-inf"))).argmax())
    return None


if __name__ == "clawloop_json_close":  # loaded by vLLM (in clawloop, only the helpers above are used)
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class JsonClose(LogitsProcessor):
        """The closing rule in vLLM's batch: rows of requests that ask for it (`extra_args`)."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
            from transformers import AutoTokenizer

            mc = vllm_config.model_config
            self.tokenizer = AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=mc.trust_remote_code)
            self.vocab_size = mc.get_vocab_size()
            self.tiers: dict[str, torch.Tensor] | None = None  # built on first use: it reads the vocabulary
            self.rows: dict[int, tuple[int, int, tuple[str, ...], list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it can change the greedy choice

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            extra = sampling_params.extra_args or {}
            n = extra.get(CLOSE_WITHIN, 0)
            if not isinstance(n, int) or n < 0:
                raise ValueError(f"extra_args.{CLOSE_WITHIN} must be an integer >= 0, got {n!r}")
            if n and not isinstance(extra.get(ANCHORS), list):
                raise ValueError(f"extra_args.{ANCHORS} must be a list of strings with {CLOSE_WITHIN}")

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            def new_state(params: Any, _prompt: Any, output: list[int]) -> Any:
                extra = params.extra_args or {}
                n = int(extra.get(CLOSE_WITHIN, 0) or 0)
                if n <= 0 or params.max_tokens is None:
                    return None
                return n, int(params.max_tokens), tuple(extra.get(ANCHORS) or ()), output

            process_dict_updates(self.rows, batch_update, new_state)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for i, (n, max_tokens, anchors, output) in self.rows.items():
                if max_tokens - len(output) > n:
                    continue
                where = inside_json(self.tokenizer.decode(output, skip_special_tokens=False), anchors)
                if where is None:
                    continue
                if self.tiers is None:
                    self.tiers = closing_tiers(self.tokenizer, logits.shape[-1])
                tok = pick_closer(logits[i], self.tiers, where)
                if tok is not None:
                    keep = logits[i, tok].clone()
                    logits[i] = float("-inf")
                    logits[i, tok] = keep
            return logits
