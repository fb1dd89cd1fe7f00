from pathlib import Path


def expected():
    files = sorted(str(p) for p in Path("src").rglob("*.py"))
    counts = [(Path(f).read_bytes().count(b"\n"), f) for f in files]
    return [f"{n} {f}" for n, f in counts] + [f"{sum(n for n, _ in counts)} total"]


def got():
    return [" ".join(l.split()) for l in Path("loc_report.txt").read_text().splitlines() if l.strip()]


def test_one_line_per_python_file():
    assert [l.split()[1] for l in got()[:-1]] == [l.split()[1] for l in expected()[:-1]]


def test_counts():
    assert got()[:-1] == expected()[:-1]


def test_total_line():
    assert got()[-1] == expected()[-1]
