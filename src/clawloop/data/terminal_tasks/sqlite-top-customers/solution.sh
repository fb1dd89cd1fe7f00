#!/bin/bash
python3 - <<'EOF'
import sqlite3
db = sqlite3.connect("shop.db")
name, total = db.execute("SELECT c.name, SUM(o.amount) AS t FROM orders o JOIN customers c ON c.id = o.customer_id "
                         "WHERE o.status = 'paid' GROUP BY c.id ORDER BY t DESC LIMIT 1").fetchone()
open("top_customer.txt", "w").write(f"{name},{total:.2f}\n")
rows = db.execute("SELECT c.country, SUM(o.amount) AS r FROM orders o JOIN customers c ON c.id = o.customer_id "
                  "WHERE o.status = 'paid' GROUP BY c.country ORDER BY r DESC").fetchall()
open("revenue_by_country.csv", "w").write("country,revenue\n" + "".join(f"{c},{r:.2f}\n" for c, r in rows))
EOF
