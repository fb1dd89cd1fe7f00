from lrukit import MinHeap, RingBuffer, SortedList


def test_ring_keeps_last_items():
    r = RingBuffer(3)
    for i in range(5):
        r.append(i)
    assert r.to_list() == [2, 3, 4]
    assert r.is_full()
    assert len(r) == 3


def test_ring_popleft():
    r = RingBuffer(2)
    r.append("a")
    r.append("b")
    r.append("c")
    assert r.popleft() == "b"
    r.append("d")
    assert r.to_list() == ["c", "d"]


def test_ring_pop_empty():
    try:
        RingBuffer(1).popleft()
    except IndexError:
        return
    raise AssertionError("popleft on an empty ring buffer should raise IndexError")


def test_ring_indexing():
    r = RingBuffer(4)
    for i in range(6):
        r.append(i * 10)
    assert r[0] == 20
    assert r[-1] == 50
    assert r[3] == 50


def test_ring_index_out_of_range():
    r = RingBuffer(3)
    r.append(1)
    for bad in (1, -2):
        try:
            r[bad]
        except IndexError:
            continue
        raise AssertionError(f"index {bad} of a one-item ring buffer should raise IndexError")


def test_heap_orders():
    h = MinHeap([5, 3, 8, 1, 9, 2])
    h.push(0)
    h.push(7)
    assert h.peek() == 0
    assert h.drain() == [0, 1, 2, 3, 5, 7, 8, 9]
    assert len(h) == 0


def test_heap_single_and_empty():
    h = MinHeap()
    h.push(4)
    assert h.pop() == 4
    try:
        h.pop()
    except IndexError:
        return
    raise AssertionError("pop from an empty heap should raise IndexError")


def test_heap_duplicates():
    h = MinHeap([2, 2, 1, 1, 3])
    assert h.drain() == [1, 1, 2, 2, 3]


def test_heap_sorts_many():
    items = [(i * 37) % 101 for i in range(60)]
    h = MinHeap()
    for x in items:
        h.push(x)
    assert h.drain() == sorted(items)


def test_sortedlist_add_and_iter():
    s = SortedList([5, 1, 3])
    s.add(4)
    s.add(0)
    s.add(6)
    assert list(s) == [0, 1, 3, 4, 5, 6]


def test_sortedlist_bisect():
    s = SortedList([1, 2, 2, 2, 5])
    assert s.bisect_left(2) == 1
    assert s.bisect_right(2) == 4
    assert s.bisect_left(0) == 0
    assert s.bisect_right(9) == 5
    assert s.count(2) == 3


def test_sortedlist_remove():
    s = SortedList([1, 2, 3])
    s.remove(2)
    assert list(s) == [1, 3]
    assert 3 in s and 2 not in s


def test_sortedlist_remove_missing():
    s = SortedList([1, 3])
    try:
        s.remove(2)
    except ValueError:
        return
    raise AssertionError("removing a missing item should raise ValueError")


def test_sortedlist_range():
    s = SortedList([1, 3, 5, 7, 9])
    assert s.range(3, 7) == [3, 5, 7]
    assert s.range(4, 4) == []
    assert s.range(0, 100) == [1, 3, 5, 7, 9]


def test_sortedlist_nearest():
    s = SortedList([10, 20, 30])
    assert s.nearest(14) == 10
    assert s.nearest(15) == 10
    assert s.nearest(16) == 20
    assert s.nearest(-5) == 10
    assert s.nearest(99) == 30
