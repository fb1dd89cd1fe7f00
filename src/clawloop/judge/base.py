"""What every judge is: an object with a `name` and `async judge(turn) -> Judgement`.

The name keys the store: a turn is judged once per name, so two judge
configurations (say `offline` and `url:qwen`) keep separate verdicts.

A judge signals "I could not judge this now" by raising `JudgeUnavailable`
(endpoint down, HTTP error, timeout); the judge loop then leaves the turn
pending and retries it later. It never returns a made-up verdict instead.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from clawloop.records import Judgement, Turn


class JudgeUnavailable(RuntimeError):
    """The judge could not produce a verdict now (down, HTTP error, garbage); retry later."""


@runtime_checkable
class Judge(Protocol):
    name: str
    """Store key of this judge configuration (`offline`, `self`, `url:MODEL`, `custom:PATH`)."""

    async def judge(self, turn: Turn) -> Judgement:
        """Score one turn from its next state. Raise `JudgeUnavailable` to leave it pending."""
        ...

    async def close(self) -> None:
        """Release clients and engines the judge owns."""
        ...


def text_of(content: Any) -> str:
    """Message content as plain text (OpenAI content parts are joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text", "")) if p.get("type", "text") == "text" else "")
            else:
                parts.append(str(p))
        return "".join(parts)
    return str(content)


def last_user_message(messages: list[dict[str, Any]]) -> str | None:
    """The text of the last user message: the request the response answered."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return text_of(m.get("content"))
    return None


def response_of(turn: Turn) -> str:
    """The assistant's output as a judge reads it: text, then its tool calls."""
    import json

    out = turn.response_text or ""
    for call in turn.tool_calls or []:
        fn = call.get("function", call)
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out += f"\n[tool call] {fn.get('name', '?')}({args})"
    return out.strip()
