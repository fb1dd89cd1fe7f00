from pathlib import Path

WANT = """# Application settings
# listen_port = 80 was the old default
listen_port = 9090
admin_port = 8081
debug = true
log_level = warning
# cache_dir = /var/cache/app

[database]
host = db.internal
port = 5432
"""


def lines():
    return Path("app.conf").read_text().splitlines()


def test_listen_port():
    assert "listen_port = 9090" in lines() and "admin_port = 8081" in lines()


def test_debug_and_log_level():
    assert "debug = true" in lines() and "log_level = warning" in lines()


def test_cache_dir_disabled_rest_unchanged():
    assert Path("app.conf").read_text() == WANT
