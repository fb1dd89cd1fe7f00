import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "[^"]*" (\d{3}) (\S+)')


def entries():
    for line in Path("logs/access.log").read_text().splitlines():
        m = LINE.match(line)
        assert m, line
        yield m.group(1), int(m.group(2)), 0 if m.group(3) == "-" else int(m.group(3))


def expected():
    c = Counter(code for _, code, _ in entries())
    return [f"{code} {n}" for code, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]


def got():
    return [" ".join(l.split()) for l in Path("status_counts.txt").read_text().splitlines() if l.strip()]


def test_every_code_counted():
    assert sorted(got()) == sorted(expected())


def test_ordered_by_count():
    assert got() == expected()
