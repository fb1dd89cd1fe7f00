"""Reading verdicts out of judge replies, and combining votes.

Pure functions, tested on hand-made inputs (tests/test_judge_voting.py).

Verdict: the content of the LAST `\\boxed{...}` in a reply. `1`, `+1`, `-1`
(ASCII or Unicode minus) and `0` are valid, optionally wrapped in `$`,
spaces or `\\text{}`; anything else — no box, an unclosed box, `\\boxed{2}`,
`\\boxed{yes}` — is a malformed vote (None). An earlier valid box does not
rescue a malformed last one: the last box is the answer.

Majority vote over N votes with threshold T (see `majority_vote`):
  1. malformed votes (None) are dropped; V = the valid ones;
  2. no valid vote -> score 0 (every vote counted as malformed);
  3. the verdict with the most votes wins; a tie for the most -> 0;
  4. the winner needs count >= T * len(V), else 0.
So with N=3, T=0.5: [1, 1, -1] -> 1; [1, -1, None] -> 0 (tie);
[1, None, None] -> 1 (1 of 1 valid); [1, 0, -1] -> 0 (tie).

Hints: the text between the last `[HINT_START]` and the `[HINT_END]` after
it. Among the votes whose verdict is positive (hint useful), the longest hint
longer than 10 characters is kept; none -> no hint.

Thinking models: `judged_text` picks what the verdict is read from. The answer
is the reply outside any `<think>...</think>` block (text after an unclosed
`<think>`, a reply cut off mid-thought, is neither answer nor read); when the answer holds no
`\\boxed{`, the reasoning (the `reasoning_content` / `reasoning` field, then
the closed think blocks) is read instead, so a verdict given only while
thinking still counts, and one given in the answer always wins.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

BOX = "\\boxed{"
HINT_START = "[HINT_START]"
HINT_END = "[HINT_END]"
MIN_HINT_CHARS = 10
"""A kept hint must be longer than this (shorter ones carry no instruction)."""

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_VALID = {"1": 1, "+1": 1, "-1": -1, "0": 0, "+0": 0, "-0": 0}
_TEXT_WRAP = re.compile(r"^\\(?:text|mathrm|textbf|mathbf)\{(.*)\}$", re.S)


def parse_boxed(reply: str | None) -> int | None:
    """The verdict in the last `\\boxed{...}` of `reply`: 1, -1, 0, or None if malformed."""
    if not reply:
        return None
    start = reply.rfind(BOX)
    if start < 0:
        return None
    i, depth = start + len(BOX), 1
    j = i
    while j < len(reply):
        c = reply[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        j += 1
    if depth != 0:
        return None  # unclosed box
    inner = reply[i:j].strip().strip("$").strip()
    m = _TEXT_WRAP.match(inner)
    if m:
        inner = m.group(1).strip()
    inner = inner.replace("\u2212", "-").replace("\u2013", "-").replace(" ", "")
    return _VALID.get(inner)


def split_thinking(content: str | None) -> tuple[str, str]:
    """(answer, thinking) of a reply that may inline its reasoning in `<think>` blocks.
    Text after an unclosed `<think>` is dropped: thinking cut off before it reached an answer."""
    answer, thinking = [], []
    rest = content or ""
    while True:
        i = rest.find(THINK_OPEN)
        j = rest.find(THINK_CLOSE)
        if j >= 0 and (i < 0 or j < i):  # a close with no open: a template that prefilled "<think>"
            thinking.append(rest[:j])
            rest = rest[j + len(THINK_CLOSE):]
            continue
        if i < 0:
            answer.append(rest)
            break
        answer.append(rest[:i])
        rest = rest[i + len(THINK_OPEN):]
        j = rest.find(THINK_CLOSE)
        if j < 0:
            break
        thinking.append(rest[:j])
        rest = rest[j + len(THINK_CLOSE):]
    return "".join(answer).strip(), "\n".join(t.strip() for t in thinking if t.strip())


def judged_text(content: str | None, reasoning: str | None = None) -> str:
    """The text a verdict and a hint are read from (see the module docstring)."""
    answer, inline = split_thinking(content)
    if BOX in answer:
        return answer
    thinking = "\n".join(t for t in ((reasoning or "").strip(), inline) if t)
    return f"{thinking}\n{answer}".strip() if thinking else answer


def parse_hint(reply: str | None) -> str | None:
    """The text between the last `[HINT_START]` and the following `[HINT_END]`, stripped."""
    if not reply:
        return None
    s = reply.rfind(HINT_START)
    if s < 0:
        return None
    e = reply.find(HINT_END, s + len(HINT_START))
    if e < 0:
        return None
    hint = reply[s + len(HINT_START):e].strip()
    return hint or None


def majority_vote(votes: Sequence[int | None], threshold: float) -> int:
    """Combine votes into a score in {-1, 0, 1}; the rule is in the module docstring."""
    valid = [v for v in votes if v is not None]
    if not valid:
        return 0
    counts = Counter(valid).most_common()
    top, n_top = counts[0]
    if len(counts) > 1 and counts[1][1] == n_top:
        return 0
    if n_top < threshold * len(valid) - 1e-9:
        return 0
    return int(top)


def vote_agreement(votes: Sequence[int | None], score: int) -> float | None:
    """Fraction of the valid votes equal to the final score (None without valid votes)."""
    valid = [v for v in votes if v is not None]
    if not valid:
        return None
    return sum(v == score for v in valid) / len(valid)


def usable_hints(votes: Sequence[tuple[int | None, str | None]]) -> list[str]:
    """Every distinct hint `select_hint` would accept, longest first (for the trainer's --hint-selection)."""
    out: list[str] = []
    for verdict, hint in votes:
        hint = (hint or "").strip()
        if verdict == 1 and len(hint) > MIN_HINT_CHARS and hint not in out:
            out.append(hint)
    return sorted(out, key=len, reverse=True)


def select_hint(votes: Sequence[tuple[int | None, str | None]]) -> str | None:
    """Among `(verdict, hint)` pairs with verdict 1, the longest hint over MIN_HINT_CHARS characters."""
    best: str | None = None
    for verdict, hint in votes:
        if verdict != 1 or not hint:
            continue
        hint = hint.strip()
        if len(hint) > MIN_HINT_CHARS and (best is None or len(hint) > len(best)):
            best = hint
    return best
