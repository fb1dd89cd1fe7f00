import csv
from decimal import Decimal
from pathlib import Path


def expected():
    rev = {}
    with open("sales.csv", newline="") as f:
        for row in csv.DictReader(f):
            rev[row["region"]] = rev.get(row["region"], Decimal(0)) + int(row["units"]) * Decimal(row["unit_price"])
    return [f"{r},{rev[r]:.2f}" for r in sorted(rev)]


def lines():
    return [l.strip() for l in Path("region_revenue.csv").read_text().splitlines() if l.strip()]


def test_header():
    assert lines()[0] == "region,revenue"


def test_revenue_per_region():
    assert lines()[1:] == expected()
