"""Reasoning and tool-call parsers, one small module per model family behind two Protocols (base.py).

    reasoning, tools = select_parsers("auto", "auto", tokenizer.chat_template)

| name (aliases)                      | family                                            | module     |
|-------------------------------------|---------------------------------------------------|------------|
| reasoning `qwen3`                   | `<think>` … `</think>` (also DeepSeek-R1's)       | think.py   |
| reasoning `mistral`                 | `[THINK]` … `[/THINK]` (Magistral)                | think.py   |
| tools `hermes` (`qwen25`)           | `<tool_call>{json}</tool_call>`                   | hermes.py  |
| tools `llama3_json`                 | the reply is `{"name", "parameters"}` (`;`-joined)| llama3.py  |
| tools `mistral`                     | `[TOOL_CALLS] [{...}]` or `[TOOL_CALLS]name[ARGS]{...}` | mistral.py |

`auto` reads the chat template: the tags it writes are the tags the model was trained to write.
"""

from __future__ import annotations

from clawloop.gateway.parsers.base import Found, ReasoningParser, ReasoningSplit, ToolParser, ToolStream
from clawloop.gateway.parsers.hermes import HermesToolParser
from clawloop.gateway.parsers.llama3 import Llama3JsonToolParser
from clawloop.gateway.parsers.mistral import MistralToolParser
from clawloop.gateway.parsers.think import MISTRAL, QWEN3, ThinkTags

REASONING_PARSERS: dict[str, ThinkTags | None] = {"none": None, "qwen3": QWEN3, "mistral": MISTRAL}
TOOL_PARSERS = {"hermes": HermesToolParser, "qwen25": HermesToolParser, "llama3_json": Llama3JsonToolParser,
                "mistral": MistralToolParser}
REASONING_CHOICES = ("auto", *REASONING_PARSERS)
TOOL_CHOICES = ("auto", *TOOL_PARSERS)


def detect_reasoning(template: str | None) -> str:
    t = template or ""
    if "</think>" in t:
        return "qwen3"
    if "[/THINK]" in t:
        return "mistral"
    return "none"


def detect_tools(template: str | None) -> str:
    t = template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "parameters" in t):
        return "llama3_json"
    return "hermes"  # what the embedded tiny model writes


def select_parsers(reasoning: str, tools: str, template: str | None) -> tuple[ReasoningParser | None, ToolParser]:
    """The (reasoning, tool) parsers named, `auto` resolved from the chat template; ValueError for a name
    that is not one."""
    r = detect_reasoning(template) if reasoning == "auto" else reasoning
    t = detect_tools(template) if tools == "auto" else tools
    if r not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {reasoning!r} (one of {', '.join(REASONING_CHOICES)})")
    if t not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {tools!r} (one of {', '.join(TOOL_CHOICES)})")
    return REASONING_PARSERS[r], TOOL_PARSERS[t]()


def strip_inline_reasoning(text: str) -> str:
    """`text` without a leading reasoning block written inline (`<think>…</think>`, `[THINK]…[/THINK]`):
    what a client that folds the reasoning back into the content sends back."""
    s = text.lstrip()
    for p in (QWEN3, MISTRAL):
        if s.startswith(p.start) and (j := s.find(p.end)) >= 0:
            return s[j + len(p.end):]
    return text


__all__ = ["Found", "ReasoningParser", "ReasoningSplit", "ToolParser", "ToolStream", "select_parsers",
           "detect_reasoning", "detect_tools", "strip_inline_reasoning", "REASONING_CHOICES", "TOOL_CHOICES",
           "HermesToolParser", "Llama3JsonToolParser", "MistralToolParser", "ThinkTags", "QWEN3", "MISTRAL"]
