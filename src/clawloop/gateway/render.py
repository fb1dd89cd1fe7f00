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

Tool calls use the Qwen/Hermes convention the tiny model is trained on:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12+7"}}
    </tool_call>
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import uuid
from functools import lru_cache
from typing import Any

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_TOOL_RE = re.compile(re.escape(TOOL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(TOOL_CLOSE) + r"|$)", re.S)


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


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into (content, tool_calls). Blocks that are not valid
    JSON with a `name` stay in the content, so nothing the model wrote is lost."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _TOOL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
        })
    if not calls:
        return text, []
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None), calls


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
    Special tokens (eos) produce no text."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
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
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        new_text = self._decode(self.ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (e.g. a truncated character)."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        new_text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return new_text[len(prefix_text):]


class TextStream:
    """Turns token deltas into what may be shown to the client now.

    Holds back text that could still become a stop string or the start of a
    tool call, truncates at a stop string (`stopped`), and once a tool call
    opens (`in_tool`) keeps the rest for parsing at the end.
    """

    def __init__(self, stop: list[str], tools: bool):
        self.stop = stop
        self.tools = tools
        self.text = ""  # everything generated (truncated at a stop string)
        self.sent = 0  # characters of `text` released as content
        self.stopped = False
        self.in_tool = False
        self._guards = list(stop) + ([TOOL_OPEN] if tools else [])

    def feed(self, delta: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        self.text += delta
        for s in self.stop:
            i = self.text.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
                final = True
        if self.tools and not self.in_tool:
            j = self.text.find(TOOL_OPEN, self.sent)
            if j >= 0:
                self.in_tool = True
                out = self.text[self.sent:j]
                self.sent = j
                return out
        if self.in_tool:
            return ""
        limit = len(self.text)
        if not final:
            # keep back the longest suffix that is a proper prefix of a guard string
            for g in self._guards:
                for k in range(min(len(g) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(g[:k]):
                        limit = min(limit, len(self.text) - k)
                        break
        out = self.text[self.sent:limit]
        self.sent = limit
        return out


_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class ToolCallStream:
    """Tool calls streamed as they are generated, OpenAI style: a call's first delta carries its
    id and name, later ones pieces of its `arguments` text.

    `feed` takes the held-back text from the first `<tool_call>` on (all of it, each time) and
    returns the new `delta.tool_calls` entries. A block written as `{"name": ..., "arguments": ...}`
    (the order the constrained grammar produces) streams; any other shape is left for `finish`,
    which parses the whole text and returns the calls (streamed ones keep their ids and indexes)
    and the deltas still owed."""

    def __init__(self) -> None:
        self.pos = 0  # where to look for the next block
        self.calls: list[dict[str, Any]] = []  # streamed calls: index, id, name, block, args, sent, done
        self._cur: dict[str, Any] | None = None

    def feed(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            cur = self._cur
            if cur is None:
                j = text.find(TOOL_OPEN, self.pos)
                if j < 0:
                    return out
                m = _CALL_HEAD.match(text, j + len(TOOL_OPEN))
                if m is None or m.end() == len(text):  # not (yet) the streamable shape
                    close = text.find(TOOL_CLOSE, j)
                    if m is None and close >= 0:
                        self.pos = close + len(TOOL_CLOSE)  # complete but another shape: parsed by finish
                        continue
                    return out
                try:
                    name = json.loads(f'"{m.group(1)}"')
                except json.JSONDecodeError:
                    name = m.group(1)
                cur = self._cur = {"index": len(self.calls), "id": f"call_{uuid.uuid4().hex[:24]}", "name": name,
                                   "block": j, "from": m.end(), "scan": m.end(), "depth": 0, "in_str": False,
                                   "esc": False, "sent": "", "done": False, "streamable": True}
                self.calls.append(cur)
                out.append({"index": cur["index"], "id": cur["id"], "type": "function",
                            "function": {"name": name, "arguments": ""}})
            new = self._scan(cur, text)
            if new:
                cur["sent"] += new
                out.append({"index": cur["index"], "function": {"arguments": new}})
            if not cur["done"]:
                return out
            close = text.find(TOOL_CLOSE, cur["scan"])
            if close < 0:
                return out
            self.pos = close + len(TOOL_CLOSE)
            self._cur = None

    @staticmethod
    def _scan(cur: dict[str, Any], text: str) -> str:
        """Advance over the arguments' JSON; return the part of it not yet sent."""
        i, start = cur["scan"], cur["scan"]
        while i < len(text) and not cur["done"]:
            ch = text[i]
            if cur["depth"] == 0 and not cur["sent"] and i == start and start == cur["from"] and ch != "{":
                cur["done"], cur["streamable"] = True, False  # arguments that are not an object: finish parses
                return ""
            if cur["in_str"]:
                if cur["esc"]:
                    cur["esc"] = False
                elif ch == "\\":
                    cur["esc"] = True
                elif ch == '"':
                    cur["in_str"] = False
            elif ch == '"':
                cur["in_str"] = True
            elif ch in "{[":
                cur["depth"] += 1
            elif ch in "}]":
                cur["depth"] -= 1
                if cur["depth"] == 0:
                    cur["done"] = True
            i += 1
        cur["scan"] = i
        return text[start:i]

    def finish(self, text: str, offset: int = 0) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """(the text outside the calls, unstripped; every call in index order; the deltas not yet
        sent). `text` is the generated text from `offset` on (the part not shown as content)."""
        by_block = {c["block"]: c for c in self.calls}
        calls: list[tuple[int, dict[str, Any]]] = []
        owed: list[dict[str, Any]] = []
        kept: list[str] = []
        pos, extra = 0, len(self.calls)
        for m in _TOOL_RE.finditer(text):
            streamed = by_block.get(m.start() + offset)
            _, parsed = parse_tool_calls(m.group(0))
            p = parsed[0] if parsed else None
            if streamed is not None:
                args = streamed["sent"]
                if p is not None and p["function"]["arguments"].startswith(args):
                    args = p["function"]["arguments"]  # what the client has is what it keeps
                if len(args) > len(streamed["sent"]):
                    owed.append({"index": streamed["index"], "function": {"arguments": args[len(streamed["sent"]):]}})
                calls.append((streamed["index"], {"id": streamed["id"], "type": "function",
                                                  "function": {"name": streamed["name"], "arguments": args}}))
            elif p is not None:
                calls.append((extra, p))
                owed.append({"index": extra, **p})
                extra += 1
            else:
                continue  # not a call: stays in the content
            kept.append(text[pos:m.start()])
            pos = m.end()
        if not calls:
            return text, [], []
        kept.append(text[pos:])
        return "".join(kept), [c for _, c in sorted(calls, key=lambda x: x[0])], owed
