"""Calendar arithmetic and inclusive date ranges."""

from datetime import date, timedelta

DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"month must be 1..12, not {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return DAYS_IN_MONTH[month - 1]


def add_months(day, months):
    """`day` moved by `months` calendar months; the day of month is clamped (Jan 31 + 1 month = Feb 28/29)."""
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    return date(year, month, min(day.day, days_in_month(year, month)))


class DateRange:
    """All days from `start` to `end`, both included."""

    def __init__(self, start, end):
        if end < start:
            raise ValueError(f"range end {end} is before its start {start}")
        self.start = start
        self.end = end

    def __repr__(self):
        return f"DateRange({self.start.isoformat()}, {self.end.isoformat()})"

    def __eq__(self, other):
        return isinstance(other, DateRange) and (self.start, self.end) == (other.start, other.end)

    def __contains__(self, day):
        return self.start <= day <= self.end

    def days(self):
        """How many days the range holds."""
        return (self.end - self.start).days + 1

    def __iter__(self):
        day = self.start
        while day <= self.end:
            yield day
            day += timedelta(days=1)

    def weekdays(self):
        """How many days are Monday to Friday."""
        full_weeks, extra = divmod(self.days(), 7)
        count = full_weeks * 5
        first = self.start.weekday()
        for k in range(extra):
            if (first + k) % 7 < 5:
                count += 1
        return count

    def overlap(self, other):
        """The days both ranges hold, as a DateRange, or None."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start > end:
            return None
        return DateRange(start, end)

    def split_by_month(self):
        """The range cut at month boundaries, in order."""
        pieces = []
        start = self.start
        while start <= self.end:
            month_end = date(start.year, start.month, days_in_month(start.year, start.month))
            end = min(month_end, self.end)
            pieces.append(DateRange(start, end))
            start = end + timedelta(days=1)
        return pieces
