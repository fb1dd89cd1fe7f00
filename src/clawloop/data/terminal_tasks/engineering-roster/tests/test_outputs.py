import csv
from pathlib import Path


def expected():
    with open("employees.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["department"] == "Engineering"]
    rows.sort(key=lambda r: -int(r["salary"]))
    return [[r["name"], r["email"], r["salary"]] for r in rows]


def got():
    with open("engineering.csv", newline="") as f:
        return [r for r in csv.reader(f) if r]


def test_header():
    assert got()[0] == ["name", "email", "salary"]


def test_only_engineering():
    assert sorted(map(tuple, got()[1:])) == sorted(map(tuple, expected()))


def test_sorted_by_salary():
    assert got()[1:] == expected()
