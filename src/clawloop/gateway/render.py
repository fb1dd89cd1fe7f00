"""From messages to prompt ids, and from sampled ids back to text and tool calls.

The prompt is rendered once with the model's own chat template (tools
included) and those exact ids are what the engine sees and what capture
stores. Output text is built incrementally from the sampled ids; it is never
re-encoded.

Control tokens come only from the template. Rendering to text and encoding
that text would turn `<|im_end|>` typed inside a message into the real
end-of-turn id, so a user or a tool result could close its block and open a
`system` one. `PromptRenderer` therefore swaps every special- or added-token
string found in client text for a per-call placeholder before the template
runs, and encodes each placeholder's original text as plain text (special
tokens split) when it splices the ids back together. Conversations without
such strings take the old path unchanged, so their ids are exactly those of
`tokenizer.encode(apply_chat_template(..., tokenize=False))`. Assistant
content keeps the model's own non-special added tokens (`<tool_call>`,
`<think>`): templates read them there, and the model wrote them.

Reasoning and tool calls are read off the text by the model family's parsers (`gateway/parsers/`:
Qwen3 `<think>`, Hermes/Qwen `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`); `TextStream` holds
back what may still become one and splits the reasoning off as it streams.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import secrets
from functools import lru_cache
from typing import Any

from clawloop.gateway.parsers import HermesToolParser, ReasoningSplit, ToolParser, ToolStream


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: tool-call arguments as dicts."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def _literals(strings: set[str]) -> re.Pattern | None:
    """One regex matching any of `strings`, longest first."""
    if not strings:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(strings, key=len, reverse=True)))


class PromptRenderer:
    """Prompt ids for one tokenizer, with control ids only where the template put them."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        added = dict(getattr(tokenizer, "added_tokens_decoder", None) or {})
        special = {t.content for t in added.values() if getattr(t, "special", False)}
        special |= {t for t in (getattr(tokenizer, "all_special_tokens", None) or []) if t}
        # Added tokens that are only whitespace (some vocabularies add runs of spaces) are text, not control.
        plain = {t.content for t in added.values() if t.content.strip()}
        self.control_ids = set(added) | set(getattr(tokenizer, "all_special_ids", None) or [])
        self._all = _literals(special | plain)
        self._special = _literals(special)
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        self.max_token_chars = max((len(k) for k in vocab), default=64) or 64
        """No token covers more characters than its vocabulary string has (bytes, for byte-level BPE)."""

    def min_tokens(self, n_chars: int) -> int:
        """A lower bound on the tokens `n_chars` characters of content take, without tokenizing them
        (NFC may compose up to 3 characters into one, hence the 4)."""
        return n_chars // (4 * self.max_token_chars)

    # -- placeholders --------------------------------------------------------
    def _swap(self, obj: Any, rx: re.Pattern, found: list[str], mark: str) -> Any:
        """`obj` with every match of `rx` in its strings (keys too) replaced by a placeholder;
        the same object when nothing matched."""
        if isinstance(obj, str):
            if rx.search(obj) is None:
                return obj

            def sub(m: re.Match) -> str:
                found.append(m.group(0))
                return f"{mark}{len(found) - 1}\ue001"
            return rx.sub(sub, obj)
        if isinstance(obj, dict):
            out, changed = {}, False
            for k, v in obj.items():
                k2, v2 = self._swap(k, rx, found, mark), self._swap(v, rx, found, mark)
                changed |= k2 is not k or v2 is not v
                out[k2] = v2
            return out if changed else obj
        if isinstance(obj, list):
            out_l = [self._swap(v, rx, found, mark) for v in obj]
            return out_l if any(a is not b for a, b in zip(out_l, obj)) else obj
        return obj

    def encode_text(self, text: str) -> list[int]:
        """`text` as plain text: no special or added token is recognised in it."""
        ids = list(self.tok.encode(text, add_special_tokens=False, split_special_tokens=True))
        if len(text) > 1 and any(i in self.control_ids for i in ids):  # added (non-special) tokens still match
            h = len(text) // 2
            return self.encode_text(text[:h]) + self.encode_text(text[h:])
        return ids

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               *, continue_final: bool = False, add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids, rendered with the tokenizer's chat template and a generation prompt
        (or, with `continue_final`, ending inside the last assistant message; with
        `add_generation_prompt=False`, ending after the last message as the template closes it)."""
        kw = {"continue_final_message": True, "add_generation_prompt": False} if continue_final else \
            {"add_generation_prompt": add_generation_prompt}
        msgs = template_messages(messages)
        found: list[str] = []
        mark = f"\ue000{secrets.token_hex(6)}:"
        if self._all is not None:
            msgs = [self._swap(m, self._special if m.get("role") == "assistant" else self._all, found, mark)
                    for m in msgs]
            tools = self._swap(tools, self._all, found, mark) if tools else tools
        text = self.tok.apply_chat_template(msgs, tools=tools, tokenize=False, **kw)
        if not found:
            return list(self.tok.encode(text, add_special_tokens=False))
        # Each placeholder stands where the old path saw an added token, so cutting the text there
        # leaves every other id as it was (the tokenizer splits at added tokens before anything else).
        ids: list[int] = []
        pos = 0
        for m in re.finditer(re.escape(mark) + r"(\d+)\ue001", text):
            ids += self.tok.encode(text[pos:m.start()], add_special_tokens=False) if m.start() > pos else []
            ids += self.encode_text(found[int(m.group(1))])
            pos = m.end()
        if pos < len(text):
            ids += self.tok.encode(text[pos:], add_special_tokens=False)
        return ids


@lru_cache(maxsize=8)
def renderer_for(tokenizer: Any) -> PromptRenderer:
    return PromptRenderer(tokenizer)


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  *, continue_final: bool = False, add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids (see `PromptRenderer.render`); the renderer is built once per tokenizer."""
    return renderer_for(tokenizer).render(messages, tools, continue_final=continue_final,
                                          add_generation_prompt=add_generation_prompt)


