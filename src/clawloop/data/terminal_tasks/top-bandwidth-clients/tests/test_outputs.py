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
    c = Counter()
    for ip, _, size in entries():
        c[ip] += size
    return [f"{ip} {n}" for ip, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]


def got():
    return [" ".join(l.split()) for l in Path("top_clients.txt").read_text().splitlines() if l.strip()]


def test_three_lines():
    assert len(got()) == 3


def test_top_clients_and_totals():
    assert got() == expected()
