"""The half-open interval [start, end)."""


class Interval:
    __slots__ = ("start", "end")

    def __init__(self, start, end):
        if end < start:
            raise ValueError(f"interval end {end} is before its start {start}")
        self.start = start
        self.end = end

    def __repr__(self):
        return f"Interval({self.start}, {self.end})"

    def __eq__(self, other):
        return isinstance(other, Interval) and self.start == other.start and self.end == other.end

    def __hash__(self):
        return hash((self.start, self.end))

    def __lt__(self, other):
        return (self.start, self.end) < (other.start, other.end)

    @property
    def length(self):
        return self.end - self.start

    def is_empty(self):
        return self.start == self.end

    def contains(self, x):
        """True when the point `x` lies in the interval (the end is not included)."""
        return self.start <= x < self.end

    def covers(self, other):
        """True when `other` lies entirely inside this interval."""
        return self.start <= other.start and other.end <= self.end

    def overlaps(self, other):
        """True when the two share some length (touching at one point is not overlapping)."""
        return self.start < other.end and other.start < self.end

    def touches(self, other):
        """True when the two overlap or meet end to start."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other):
        """The common part, or None when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def hull(self, other):
        """The smallest interval holding both."""
        return Interval(min(self.start, other.start), max(self.end, other.end))

    def shift(self, delta):
        return Interval(self.start + delta, self.end + delta)

    def split_at(self, x):
        """Two intervals [start, x) and [x, end); ValueError when `x` is outside."""
        if not self.start <= x <= self.end:
            raise ValueError(f"{x} is outside {self!r}")
        return Interval(self.start, x), Interval(x, self.end)
