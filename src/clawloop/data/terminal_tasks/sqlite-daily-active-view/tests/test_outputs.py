import sqlite3
from collections import defaultdict


def db():
    return sqlite3.connect("metrics.db")


def test_index():
    with db() as c:
        cols = [r[2] for r in c.execute("PRAGMA index_info('idx_events_user_time')")]
        table = c.execute("SELECT tbl_name FROM sqlite_master WHERE type = 'index' AND name = 'idx_events_user_time'").fetchone()
    assert cols == ["user_id", "created_at"] and table == ("events",)


def test_view_exists_with_columns():
    with db() as c:
        assert c.execute("SELECT type FROM sqlite_master WHERE name = 'daily_active_users'").fetchone() == ("view",)
        cur = c.execute("SELECT * FROM daily_active_users LIMIT 1")
        assert [d[0] for d in cur.description] == ["day", "users"]


def test_view_counts():
    users = defaultdict(set)
    with db() as c:
        for uid, ts in c.execute("SELECT user_id, created_at FROM events"):
            users[ts[:10]].add(uid)
        got = dict(c.execute("SELECT day, users FROM daily_active_users").fetchall())
    assert got == {d: len(u) for d, u in users.items()}
