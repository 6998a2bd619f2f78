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


def median_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 1) -> float:
    """Median of ``repeats`` timed calls after ``warmup`` untimed ones (compilation included)."""
    for _ in range(warmup):
        timed(fn, *args)
    return statistics.median(timed(fn, *args)[1] for _ in range(repeats))
