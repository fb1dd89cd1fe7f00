"""The LLM judge's two prompts, in our own words.

`score_messages` asks for a three-way verdict on the next state; the reply
ends in `\\boxed{1}`, `\\boxed{-1}` or `\\boxed{0}`. `hint_messages` asks
whether the next state reveals what the assistant should have done and, if
so, for a 1-3 sentence hint between [HINT_START] and [HINT_END], with
`\\boxed{1}` (useful hint) or `\\boxed{-1}` (nothing to learn).

With `images` (data URLs: the screenshot a GUI step led to, for a judge model that takes images) the user
message is a list of parts: the text, then each image.
"""

from __future__ import annotations

from typing import Any

from clawloop.judge.base import text_of
from clawloop.judge.voting import HINT_END, HINT_START

CONTEXT_MESSAGES = 6
"""How many messages before the reply the judge sees."""
MAX_CHARS = 4000
"""Longer texts are cut in the middle (head and tail are kept)."""

SCORE_SYSTEM = "You review one step of a conversation between a user and an AI assistant. You are strict and brief."

SCORE_TEMPLATE = """Below is the end of a conversation, the assistant's reply, and what came right after the reply \
(the "next state"): either the user's next message or the output of a tool the assistant called.

Judge the assistant's reply ONLY by what the next state reveals about it:
- \\boxed{{1}}  success or progress: the user thanks or praises the assistant, accepts the answer, or moves on to \
a new request; or the tool ran and returned a result without an error.
- \\boxed{{-1}} a problem: the user corrects the assistant, says it is wrong, asks for a redo or a different form, \
repeats or rephrases the same request, or reports an error; or the tool returned an error, a stack trace, \
a failure status or a non-zero exit code.
- \\boxed{{0}}  ambiguous: small talk, an empty message, or nothing that tells success from failure.

### Conversation before the reply
{context}

### Assistant reply
{response}

### Next state (role: {role})
{next_state}

Give one short sentence of reasoning, then end with exactly one of \\boxed{{1}}, \\boxed{{-1}} or \\boxed{{0}}."""

HINT_SYSTEM = ("You help an AI assistant learn from feedback. You write short, concrete instructions that would have "
               "made its reply right the first time.")

HINT_TEMPLATE = """Below is the end of a conversation, the assistant's reply, and what came right after it (the \
"next state"): the user's next message or the output of a tool the assistant called.

Does the next state reveal something the assistant should have done differently — a preference or format the user \
wants, a missing requirement, a factual correction, or an error that points to the fix?

- If yes: write a hint of 1 to 3 sentences, phrased as an instruction to the assistant (for example "Answer with just \
the number." or "Pass the city name, not the country, to get_weather."), between {start} and {end}, then end with \
\\boxed{{1}}.
- If not (the user is satisfied, moves on, or says nothing useful): write no hint and end with \\boxed{{-1}}.

### Conversation before the reply
{context}

### Assistant reply
{response}

### Next state (role: {role})
{next_state}"""


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n[... cut ...]\n" + text[-half:]


def render_context(messages: list[dict[str, Any]], n: int = CONTEXT_MESSAGES) -> str:
    if not messages:
        return "(none)"
    lines = []
    for m in messages[-n:]:
        content = text_of(m.get("content"))
        if m.get("tool_calls"):
            names = ", ".join(str(c.get("function", c).get("name", "?")) for c in m["tool_calls"])
            content = (content + f"\n[tool calls: {names}]").strip()
        lines.append(f"[{m.get('role', '?')}] {_cut(content, MAX_CHARS // 2)}")
    return "\n".join(lines)


def _fill(template: str, messages: list[dict[str, Any]], response: str, next_state: dict[str, Any]) -> str:
    content = text_of(next_state.get("content"))
    return template.format(
        context=render_context(messages),
        response=_cut(response) or "(empty)",
        role=next_state.get("role", "user"),
        next_state=_cut(content) if content.strip() else "(empty)",
        start=HINT_START, end=HINT_END,
    )


IMAGES_NOTE = "\n\nThe screenshot of the next state follows."


def _user(text: str, images: list[str] | None) -> dict[str, Any]:
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "text", "text": text + IMAGES_NOTE},
                                        *({"type": "image_url", "image_url": {"url": u}} for u in images)]}


def score_messages(messages: list[dict[str, Any]], response: str, next_state: dict[str, Any],
                   images: list[str] | None = None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SCORE_SYSTEM},
            _user(_fill(SCORE_TEMPLATE, messages, response, next_state), images)]


def hint_messages(messages: list[dict[str, Any]], response: str, next_state: dict[str, Any],
                  images: list[str] | None = None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": HINT_SYSTEM},
            _user(_fill(HINT_TEMPLATE, messages, response, next_state), images)]


def image_urls(content: Any) -> list[str]:
    """The data URLs of a message content's image parts (references to stored images are not data)."""
    if not isinstance(content, list):
        return []
    return [u for p in content if isinstance(p, dict) and p.get("type") == "image_url"
            and isinstance(p.get("image_url"), dict)
            and isinstance(u := p["image_url"].get("url"), str) and u.startswith("data:")]
