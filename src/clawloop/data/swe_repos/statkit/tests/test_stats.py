import math

from statkit import (correlation, histogram, linear_fit, mean, median, mode, moving_average, percentile, stdev,
                     variance, zscores)


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    try:
        mean([])
    except ValueError:
        return
    raise AssertionError("mean([]) should raise ValueError")


def test_median_odd_even():
    assert median([3, 1, 4, 1, 5]) == 3
    assert median([4, 1, 3, 2]) == 2.5


def test_median_single():
    assert median([7]) == 7


def test_mode():
    assert mode([1, 2, 2, 3, 3, 3]) == 3


def test_mode_tie_first_seen():
    assert mode(["b", "a", "a", "b", "c"]) == "b"


def test_variance_sample_and_population():
    data = [2, 4, 4, 4, 5, 5, 7, 9]
    assert variance(data, sample=False) == 4
    assert close(variance(data), 32 / 7)


def test_variance_needs_two_for_sample():
    try:
        variance([1])
    except ValueError:
        assert variance([1], sample=False) == 0
        return
    raise AssertionError("variance([1]) should raise ValueError")


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2


def test_percentile():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 25) == 20
    assert close(percentile([1, 2, 3, 4], 90), 3.7)


def test_percentile_ends():
    assert percentile([5, 1, 3], 0) == 1
    assert percentile([5, 1, 3], 100) == 5


def test_percentile_range():
    try:
        percentile([1, 2], 101)
    except ValueError:
        return
    raise AssertionError("percentile(..., 101) should raise ValueError")


def test_zscores():
    zs = zscores([1, 2, 3])
    assert close(zs[0], -1) and close(zs[1], 0) and close(zs[2], 1)


def test_correlation():
    assert close(correlation([1, 2, 3, 4], [2, 4, 6, 8]), 1)
    assert close(correlation([1, 2, 3, 4], [8, 6, 4, 2]), -1)
    assert close(correlation([1, 2, 3], [1, 3, 2]), 0.5)


def test_correlation_constant():
    try:
        correlation([1, 1, 1], [1, 2, 3])
    except ValueError:
        return
    raise AssertionError("correlation with a constant series should raise ValueError")


def test_linear_fit():
    assert linear_fit([0, 1, 2], [1, 3, 5]) == (2.0, 1.0)
    slope, intercept = linear_fit([1, 2, 3, 4], [2, 3, 5, 6])
    assert close(slope, 1.4) and close(intercept, 0.5)


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]
    assert moving_average([1, 2, 3], 3) == [2.0]
    assert moving_average([1, 2], 3) == []


def test_histogram():
    assert histogram([0, 1, 2, 3, 4, 5, 10], 5, 0, 10) == [2, 2, 2, 0, 1]


def test_histogram_outside_values():
    assert histogram([-1, 0.5, 11], 2, 0, 10) == [1, 0]


def test_stdev_of_constant():
    assert stdev([3, 3, 3]) == 0
    assert not math.isnan(stdev([1, 2]))
