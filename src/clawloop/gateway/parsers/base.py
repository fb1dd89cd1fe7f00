"""What every reasoning and tool-call parser shares: the two Protocols, the streaming split of
reasoning from content (`ReasoningSplit`), the streaming of tool calls out of a tool section
(`ToolStream`), and the JSON scanning the tool formats have in common.

A tool parser reads text, never ids: the gateway detokenizes what the engine sampled (keeping the
parser's own marker tokens, `markers`, even where the tokenizer calls them special) and the parser
finds the calls in it. Everything here is incremental: `feed` takes the text so far, and what it
has already given out is never taken back, so a stream and a reply built from the same ids agree.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol


# -- protocols ----------------------------------------------------------------------
class ReasoningParser(Protocol):
    """Where a thinking model's reasoning begins and ends in its output."""

    name: str
    start: str
    """The text that opens the reasoning (`<think>`)."""
    end: str
    """The text that closes it (`</think>`)."""
    gap: str
    """What the template writes between the end and the answer (`\\n\\n`)."""

    def starts_inside(self, prompt_tail: str) -> bool:
        """Whether the output begins inside the reasoning: the template opened it in the prompt (Qwen3's
        thinking models end the generation prompt with `<think>\\n`). `prompt_tail`: the prompt's last
        characters."""
        ...


@dataclass
class Found:
    """One tool call (or what may become one) in a tool section."""

    start: int
    end: int
    """Where its text ends (the section's length while it is open)."""
    name: str | None
    """None until the name is complete (or when the block turned out not to be a call)."""
    args: str
    """The arguments as written so far (raw JSON text; only when `streamable`)."""
    closed: bool
    """Its text is complete."""
    call: dict[str, Any] | None = None
    """The parsed call (`{"name", "arguments"}`, arguments a JSON string) once it is closed and valid."""
    streamable: bool = True
    """Its arguments are a JSON object written after the name, so they stream as written."""


class ToolParser(Protocol):
    """One model family's way of writing tool calls."""

    name: str
    markers: tuple[str, ...]
    """Text only tool calls contain; the detokenizer keeps these tokens even when they are special."""
    trigger: str
    """What the grammar waits for before it constrains a call (`tool_choice: auto`)."""

    def find_start(self, text: str, pos: int) -> int | None:
        """Index (>= `pos`) where a tool section begins in the content `text`, or None."""
        ...

    def hold(self, text: str, pos: int) -> int:
        """Index from which the end of `text` (past `pos`) may still become a tool section's start:
        that much is held back from the client; `len(text)` when nothing is."""
        ...

    def scan(self, section: str) -> list[Found]:
        """The calls in a tool section (the text from its start on), complete or not."""
        ...

    def call_tag(self, name: str) -> tuple[str, str]:
        """(begin, end) around a constrained call's arguments, in this format."""
        ...

    def new_id(self) -> str:
        """A tool-call id the family's template accepts back (Mistral's: 9 letters and digits)."""
        ...


# -- JSON scanning --------------------------------------------------------------------
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_WS = re.compile(r"\s*")


def json_end(text: str, i: int) -> int | None:
    """Index just past the JSON object or array that starts at `text[i]` (strings honoured); None while
    it is still open."""
    depth, in_str, esc = 0, False, False
    for k in range(i, len(text)):
        ch = text[k]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
    return None


