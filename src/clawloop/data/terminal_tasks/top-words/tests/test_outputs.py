import re
from collections import Counter
from pathlib import Path


def expected():
    c = Counter(re.findall(r"[a-z]+", Path("book.txt").read_text().lower()))
    return [f"{n} {w}" for w, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]


def got():
    return [" ".join(l.split()) for l in Path("top_words.txt").read_text().splitlines() if l.strip()]


def test_ten_lines():
    assert len(got()) == 10


def test_words_and_counts():
    assert sorted(got()) == sorted(expected())


def test_order():
    assert got() == expected()
