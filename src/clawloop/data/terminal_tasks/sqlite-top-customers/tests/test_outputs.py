import sqlite3
from pathlib import Path

JOIN = "FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.status = 'paid'"


def query(sql):
    with sqlite3.connect("shop.db") as db:
        return db.execute(sql).fetchall()


def test_top_customer():
    name, total = query(f"SELECT c.name, SUM(o.amount) t {JOIN} GROUP BY c.id ORDER BY t DESC LIMIT 1")[0]
    assert Path("top_customer.txt").read_text().strip() == f"{name},{total:.2f}"


def test_revenue_by_country():
    rows = query(f"SELECT c.country, SUM(o.amount) r {JOIN} GROUP BY c.country ORDER BY r DESC")
    got = [l.strip() for l in Path("revenue_by_country.csv").read_text().splitlines() if l.strip()]
    assert got == ["country,revenue"] + [f"{c},{r:.2f}" for c, r in rows]
