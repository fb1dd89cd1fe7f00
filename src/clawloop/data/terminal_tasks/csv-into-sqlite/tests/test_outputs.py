import csv
import sqlite3
from pathlib import Path


def source():
    with open("cities.csv", newline="", encoding="utf-8") as f:
        return [(r["name"], r["country"], int(r["population"]), float(r["area_km2"])) for r in csv.DictReader(f)]


def test_all_rows_loaded():
    with sqlite3.connect("geo.db") as db:
        got = db.execute("SELECT name, country, population, area_km2 FROM cities").fetchall()
    assert sorted(got) == sorted(source())


def test_numbers_stored_as_numbers():
    with sqlite3.connect("geo.db") as db:
        kinds = set(db.execute("SELECT typeof(population), typeof(area_km2) FROM cities").fetchall())
    assert kinds == {("integer", "real")}


def test_densest():
    want = [n for n, _, p, a in sorted(source(), key=lambda r: -r[2] / r[3])[:3]]
    got = [l.strip() for l in Path("densest.txt").read_text(encoding="utf-8").splitlines() if l.strip()]
    assert got == want
