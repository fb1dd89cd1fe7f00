"""From messages to prompt ids, and from sampled ids back to text and tool calls.

The prompt is rendered once with the model's own chat template (tools
included) and those exact ids are what the engine sees and what capture
stores. Output text is built incrementally from the sampled ids; it is never
re-encoded.

Tool calls use the Qwen/Hermes convention the tiny model is trained on:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12+7"}}
    </tool_call>
"""

from __future__ import annotations

import json
import re
import uuid
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


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  *, continue_final: bool = False) -> list[int]:
    """Prompt token ids, rendered with the tokenizer's chat template and a generation prompt
    (or, with `continue_final`, ending inside the last assistant message)."""
    kw = {"continue_final_message": True, "add_generation_prompt": False} if continue_final else \
        {"add_generation_prompt": True}
    text = tokenizer.apply_chat_template(template_messages(messages), tools=tools, tokenize=False, **kw)
    return list(tokenizer.encode(text, add_special_tokens=False))


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
