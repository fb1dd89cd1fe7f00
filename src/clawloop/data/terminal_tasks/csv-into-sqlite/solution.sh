#!/bin/bash
python3 - <<'EOF'
import csv, sqlite3
db = sqlite3.connect("geo.db")
db.execute("CREATE TABLE cities (name TEXT, country TEXT, population INTEGER, area_km2 REAL)")
with open("cities.csv", newline="", encoding="utf-8") as f:
    rows = [(r["name"], r["country"], int(r["population"]), float(r["area_km2"])) for r in csv.DictReader(f)]
db.executemany("INSERT INTO cities VALUES (?, ?, ?, ?)", rows)
db.commit()
top = db.execute("SELECT name FROM cities ORDER BY population / area_km2 DESC LIMIT 3").fetchall()
open("densest.txt", "w", encoding="utf-8").write("".join(n + "\n" for (n,) in top))
EOF
