"""Moved to :mod:`timing`, the timing harness the benchmarks and the experiments share; these
names stay here until their users import them from there."""

from timing import interleaved, median_seconds, min_median, quartiles, timed

__all__ = ["interleaved", "median_seconds", "min_median", "quartiles", "timed"]
