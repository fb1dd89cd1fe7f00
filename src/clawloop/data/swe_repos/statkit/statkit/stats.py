"""Statistics of sequences of numbers."""

import math


def _need(data, n=1):
    if len(data) < n:
        raise ValueError(f"need at least {n} value(s), got {len(data)}")


def mean(data):
    _need(data)
    return sum(data) / len(data)


def median(data):
    _need(data)
    ordered = sorted(data)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mode(data):
    """The most common value; ties go to the value seen first."""
    _need(data)
    counts = {}
    for x in data:
        counts[x] = counts.get(x, 0) + 1
    best = data[0]
    for x in counts:
        if counts[x] > counts[best]:
            best = x
    return best


def variance(data, sample=True):
    """Sample variance (n - 1 in the denominator) or, with sample=False, the population's."""
    _need(data, 2 if sample else 1)
    m = mean(data)
    squares = sum((x - m) ** 2 for x in data)
    return squares / (len(data) - 1 if sample else len(data))


def stdev(data, sample=True):
    return math.sqrt(variance(data, sample))


def percentile(data, p):
    """The p-th percentile (0..100) with linear interpolation between closest ranks."""
    _need(data)
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in 0..100, not {p}")
    ordered = sorted(data)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def zscores(data):
    """How many (sample) standard deviations each value is from the mean."""
    m = mean(data)
    s = stdev(data)
    if s == 0:
        raise ValueError("all values are equal: z-scores are undefined")
    return [(x - m) / s for x in data]


def correlation(xs, ys):
    """Pearson's r."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    _need(xs, 2)
    mx, my = mean(xs), mean(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        raise ValueError("a constant series has no correlation")
    return cov / (sx * sy)


def linear_fit(xs, ys):
    """Least-squares line through the points: (slope, intercept)."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    _need(xs, 2)
    mx, my = mean(xs), mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all x are equal: the slope is undefined")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    return slope, my - slope * mx


def moving_average(data, window):
    """Means of each run of `window` consecutive values."""
    if window < 1:
        raise ValueError("window must be at least 1")
    out = []
    total = sum(data[:window])
    if len(data) < window:
        return out
    out.append(total / window)
    for i in range(window, len(data)):
        total += data[i] - data[i - window]
        out.append(total / window)
    return out


def histogram(data, bins, low, high):
    """Counts of values in `bins` equal-width bins over [low, high]; the last bin includes `high`,
    values outside are not counted."""
    if bins < 1 or high <= low:
        raise ValueError("need bins >= 1 and high > low")
    counts = [0] * bins
    width = (high - low) / bins
    for x in data:
        if x < low or x > high:
            continue
        i = int((x - low) / width)
        if i == bins:
            i -= 1
        counts[i] += 1
    return counts
