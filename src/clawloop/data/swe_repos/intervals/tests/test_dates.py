from datetime import date

from intervals import DateRange, add_months, days_in_month, is_leap_year


def test_leap_years():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)
    assert is_leap_year(2000)


def test_days_in_month():
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2024, 12) == 31
    assert days_in_month(2024, 4) == 30


def test_days_in_month_bad_month():
    try:
        days_in_month(2024, 13)
    except ValueError:
        return
    raise AssertionError("days_in_month(2024, 13) should raise ValueError")


def test_add_months_clamps():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)


def test_add_months_across_years():
    assert add_months(date(2023, 11, 15), 3) == date(2024, 2, 15)
    assert add_months(date(2024, 1, 10), -1) == date(2023, 12, 10)
    assert add_months(date(2024, 5, 10), -17) == date(2022, 12, 10)


def test_range_days():
    assert DateRange(date(2024, 2, 27), date(2024, 3, 2)).days() == 5
    assert DateRange(date(2024, 1, 1), date(2024, 1, 1)).days() == 1


def test_range_rejects_reversed():
    try:
        DateRange(date(2024, 1, 2), date(2024, 1, 1))
    except ValueError:
        return
    raise AssertionError("a range ending before it starts should raise ValueError")


def test_range_contains():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 31))
    assert date(2024, 1, 31) in r
    assert date(2024, 1, 1) in r
    assert date(2024, 2, 1) not in r


def test_range_iter():
    days = list(DateRange(date(2023, 12, 30), date(2024, 1, 2)))
    assert days == [date(2023, 12, 30), date(2023, 12, 31), date(2024, 1, 1), date(2024, 1, 2)]


def test_weekdays():
    # 2024-01-01 is a Monday.
    assert DateRange(date(2024, 1, 1), date(2024, 1, 7)).weekdays() == 5
    assert DateRange(date(2024, 1, 5), date(2024, 1, 8)).weekdays() == 2
    assert DateRange(date(2024, 1, 1), date(2024, 1, 31)).weekdays() == 23


def test_weekdays_weekend_only():
    assert DateRange(date(2024, 1, 6), date(2024, 1, 7)).weekdays() == 0


def test_overlap():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 10), date(2024, 1, 20))
    assert a.overlap(b) == DateRange(date(2024, 1, 10), date(2024, 1, 10))
    assert a.overlap(DateRange(date(2024, 1, 11), date(2024, 1, 12))) is None


def test_split_by_month():
    pieces = DateRange(date(2024, 1, 30), date(2024, 3, 2)).split_by_month()
    assert pieces == [DateRange(date(2024, 1, 30), date(2024, 1, 31)), DateRange(date(2024, 2, 1), date(2024, 2, 29)),
                      DateRange(date(2024, 3, 1), date(2024, 3, 2))]


def test_repr():
    assert repr(DateRange(date(2024, 1, 1), date(2024, 1, 2))) == "DateRange(2024-01-01, 2024-01-02)"
