"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the reply *is* the call, a JSON object at its very start
(after `<|python_tag|>` where the model writes one), several separated by `;`.

    {"name": "calculator", "parameters": {"expression": "12+7"}}

`parameters` is Llama's key (its template asks for it); `arguments` is read too. A reply that begins
with text is content: Llama's template has the model answer with a call or with text, not both.
"""

from __future__ import annotations

import json

from clawloop.gateway.parsers.base import Found, new_call_id, read_call_object, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser:
    name = "llama3_json"
    markers = (PYTHON_TAG,)
    trigger = '{"name": '

    def find_start(self, text: str, pos: int) -> int | None:
        j = skip_ws(text, 0)
        if j < len(text) and (text[j] == "{" or text.startswith(PYTHON_TAG, j)):
            return j
        return None

    def hold(self, text: str, pos: int) -> int:
        j = skip_ws(text, 0)
        rest = text[j:]
        return j if rest and j >= pos and PYTHON_TAG.startswith(rest) and rest != PYTHON_TAG else len(text)

    def scan(self, section: str) -> list[Found]:
        out: list[Found] = []
        i = skip_ws(section, 0)
        if section.startswith(PYTHON_TAG, i):
            i += len(PYTHON_TAG)
        while True:
            i = skip_ws(section, i)
            if i >= len(section) or section[i] != "{":
                break
            f = read_call_object(section, i)
            if not out:
                f.start = 0
            out.append(f)
            if not f.closed:
                break
            k = skip_ws(section, f.end)
            if section.startswith(";", k):
                f.end = k + 1
                i = k + 1
                continue
            break
        return out

    def new_id(self) -> str:
        return new_call_id()

    def call_tag(self, name: str) -> tuple[str, str]:
        return f'{{"name": {json.dumps(name)}, "parameters": ', "}"
