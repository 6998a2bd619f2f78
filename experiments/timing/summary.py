"""Timings summarized as result rows key them: medians, minima and quartiles."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def quartiles(values: Sequence[float], digits: int | None = None) -> dict[str, float | None]:
    """Median and quartiles of timings (``None`` for none), rounded to ``digits`` if given."""
    if not values:
        return {"median": None, "q1": None, "q3": None}
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    if digits is not None:
        q1, median, q3 = (round(v, digits) for v in (q1, median, q3))
    return {"median": median, "q1": q1, "q3": q3}


def min_median(times: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``{name}_min_s`` and ``{name}_median_s`` of every call's timings, as result rows key them."""
    out = {}
    for name, ts in times.items():
        out[f"{name}_min_s"], out[f"{name}_median_s"] = min(ts), statistics.median(ts)
    return out


def ms_fields(times: Mapping[str, Sequence[float]]) -> dict[str, float | None]:
    """``{name}_ms`` (the median) and ``{name}_min_ms`` of every call's seconds, in milliseconds.

    For a gradient's quantities (:func:`experiments.timing.time_gradients`) these are the row fields
    ``total_ms``, ``total_min_ms``, ``forward_ms``, ``forward_min_ms``, ``backward_ms`` and
    ``backward_min_ms``; each is one program's own time, never a difference of two.

    Args:
        times: ``{name: [seconds, ...]}``; an empty list gives ``None`` for both fields.

    Returns:
        ``{f"{name}_ms": median, f"{name}_min_ms": minimum}`` for every name, in that order.
    """
    out: dict[str, float | None] = {}
    for name, ts in times.items():
        out[f"{name}_ms"] = 1e3 * statistics.median(ts) if ts else None
        out[f"{name}_min_ms"] = 1e3 * min(ts) if ts else None
    return out
