"""statkit: descriptive statistics and a small matrix class."""

from statkit.matrix import Matrix
from statkit.stats import (correlation, histogram, linear_fit, mean, median, mode, moving_average, percentile,
                           stdev, variance, zscores)

__all__ = ["Matrix", "correlation", "histogram", "linear_fit", "mean", "median", "mode", "moving_average",
           "percentile", "stdev", "variance", "zscores"]