def call_of(obj: Any) -> dict[str, Any] | None:
    """`{"name", "arguments"}` of a decoded call object (`arguments` or `parameters`), or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}


def read_call_object(text: str, i: int) -> Found:
    """The call object `{"name": ..., "arguments": {...}, ...}` that starts at `text[i]` ('{').

    Written name first, its arguments stream as they come; any other shape is read once it is whole."""
    end = json_end(text, i)
    m = _HEAD.match(text, i)
    name = None
    if m is not None:
        try:
            name = json.loads(f'"{m.group(1)}"')
        except json.JSONDecodeError:
            m = None
    if m is not None and (m.end() == len(text) or text[m.end()] == "{"):
        a = m.end()
        a_end = json_end(text, a) if a < len(text) else None
        args = text[a:a_end] if a_end is not None else text[a:]
        f = Found(i, end if end is not None else len(text), name, args, end is not None)
    else:
        f = Found(i, end if end is not None else len(text), None, "", end is not None, streamable=False)
    if end is not None:
        try:
            obj = json.loads(text[i:end])
        except json.JSONDecodeError:
            obj = None
        f.call = call_of(obj)
        if f.call is not None:
            f.name = f.call["name"]
            if f.streamable and f.args:
                try:
                    json.loads(f.args)
                    f.call["arguments"] = f.args  # as the model wrote them (what a stream sent)
                except json.JSONDecodeError:
                    pass
    return f


def skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def held_prefix(text: str, pos: int, marker: str) -> int:
    """Index from which `text` ends with a proper prefix of `marker` (past `pos`); `len(text)` if none."""
    for k in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


# -- streaming -----------------------------------------------------------------------
def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolStream:
    """Tool calls streamed as they are generated, OpenAI style: a call's first delta carries its id and
    name, later ones pieces of its `arguments` text.

    `feed` takes the tool section (the text from the first call on, all of it, each time) and returns
    the new `delta.tool_calls` entries; `finish` reads the whole section and returns the text outside
    the calls, every call (streamed ones keep their ids and indexes) and the deltas still owed. A call
    cut short (max_tokens) that had begun streaming stays a call with the arguments sent."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.sent: list[dict[str, Any]] = []  # per streamed call: id, name, args sent

    def feed(self, section: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        k = 0
        for f in self.parser.scan(section):
            if f.name is None:
                continue
            if not f.streamable and f.call is None:
                break  # read once whole: later calls wait, so indexes stay in order
            if k == len(self.sent):
                self.sent.append({"id": self.parser.new_id(), "name": f.name, "args": ""})
                out.append({"index": k, "id": self.sent[k]["id"], "type": "function",
                            "function": {"name": f.name, "arguments": ""}})
            s = self.sent[k]
            args = f.args if f.streamable else (f.call or {}).get("arguments", "")
            if len(args) > len(s["args"]) and args.startswith(s["args"]):
                out.append({"index": k, "function": {"arguments": args[len(s["args"]):]}})
                s["args"] = args
            k += 1
            if not f.closed:
                break
        return out

    def finish(self, section: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """(the text outside the calls, unstripped; every call in index order; the deltas not yet sent)."""
        calls: list[dict[str, Any]] = []
        owed: list[dict[str, Any]] = []
        kept: list[str] = []
        pos = 0
        for f in self.parser.scan(section):
            k = len(calls)
            if f.call is None and not (k < len(self.sent) and f.name == self.sent[k]["name"]):
                continue  # not a call: stays in the content
            if k < len(self.sent):
                s = self.sent[k]
                args = s["args"]
                if f.call is not None and f.call["arguments"].startswith(args):
                    args = f.call["arguments"]  # what the client has is what it keeps
                if len(args) > len(s["args"]):
                    owed.append({"index": k, "function": {"arguments": args[len(s["args"]):]}})
                calls.append({"id": s["id"], "type": "function", "function": {"name": s["name"], "arguments": args}})
            else:
                c = {"id": self.parser.new_id(), "type": "function", "function": dict(f.call)}
                calls.append(c)
                owed.append({"index": k, **c})
            kept.append(section[pos:f.start])
            pos = f.end
        if not calls:
            return section, [], []
        kept.append(section[pos:])
        return "".join(kept), calls, owed


class ReasoningSplit:
    """A thinking model's output split as it streams: reasoning until the parser's end marker, content
    after it (its leading newlines dropped, as the templates write them between the two).

    `inside`: the output begins inside the reasoning (the prompt opened it); otherwise the reasoning
    must open with the parser's start marker, at the very beginning (whitespace aside). Text that may
    still become a marker is held back; `feed(delta, final)` returns (reasoning delta, content delta)."""

    def __init__(self, parser: ReasoningParser, inside: bool):
        self.p = parser
        self.state = "inside" if inside else "head"  # head -> inside -> content, or head -> content
        self.buf = ""
        self.reasoning = ""
        self.had_reasoning = inside
        self.closed = False
        """The end marker was written."""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.buf += delta
        r, c = "", ""
        while True:
            if self.state == "head":
                s = self.buf.lstrip()
                if s.startswith(self.p.start):
                    self.buf = s[len(self.p.start):]
                    self.state, self.had_reasoning = "inside", True
                    continue
                if not final and (not s or self.p.start.startswith(s)):
                    return r, c  # may still open the reasoning
                self.state = "content"
                continue
            if self.state == "inside":
                j = self.buf.find(self.p.end)
                if j >= 0:
                    r += self.buf[:j]
                    self.buf = self.buf[j + len(self.p.end):]
                    self.state, self.closed = "lead", True
                    continue
                cut = len(self.buf) if final else held_prefix(self.buf, 0, self.p.end)
                r += self.buf[:cut]
                self.buf = self.buf[cut:]
                break
            if self.state == "lead":  # the newlines between reasoning and content are the template's
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    break
                self.state = "content"
                continue
            c += self.buf
            self.buf = ""
            break
        self.reasoning += r
        return r, c
