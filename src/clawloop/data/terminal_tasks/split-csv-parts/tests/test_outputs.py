from pathlib import Path


def parts():
    return sorted(Path("parts").glob("part_*.csv"))


def test_file_names():
    assert [p.name for p in parts()] == [f"part_{i:03d}.csv" for i in range(1, 6)]


def test_headers_and_sizes():
    header = Path("orders.csv").read_text().splitlines()[0]
    assert parts()
    for p in parts():
        lines = p.read_text().splitlines()
        assert lines[0] == header and 1 <= len(lines) - 1 <= 250


def test_rows_in_order():
    rows = Path("orders.csv").read_text().splitlines()[1:]
    got = [l for p in parts() for l in p.read_text().splitlines()[1:]]
    assert got == rows
