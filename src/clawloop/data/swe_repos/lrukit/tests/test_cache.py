from lrukit import LRUCache


def test_get_put():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1
    assert c.get("missing", 0) == 0
    assert len(c) == 1


def test_evicts_least_recently_used():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert "b" not in c
    assert list(c.keys()) == ["a", "c"]


def test_put_existing_updates_and_uses():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.get("a") == 10
    assert "b" not in c
    assert len(c) == 2


def test_peek_does_not_use():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.peek("a") == 1
    c.put("c", 3)
    assert "a" not in c
    assert c.peek("zzz", -1) == -1


def test_on_evict_callback():
    evicted = []
    c = LRUCache(1, on_evict=lambda k, v: evicted.append((k, v)))
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert evicted == [("a", 1), ("b", 2)]


def test_delete():
    c = LRUCache(3)
    c.put("a", 1)
    c.put("b", 2)
    assert c.delete("a")
    assert not c.delete("a")
    assert list(c.keys()) == ["b"]


def test_keys_order():
    c = LRUCache(3)
    for k in "xyz":
        c.put(k, 0)
    c.get("x")
    assert list(c.keys()) == ["y", "z", "x"]


def test_hit_rate():
    c = LRUCache(2)
    assert c.hit_rate() == 0.0
    c.put("a", 1)
    c.get("a")
    c.get("b")
    c.get("a")
    assert c.hits == 2 and c.misses == 1
    assert abs(c.hit_rate() - 2 / 3) < 1e-12


def test_resize_evicts_oldest():
    evicted = []
    c = LRUCache(3, on_evict=lambda k, v: evicted.append(k))
    for k in "abc":
        c.put(k, k)
    c.resize(1)
    assert evicted == ["a", "b"]
    assert list(c.keys()) == ["c"]


def test_bad_capacity():
    for make in (lambda: LRUCache(0), lambda: LRUCache(2).resize(0)):
        try:
            make()
        except ValueError:
            continue
        raise AssertionError("a capacity of 0 should raise ValueError")


def test_capacity_one():
    c = LRUCache(1)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") is None
    assert c.get("b") == 2
