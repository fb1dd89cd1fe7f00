import os
from pathlib import Path


def expected():
    out = []
    for root, _, files in os.walk("data"):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p) and os.path.getsize(p) > 102400:
                out.append((os.path.getsize(p), p))
    return sorted(out, reverse=True)


def lines():
    return [l for l in Path("large_files.txt").read_text().splitlines() if l.strip()]


def test_lists_exactly_the_large_files():
    got = {l.split(" ", 1)[1].strip().removeprefix("./") for l in lines()}
    assert got == {p for _, p in expected()}


def test_sizes_and_order():
    got = [(int(l.split(" ", 1)[0]), l.split(" ", 1)[1].strip().removeprefix("./")) for l in lines()]
    assert got == expected()
