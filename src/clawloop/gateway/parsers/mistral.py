"""Mistral tool calls after the `[TOOL_CALLS]` control token, in either of Mistral's two forms:

    [TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "12+7"}}]   (v3 tokenizers: 7B v0.3, Nemo)
    [TOOL_CALLS]calculator[ARGS]{"expression": "12+7"}                           (v11+: Small 3.2, Magistral)

`[TOOL_CALLS]` is a special token: the gateway's detokenizer keeps it (`markers`) so the text shows it.
"""

from __future__ import annotations

import json
import re
import secrets
import string

from clawloop.gateway.parsers.base import Found, held_prefix, json_end, read_call_object, skip_ws

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAMED = re.compile(r"([^\[\]{}\s\"]+)" + re.escape(ARGS))


class MistralToolParser:
    name = "mistral"
    markers = (TOOL_CALLS, ARGS)
    trigger = TOOL_CALLS

    def find_start(self, text: str, pos: int) -> int | None:
        j = text.find(TOOL_CALLS, pos)
        return j if j >= 0 else None

    def hold(self, text: str, pos: int) -> int:
        return held_prefix(text, pos, TOOL_CALLS)

    def scan(self, section: str) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (j := section.find(TOOL_CALLS, pos)) >= 0:
            i = skip_ws(section, j + len(TOOL_CALLS))
            if i >= len(section):
                out.append(Found(j, len(section), None, "", False))
                return out
            if section[i] == "[":
                block = self._array(section, j, i + 1, out)
            else:
                block = self._named(section, j, i, out)
            if block is None:
                return out
            pos = block
        return out

    @staticmethod
    def _array(section: str, j: int, k: int, out: list[Found]) -> int | None:
        """The calls of `[{...}, {...}]`; the index past the block, None while it is open."""
        first = True
        while True:
            k = skip_ws(section, k)
            if k >= len(section):
                return None
            ch = section[k]
            if ch == "]":
                if first:  # `[TOOL_CALLS] []`: nothing, but not content either
                    out.append(Found(j, k + 1, None, "", True))
                else:
                    out[-1].end = k + 1
                return k + 1
            if ch == ",":
                k += 1
                continue
            if ch != "{":
                if first:
                    out.append(Found(j, k, None, "", True))
                return k
            f = read_call_object(section, k)
            if first:
                f.start, first = j, False
            else:
                out[-1].end = k  # the separator belongs to the block, not the content
            out.append(f)
            if not f.closed:
                return None
            k = f.end

    @staticmethod
    def _named(section: str, j: int, i: int, out: list[Found]) -> int | None:
        m = _NAMED.match(section, i)
        if m is None:
            rest = section[i:]
            if re.fullmatch(r"[^\[\]{}\s\"]*(\[(A(R(G(S)?)?)?)?)?", rest):  # the name or `[ARGS]` still coming
                out.append(Found(j, len(section), None, "", False))
                return None
            out.append(Found(j, i, None, "", True))
            return i
        a = m.end()
        if a < len(section) and section[a] != "{":
            out.append(Found(j, a, None, "", True))
            return a
        end = json_end(section, a) if a < len(section) else None
        f = Found(j, end if end is not None else len(section), m.group(1),
                  section[a:end] if end is not None else section[a:], end is not None)
        if end is not None:
            try:
                json.loads(f.args)
                f.call = {"name": f.name, "arguments": f.args}
            except json.JSONDecodeError:
                pass
        out.append(f)
        return end

    def new_id(self) -> str:
        """Mistral's templates refuse any call id but 9 letters and digits."""
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))

    def call_tag(self, name: str) -> tuple[str, str]:
        return f'{TOOL_CALLS} [{{"name": {json.dumps(name)}, "arguments": ', "}]"
