"""A list kept in sorted order, with binary search."""


class SortedList:
    def __init__(self, items=()):
        self._a = sorted(items)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return iter(self._a)

    def __repr__(self):
        return f"SortedList({self._a})"

    def bisect_left(self, x):
        """The first index whose item is >= x."""
        lo, hi = 0, len(self._a)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._a[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def bisect_right(self, x):
        """The first index whose item is > x."""
        lo, hi = 0, len(self._a)
        while lo < hi:
            mid = (lo + hi) // 2
            if x < self._a[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def add(self, x):
        self._a.insert(self.bisect_right(x), x)

    def remove(self, x):
        i = self.bisect_left(x)
        if i == len(self._a) or self._a[i] != x:
            raise ValueError(f"{x!r} is not in the list")
        del self._a[i]

    def __contains__(self, x):
        i = self.bisect_left(x)
        return i < len(self._a) and self._a[i] == x

    def count(self, x):
        return self.bisect_right(x) - self.bisect_left(x)

    def range(self, low, high):
        """Items with low <= item <= high, in order."""
        return self._a[self.bisect_left(low):self.bisect_right(high)]

    def nearest(self, x):
        """The item closest to `x` (the smaller one on a tie)."""
        if not self._a:
            raise ValueError("nearest in an empty list")
        i = self.bisect_left(x)
        if i == 0:
            return self._a[0]
        if i == len(self._a):
            return self._a[-1]
        before, after = self._a[i - 1], self._a[i]
        return before if x - before <= after - x else after
