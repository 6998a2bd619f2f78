"""Wall-clock timing shared by the experiments and the demo: results are waited for with
``jax.block_until_ready`` so that asynchronous dispatch does not hide device time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """Calls ``fn(*args)``, waits for its result, and returns it with the seconds it took."""
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def quartiles(values: list[float], digits: int | None = None) -> dict[str, float | None]:
    """Median and quartiles of timings (``None`` for none), rounded to ``digits`` if given."""
    if not values:
        return {"median": None, "q1": None, "q3": None}
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    if digits is not None:
        q1, median, q3 = (round(v, digits) for v in (q1, median, q3))
    return {"median": median, "q1": q1, "q3": q3}


def median_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 1) -> float:
    """Median of ``repeats`` timed calls after ``warmup`` untimed ones (compilation included)."""
    for _ in range(warmup):
        timed(fn, *args)
    return statistics.median(timed(fn, *args)[1] for _ in range(repeats))


def min_median(times: dict[str, list[float]]) -> dict[str, float]:
    """``{name}_min_s`` and ``{name}_median_s`` of every call's timings, as result rows key them."""
    out = {}
    for name, ts in times.items():
        out[f"{name}_min_s"], out[f"{name}_median_s"] = min(ts), statistics.median(ts)
    return out


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of every call in ``calls`` over ``rounds`` rounds, one timed call of each per
    round, each right after an untimed call of itself (the first of which compiles: no separate
    warm-up is needed).

    The untimed call puts every timed one in a training loop's steady state, after itself: on a
    CPU a call right after a different, large one (a back-propagation over a long sequence)
    ran measurably slower than after itself (docs/width.md, Measurements), and with that
    penalty the order of the calls in a round, not the methods, would set part of the ratios.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            timed(call)
            times[name].append(timed(call)[1])
    return times
