from intervals import Interval, free_slots, gaps, merge, subtract, total_length


def test_interval_rejects_reversed():
    try:
        Interval(5, 1)
    except ValueError:
        return
    raise AssertionError("Interval(5, 1) should raise ValueError")


def test_length_and_empty():
    assert Interval(2, 7).length == 5
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()


def test_contains_half_open():
    iv = Interval(1, 4)
    assert iv.contains(1)
    assert iv.contains(3.5)
    assert not iv.contains(4)
    assert not iv.contains(0)


def test_covers():
    assert Interval(0, 10).covers(Interval(2, 10))
    assert not Interval(0, 10).covers(Interval(5, 11))


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(4, 9))
    assert Interval(4, 9).overlaps(Interval(1, 5))


def test_touching_is_not_overlapping():
    assert not Interval(1, 5).overlaps(Interval(5, 9))
    assert Interval(1, 5).touches(Interval(5, 9))
    assert not Interval(1, 5).touches(Interval(6, 9))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval(1, 3).intersection(Interval(4, 8)) is None


def test_hull():
    assert Interval(4, 6).hull(Interval(1, 2)) == Interval(1, 6)


def test_shift():
    assert Interval(1, 3).shift(-2) == Interval(-1, 1)


def test_split_at():
    assert Interval(0, 10).split_at(4) == (Interval(0, 4), Interval(4, 10))


def test_split_at_outside():
    try:
        Interval(0, 10).split_at(11)
    except ValueError:
        return
    raise AssertionError("split_at(11) on Interval(0, 10) should raise ValueError")


def test_ordering():
    assert sorted([Interval(3, 4), Interval(1, 9), Interval(1, 2)]) == [Interval(1, 2), Interval(1, 9), Interval(3, 4)]


def test_merge_overlapping_and_touching():
    got = merge([Interval(5, 8), Interval(1, 3), Interval(2, 4), Interval(8, 9)])
    assert got == [Interval(1, 4), Interval(5, 9)]


def test_merge_nested_and_empty():
    assert merge([Interval(1, 10), Interval(2, 3), Interval(4, 4)]) == [Interval(1, 10)]


def test_total_length():
    assert total_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]) == 7


def test_gaps():
    got = gaps([Interval(1, 3), Interval(5, 6)], Interval(0, 8))
    assert got == [Interval(0, 1), Interval(3, 5), Interval(6, 8)]


def test_gaps_clipped():
    assert gaps([Interval(-5, 2), Interval(7, 20)], Interval(0, 10)) == [Interval(2, 7)]


def test_gaps_none_free():
    assert gaps([Interval(0, 10)], Interval(2, 5)) == []


def test_subtract():
    assert subtract(Interval(0, 10), [Interval(2, 3), Interval(5, 7)]) == [Interval(0, 2), Interval(3, 5),
                                                                            Interval(7, 10)]


def test_free_slots_min_length():
    busy = [Interval(9, 10), Interval(10.5, 12), Interval(13, 17)]
    assert free_slots(busy, Interval(8, 18), min_length=1) == [Interval(8, 9), Interval(12, 13), Interval(17, 18)]
