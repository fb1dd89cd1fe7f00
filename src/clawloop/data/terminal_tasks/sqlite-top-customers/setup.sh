#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random, sqlite3
rng = random.Random(13)
db = sqlite3.connect("shop.db")
db.executescript("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);"
                 "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
                 "amount REAL NOT NULL, status TEXT NOT NULL);")
countries = ["DE", "FR", "US", "JP", "BR", "IN"]
for i in range(1, 31):
    db.execute("INSERT INTO customers VALUES (?, ?, ?)", (i, f"Customer {i:02d}", rng.choice(countries)))
for i in range(1, 501):
    status = rng.choice(["paid"] * 6 + ["refunded", "pending"])
    amount = round(rng.uniform(5, 400), 2) if i != 77 else 5000.0
    db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (i, rng.randint(1, 30), amount, "refunded" if i == 77 else status))
db.commit()
EOF