def content_chars(content: Any) -> int:
    """Characters of text in a message's content (a string, or parts: a user message with images)."""
    if isinstance(content, list):
        return sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return len(content or "")


# -- images -------------------------------------------------------------------------
HF_ONLY = "images are supported on the hf engine only for now"


def image_policy(engine: Any) -> bool | str:
    """What `parse_chat_request(images=...)` takes for `engine`: True when it serves a model that takes
    images, else why image parts are refused."""
    supported = getattr(engine, "supports_images", None)
    if supported is None:  # an engine that knows nothing of images (vLLM, for now)
        return HF_ONLY
    if supported:
        return True
    return getattr(engine, "images_unsupported_reason", None) or "the served model takes text only"


async def expand_images(engine: Any, prompt_ids: list[int], images: list[Any]) -> tuple[list[int], Any]:
    """The rendered prompt with each image placeholder expanded as the model's processor does, and the
    engine's pixel inputs (`engine.prepare_images`, off the event loop). Problems are 400s: an image the
    engine cannot decode names its part, a template that did not render one placeholder per image
    names `messages`."""
    from clawloop.engines.base import ImageInputError
    from clawloop.gateway.protocol import APIError

    try:
        return await asyncio.to_thread(engine.prepare_images, prompt_ids, [im.data for im in images])
    except ImageInputError as e:
        p = images[e.index].param + ".image_url.url" if e.index is not None else "messages"
        raise APIError(400, f"Invalid image at '{p}': {e}.", param=p, code="image_parse_error") from None
    except ValueError as e:
        raise APIError(400, f"The images could not be placed in the prompt: {e}.", param="messages",
                       code="invalid_value") from None


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character a byte-level BPE vocabulary uses → the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenPieces:
    """Per sampled id, the text and the raw bytes a logprobs entry reports (cached per id).

    `bytes` are the token's own bytes, read off the byte-level vocabulary (or sentencepiece's
    `<0xNN>` byte fallback), so a token holding half of a UTF-8 character reports that half, not
    the replacement character its lone decode gives."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.added = {i: t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
        dec = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = dec is not None and "ByteLevel" in repr(dec)
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, tid: int) -> str:
        t = self._text.get(tid)
        if t is None:
            t = self._text[tid] = self.tok.decode([tid], skip_special_tokens=False)
        return t

    def bytes(self, tid: int) -> list[int]:
        b = self._bytes.get(tid)
        if b is None:
            b = self._bytes[tid] = list(self._raw_bytes(tid))
        return b

    def _raw_bytes(self, tid: int) -> bytes:
        if tid in self.added:
            return self.added[tid].encode("utf-8")
        piece = self.tok.convert_ids_to_tokens(tid)
        if not isinstance(piece, str):
            return self.text(tid).encode("utf-8")
        if self.byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if m := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        if "\u2581" in piece:  # sentencepiece's word-boundary mark is a space
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.text(tid).encode("utf-8")


class Detokenizer:
    """Incremental decoding of sampled ids, safe for multi-byte characters split
    across byte-level tokens: a delta is released only once it decodes cleanly.
    Special tokens (eos) produce no text, except those in `keep` (a parser's markers that the
    tokenizer calls special, such as Mistral's `[TOOL_CALLS]`: `marker_ids`)."""

    def __init__(self, tokenizer: Any, keep: frozenset[int] = frozenset()):
        self.tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._skip = special_ids(tokenizer) - keep if keep else None
        self._bytes = _byte_pieces(tokenizer)
        """Byte-level tokenizers: each id's bytes (shared cache), decoded here with an incremental
        UTF-8 decoder -- the text `decode` gives, without two tokenizer calls per token."""
        if self._bytes is not None:
            self._omit = special_ids_cached(tokenizer) - keep
            self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _fast(self, token_ids: list[int], final: bool = False) -> str:
        table, omit = self._bytes, self._omit
        data = b"".join(b"" if t in omit else (table.get(t) or _piece_bytes(self.tok, table, t)) for t in token_ids)
        return self._utf8.decode(data, final)

    def _decode(self, ids: list[int]) -> str:
        if self._skip is not None:
            return self.tok.decode([i for i in ids if i not in self._skip], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self._bytes is not None:
            return self._fast([token_id])
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        new_text = self._decode(self.ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def push_many(self, token_ids: list[int]) -> str:
        """`push` of several ids at once: the same text overall, two decodes per call instead of per id."""
        if len(token_ids) == 1:
            return self.push(token_ids[0])
        self.ids.extend(token_ids)
        if self._bytes is not None:
            return self._fast(token_ids)
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        new_text = self._decode(self.ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (e.g. a truncated character)."""
        if self._bytes is not None:
            return self._fast([], final=True)
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        new_text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return new_text[len(prefix_text):]


@lru_cache(maxsize=32)
def special_ids_cached(tokenizer: Any) -> frozenset[int]:
    return special_ids(tokenizer)


@lru_cache(maxsize=32)
def _byte_pieces(tokenizer: Any) -> dict[int, bytes] | None:
    """An (initially empty) id -> bytes cache when `tokenizer` decodes with GPT-2's byte-level decoder
    alone (Qwen, Llama 3, GPT-2 ...): then `decode` is the UTF-8 decoding of the ids' bytes joined.
    None for other tokenizers (sentencepiece, decoder sequences), which keep `decode`."""
    dec = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return {} if dec is not None and type(dec).__name__ == "ByteLevel" else None


def _piece_bytes(tokenizer: Any, table: dict[int, bytes], tid: int) -> bytes:
    """Id `tid`'s bytes as the byte-level decoder writes them: a token whose characters are all in the
    byte alphabet is those bytes; one that is not (an added token such as `<｜tool▁call｜>`) its UTF-8."""
    piece = tokenizer.convert_ids_to_tokens(tid)
    if not isinstance(piece, str):
        piece = ""
    alphabet = _byte_decoder()
    b = bytes(alphabet[c] for c in piece) if all(c in alphabet for c in piece) else piece.encode("utf-8")
    table[tid] = b
    return b


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids `decode(skip_special_tokens=True)` leaves out."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(getattr(tokenizer, "all_special_ids", None) or []) | frozenset(
        i for i, t in added.items() if getattr(t, "special", False))


@lru_cache(maxsize=32)
def marker_ids(tokenizer: Any, markers: tuple[str, ...]) -> frozenset[int]:
    """The special tokens among a parser's `markers` (each one token of the vocabulary): kept in the text."""
    vocab = tokenizer.get_vocab()
    return frozenset(vocab[m] for m in markers if m in vocab) & special_ids(tokenizer)


class TextStream:
    """Turns token deltas into what may be shown to the client now.

    With a `reasoning` split, the reasoning is taken off first (`reasoning`, and `take_reasoning()`
    for what is new); the rest is the content. Holds back content that could still become a stop
    string or the start of a tool call (`tools`: the family's parser; True: Hermes), truncates at
    a stop string (`stopped`; stop strings apply to the content, not to the reasoning), and once a
    tool call opens (`in_tool`, at `tool_start`) keeps the rest for the tool parser.
    """

    def __init__(self, stop: list[str], tools: ToolParser | bool | None = None,
                 reasoning: ReasoningSplit | None = None):
        self.stop = stop
        self.tools: ToolParser | None = HermesToolParser() if tools is True else (tools or None)
        self.split = reasoning
        self.text = ""  # the content generated (truncated at a stop string)
        self.sent = 0  # characters of `text` released as content
        self.stopped = False
        self.in_tool = False
        self.tool_start = 0
        self._reasoning_new = ""

    @property
    def reasoning(self) -> str:
        return self.split.reasoning if self.split is not None else ""

    def take_reasoning(self) -> str:
        """The reasoning produced since the last call."""
        r, self._reasoning_new = self._reasoning_new, ""
        return r

    def feed(self, delta: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        if self.split is not None:
            r, delta = self.split.feed(delta, final)
            self._reasoning_new += r
        self.text += delta
        for s in self.stop:
            i = self.text.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
                final = True
        if self.tools is not None and not self.in_tool:
            j = self.tools.find_start(self.text, self.sent)
            if j is not None:
                self.in_tool = True
                self.tool_start = j
                out = self.text[self.sent:j]
                self.sent = j
                return out
        if self.in_tool:
            return ""
        limit = len(self.text)
        if not final:
            # keep back the longest suffix that is a proper prefix of a stop string or a tool call's start
            for g in self.stop:
                for k in range(min(len(g) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(g[:k]):
                        limit = min(limit, len(self.text) - k)
                        break
            if self.tools is not None:
                limit = min(limit, max(self.sent, self.tools.hold(self.text, self.sent)))
        out = self.text[self.sent:limit]
        self.sent = limit
        return out


def finish_text(text: TextStream, calls: ToolStream | None) -> tuple[str, str | None, list[dict[str, Any]],
                                                                       list[dict[str, Any]]]:
    """A choice's end: (the held-back tail to show now, the whole content, the tool calls, the tool-call
    deltas not streamed yet). `calls`: None when the request offered no tools."""
    sent = text.sent
    rest = text.text[sent:]
    text.sent = len(text.text)
    if calls is not None and text.in_tool:
        owed = calls.feed(rest)  # not streamed: the same calls a stream has (streamed: what is left)
        rest_content, found, more = calls.finish(rest)
        if found:
            return rest_content.strip(), (text.text[:sent] + rest_content).strip() or None, found, owed + more
    return rest, text.text, [], []


def reasoning_end(tokenizer: Any, ids: list[int], split: ReasoningSplit | None, parser: Any) -> int | None:
    """How many of the sampled `ids` are reasoning, the closing marker included (`Turn.reasoning_end`):
    None when the reply has no reasoning; `len(ids)` when it ended still reasoning (max_tokens).
    Read off the ids: the marker's own token where the vocabulary has one, else the shortest prefix
    whose text holds the marker."""
    if split is None or not split.had_reasoning:
        return None
    if not split.closed:
        return len(ids)
    tid = tokenizer.get_vocab().get(parser.end)
    if tid is not None and tid in ids:
        return ids.index(tid) + 1
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if parser.end in tokenizer.decode(ids[:mid], skip_special_tokens=False):
            hi = mid
        else:
            lo = mid + 1
    return lo
