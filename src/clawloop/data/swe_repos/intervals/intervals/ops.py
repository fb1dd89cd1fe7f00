"""Operations on lists of intervals."""

from intervals.interval import Interval


def merge(intervals):
    """Sorted, non-overlapping intervals covering the same points; touching intervals are joined."""
    out = []
    for iv in sorted(intervals):
        if iv.is_empty():
            continue
        if out and iv.start <= out[-1].end:
            last = out[-1]
            out[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            out.append(iv)
    return out


def total_length(intervals):
    """How much of the line the intervals cover (overlaps counted once)."""
    return sum(iv.length for iv in merge(intervals))


def gaps(intervals, within):
    """The parts of `within` that no interval covers, in order."""
    out = []
    cursor = within.start
    for iv in merge(intervals):
        if iv.end <= within.start or iv.start >= within.end:
            continue
        if iv.start > cursor:
            out.append(Interval(cursor, iv.start))
        cursor = max(cursor, iv.end)
    if cursor < within.end:
        out.append(Interval(cursor, within.end))
    return out


def subtract(interval, holes):
    """`interval` with every hole cut out: a list of the pieces left."""
    return gaps(holes, interval)


def free_slots(busy, day, min_length=1):
    """Free gaps in `day` between the `busy` intervals that are at least `min_length` long."""
    return [g for g in gaps(busy, day) if g.length >= min_length]
