#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import sqlite3

PRODUCTS = [  # id, name, category, price, discontinued
    (1, "Dune", "books", 9.99, 0), (2, "SICP", "books", 45.0, 0), (3, "Old Atlas", "books", 12.5, 1),
    (4, "Kettle", "kitchen", 29.9, 0), (5, "Toaster", "kitchen", 24.0, 1), (6, "HDMI cable", "electronics", 7.49, 0),
    (7, "Neuromancer", "books", 8.75, 0), (8, "Mouse", "electronics", 19.99, 0), (9, "Fax machine", "electronics", 89.0, 1),
    (10, "Spatula", "kitchen", 4.25, 0), (11, "The Hobbit", "books", 11.11, 0),
]

db = sqlite3.connect("inventory.db")
db.execute("CREATE TABLE products (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, category TEXT NOT NULL, "
           "price REAL NOT NULL, discontinued INTEGER NOT NULL DEFAULT 0)")
db.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?)", PRODUCTS)
db.commit()
EOF
