#!/bin/bash
python3 - <<'EOF'
import sqlite3
db = sqlite3.connect("inventory.db")
db.execute("UPDATE products SET price = ROUND(price * 1.1, 2) WHERE category = 'books'")
db.execute("DELETE FROM products WHERE discontinued = 1")
db.execute("INSERT INTO products (name, category, price, discontinued) VALUES ('USB-C cable', 'electronics', 9.99, 0)")
db.commit()
EOF
