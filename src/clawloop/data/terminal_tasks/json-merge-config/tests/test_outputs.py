import json

WANT = {
    "app": {"name": "shop", "debug": False, "workers": 16, "features": {"search": True, "recommendations": True}},
    "db": {"host": "db.prod.internal", "port": 5432, "pool": {"min": 1, "max": 50}, "replicas": ["r2", "r3"]},
    "allowed_hosts": ["shop.example.com"],
    "metrics": {"enabled": True, "endpoint": "https://metrics.example.com"},
    "sentry_dsn": "https://key@sentry.example.com/1",
}


def cfg():
    return json.load(open("config.json"))


def test_nested_objects_merged():
    c = cfg()
    assert c["db"]["port"] == 5432 and c["db"]["pool"] == {"min": 1, "max": 50} and c["app"]["name"] == "shop"


def test_nulls_remove_keys_lists_replace():
    c = cfg()
    assert "cache" not in c and "beta_ui" not in c["app"]["features"]
    assert c["allowed_hosts"] == ["shop.example.com"] and c["db"]["replicas"] == ["r2", "r3"]


def test_whole_result():
    assert cfg() == WANT
