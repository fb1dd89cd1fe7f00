"""Hermes / Qwen2.5 / Qwen3 tool calls: one JSON object per `<tool_call>` block, anywhere in the reply.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12+7"}}
    </tool_call>

A block whose JSON is not a call (no `name`) stays in the content, so nothing the model wrote is lost.
"""

from __future__ import annotations

import json

from clawloop.gateway.parsers.base import Found, call_of, held_prefix, new_call_id, read_call_object, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser:
    name = "hermes"
    markers = (OPEN, CLOSE)
    trigger = OPEN

    def find_start(self, text: str, pos: int) -> int | None:
        j = text.find(OPEN, pos)
        return j if j >= 0 else None

    def hold(self, text: str, pos: int) -> int:
        return held_prefix(text, pos, OPEN)

    def scan(self, section: str) -> list[Found]:
        out: list[Found] = []
        pos = 0
        while (j := section.find(OPEN, pos)) >= 0:
            i = skip_ws(section, j + len(OPEN))
            if i < len(section) and section[i] == "{":
                f = read_call_object(section, i)
                f.start = j
                if f.closed:
                    after = skip_ws(section, f.end)
                    if section.startswith(CLOSE, after):
                        f.end = after + len(CLOSE)
                    elif CLOSE.startswith(section[after:]):  # the close still to come (or cut short)
                        f.end = len(section)
                    else:  # more inside the block than one object: read it whole, as another shape
                        f = self._whole(section, j, i)
            else:
                f = self._whole(section, j, i)
            out.append(f)
            if not f.closed:
                break
            pos = f.end
        return out

    @staticmethod
    def _whole(section: str, j: int, i: int) -> Found:
        c = section.find(CLOSE, i)
        if c < 0:
            return Found(j, len(section), None, "", False, streamable=False)
        try:
            call = call_of(json.loads(section[i:c]))
        except json.JSONDecodeError:
            call = None
        return Found(j, c + len(CLOSE), call["name"] if call else None, "", True, call, streamable=False)

    def new_id(self) -> str:
        return new_call_id()

    def call_tag(self, name: str) -> tuple[str, str]:
        return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": ', f"}}\n{CLOSE}"
