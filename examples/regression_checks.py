"""Checkers for examples/regression_set.jsonl (`"check": "examples/regression_checks.py:NAME"`).

A checker gets the reply (text, special tokens removed, stripped) and the line's
JSON object, and returns a bool or a score in [0, 1]. Extra keys on the line
(`expected` below) are yours: the gate passes the whole object.
"""

from __future__ import annotations

import re


def last_number_is(reply: str, case: dict) -> bool:
    """The last number in the reply is `case["expected"]`, whatever the wording around it."""
    numbers = re.findall(r"-?\d+", reply)
    return bool(numbers) and numbers[-1] == str(case["expected"])


def shouts(reply: str) -> float:
    """Share of the reply's letters in upper case (a partial score: 0.5 for half)."""
    letters = [c for c in reply if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0
