"""Constrained decoding for the in-process engine, with xgrammar.

A constraint is a structural tag in xgrammar's format — the object vLLM takes as
`structured_outputs.structural_tag` — so one spec drives both engines: JSON
(`response_format`) is a `json_schema` format, tool calls are `tag`s/`triggered_tags`
whose content is each tool's parameter schema.

Why xgrammar (over llguidance and outlines): it is vLLM's default structured-output
backend, so the hf engine and vLLM build the same grammar from the same object and
agree on what is valid; its structural tags express "free text, then tool calls whose
name and arguments follow the offered tools" (`triggered_tags`, with `at_least_one`
for `tool_choice: required` and `stop_after_first` for `parallel_tool_calls: false`)
without a hand-written grammar. Its cost per token is measured in bench/RESULTS.md
("Constrained decoding").

Per row: a `GrammarMatcher` fills a bitmask of the allowed next ids, the logits of
every other id become -inf, the sampled id is accepted into the matcher. Compiled
grammars are cached by their JSON text (a client sends the same tools every turn).

Closing within the budget (`SamplingParams.close_within`): in the last tokens of max_tokens, inside an
unclosed JSON value, the row takes the likeliest allowed token that closes it (`Grammars.closer`; the
rule and its helpers are in `vllm_worker/clawloop_json_close.py`, which vLLM's servers load as a logits
processor, so both engines close the same way). Like logit_bias this shapes the choice only.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from clawloop.engines.vllm_worker.clawloop_json_close import closing_tiers, inside_json, pick_closer

__all__ = ["Grammars", "check_constraint", "compact_json_grammar", "inside_json", "json_anchors", "tag_json"]

CACHE_SIZE = 256
_LOG_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def tag_json(tag: dict[str, Any]) -> str:
    # Never sort the keys: a schema's property order is the order the object is written in.
    return json.dumps(tag, separators=(",", ":"))


def check_constraint(tag: dict[str, Any]) -> None:
    """Raise ValueError (with xgrammar's reason) when `tag` does not compile; no tokenizer needed."""
    import xgrammar as xgr

    try:
        xgr.Grammar.from_structural_tag(tag_json(tag))
    except Exception as e:  # xgrammar raises its own error types (and RuntimeError) for bad schemas
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(_LOG_PREFIX.sub("", why)) from None


def compact_json_grammar(schema_text: str, separators: tuple[str, str]) -> str:
    """EBNF for JSON valid under the schema `schema_text`, written with exactly `separators` and no
    other whitespace (ValueError with xgrammar's reason when the schema does not convert)."""
    import xgrammar as xgr

    try:
        return str(xgr.Grammar.from_json_schema(schema_text, any_whitespace=False, separators=separators))
    except Exception as e:  # xgrammar's own error types, as in check_constraint
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(_LOG_PREFIX.sub("", why)) from None


JSON_FORMATS = ("json_schema", "grammar")
"""Structural-tag formats that hold JSON (the gateway writes schemas as `compact_json_grammar` EBNF)."""


def json_anchors(tag: dict[str, Any]) -> tuple[str, ...]:
    """The strings after which constrained JSON starts in the output of `tag`: the `begin` of each
    `tag` node whose content is JSON (a tool call), and for JSON not inside such a tag the output's
    start ("") and the `end` of any other tag before it (a reasoning block)."""
    anchors: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind in JSON_FORMATS:
            anchors.append("")
        elif kind == "tag" and isinstance(node.get("content"), dict) and node["content"].get("type") in JSON_FORMATS:
            anchors.append(str(node.get("begin", "")))
        else:
            if kind == "tag" and node.get("end"):
                anchors.append(str(node["end"]))
            for v in node.values():
                walk(v)

    walk(tag.get("format", tag))
    return tuple(dict.fromkeys(anchors))


class Grammars:
    """Compiles constraints for one tokenizer and masks logits row by row."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids)
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # used on the engine thread only
        self.compiles = 0
        self.masked_tokens = 0
        self.mask_s = 0.0
        self.closed_tokens = 0
        """Tokens chosen to close JSON within the budget (`closer`)."""
        self._tokenizer = tokenizer
        self._closers: dict[str, torch.Tensor] | None = None

    def closer(self, masked: torch.Tensor, where: str) -> int | None:
        """The likeliest id under `masked` (logits after `mask`) that closes what is open at `where`
        (`inside_json`), else a `,` on to a required member; None when neither is allowed here."""
        if self._closers is None:
            self._closers = closing_tiers(self._tokenizer, self.vocab_size)
        tok = pick_closer(masked[: self.vocab_size], self._closers, where)
        if tok is not None:
            self.closed_tokens += 1
        return tok

    def compile(self, tag: dict[str, Any]) -> Any:
        key = tag_json(tag)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            compiled = self.compiler.compile_structural_tag(key)
        except Exception as e:
            raise ValueError(f"the constraint does not compile: {e}") from None
        with self._lock:
            self.compiles += 1
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled, override_stop_tokens=self.stop_ids)

    def mask(self, matcher: Any, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (V,) with every id the grammar forbids next set to -inf (a new tensor)."""
        import time

        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(self._bitmask)
        out = logits[: self.vocab_size].clone().unsqueeze(0)  # (1, V)
        self._xgr.apply_token_bitmask_inplace(out, self._bitmask)
        self.masked_tokens += 1
        self.mask_s += time.perf_counter() - t0
        return out[0]
