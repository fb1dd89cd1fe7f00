PRODUCTS = [  # id, name, category, price, discontinued
    (1, "Dune", "books", 9.99, 0), (2, "SICP", "books", 45.0, 0), (3, "Old Atlas", "books", 12.5, 1),
    (4, "Kettle", "kitchen", 29.9, 0), (5, "Toaster", "kitchen", 24.0, 1), (6, "HDMI cable", "electronics", 7.49, 0),
    (7, "Neuromancer", "books", 8.75, 0), (8, "Mouse", "electronics", 19.99, 0), (9, "Fax machine", "electronics", 89.0, 1),
    (10, "Spatula", "kitchen", 4.25, 0), (11, "The Hobbit", "books", 11.11, 0),
]

import sqlite3


def rows():
    with sqlite3.connect("inventory.db") as db:
        return {r[1]: r for r in db.execute("SELECT id, name, category, price, discontinued FROM products")}


def test_book_prices_raised():
    got = rows()
    books = [p for p in PRODUCTS if p[2] == "books" and not p[4]]
    for _, name, _, price, _ in books:  # either rounding of a tie (9.625) is fine
        new = got[name][3]
        assert abs(new - price * 1.1) <= 0.005 + 1e-9 and abs(new * 100 - round(new * 100)) < 1e-6, (name, new)


def test_discontinued_deleted_and_others_kept():
    got = rows()
    assert not [r for r in got.values() if r[4]]
    kept = {p[1] for p in PRODUCTS if not p[4]}
    assert set(got) == kept | {"USB-C cable"}
    assert abs(got["Kettle"][3] - 29.9) < 1e-9


def test_new_product():
    r = rows()["USB-C cable"]
    assert r[2] == "electronics" and abs(r[3] - 9.99) < 1e-9 and r[4] == 0
