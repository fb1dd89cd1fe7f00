"""Reasoning between two tags: Qwen3's `<think>` … `</think>` (also DeepSeek-R1's) and Magistral's
`[THINK]` … `[/THINK]`.

Qwen3's thinking models (Qwen3-*-Thinking-2507) open `<think>` in the generation prompt, so their
output holds only the end tag; the hybrid Qwen3 models write both tags themselves. Which case a
request is in is read off its own prompt (`starts_inside`), not guessed from the output.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkTags:
    name: str
    start: str
    end: str
    gap: str = ""
    """What the family's template writes between the end marker and the answer (Qwen3: two newlines);
    a grammar that constrains the answer lets the model write it first."""

    def starts_inside(self, prompt_tail: str) -> bool:
        i = prompt_tail.rfind(self.start)
        return i >= 0 and prompt_tail.rfind(self.end) < i


QWEN3 = ThinkTags("qwen3", "<think>", "</think>", "\n\n")
MISTRAL = ThinkTags("mistral", "[THINK]", "[/THINK]")
