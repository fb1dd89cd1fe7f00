from pathlib import Path


def expected():
    out = []
    for line in Path("app.log").read_text().splitlines():
        date, time, level = line.split()[:3]
        if date == "2024-03-05" and "14:00:00" <= time <= "14:59:59" and level in ("ERROR", "CRITICAL"):
            out.append(line)
    return out


def got():
    return Path("incident.log").read_text().splitlines()


def test_boundaries_included():
    lines = got()
    assert "2024-03-05 14:00:00 ERROR    [svc] boundary start" in lines
    assert "2024-03-05 14:59:59 CRITICAL [svc] boundary end" in lines


def test_exact_lines_in_order():
    assert got() == expected()
