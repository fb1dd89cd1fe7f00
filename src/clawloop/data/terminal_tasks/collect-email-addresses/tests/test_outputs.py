from pathlib import Path

WANT = sorted(["bob.smith@example.com", "team@corp.example.org", "alice@corp.example.org",
               "carol_ng+lists@mail.example.net", "dave@startup.io", "support@help-desk.example.com",
               "noreply@startup.io", "ops-alerts@corp.example.org", "x.y-z@sub.domain.example.co.uk"])


def got():
    return [l.strip() for l in Path("addresses.txt").read_text().splitlines() if l.strip()]


def test_all_addresses_found():
    assert set(got()) == set(WANT)


def test_lower_case_sorted_unique():
    assert got() == WANT
