"""Arithmetic answers: what a response commits to, whether it equals the label, and problem files.

Shared by the math generator (its reward), the toolcall environment (the final
answer's outcome, the calls' partial credit) and the benches; a pure library, so
a generator file that users copy can import it without pulling in either.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str | None) -> str | None:
    """The answer a response commits to: the last \\boxed{...}, else the last number."""
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    nums = _NUMBER.findall(_DIGIT_COMMA.sub("", text))
    return nums[-1] if nums else None


def _to_number(s: str) -> float | None:
    s = _DIGIT_COMMA.sub("", s.strip().strip("$").replace(" ", ""))
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return float(a) / float(b)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def score_answer(text: str | None, label: Any) -> float:
    """1.0 when the response's answer equals the label (numerically when both parse), else 0.0."""
    pred = extract_answer(text)
    if pred is None or label is None:
        return 0.0
    gold = str(label)
    gold = _last_boxed(gold) or gold
    a, b = _to_number(pred), _to_number(gold)
    if a is not None and b is not None:
        return 1.0 if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) else 0.0
    return 1.0 if pred.strip().lower() == gold.strip().lower() else 0.0


def read_problems(path: str | Path) -> list[dict[str, Any]]:
    """A problems JSONL (`{"prompt" | "messages", "label", "instance_id"?}` a line); the line number is the
    instance id when none is given."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            p = json.loads(line)
            if "messages" not in p and "prompt" not in p:
                raise ValueError(f"{path}:{i + 1}: a problem needs 'prompt' or 'messages'")
            p.setdefault("instance_id", i)
            out.append(p)
    return out
