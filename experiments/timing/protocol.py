"""How a compiled program is timed: every result waited for with ``jax.block_until_ready`` (so
asynchronous dispatch does not hide device time), and the calls compared in one measurement
interleaved round by round, each timed call right after an untimed call of itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

import jax

Key = TypeVar("Key", bound=Hashable)
Clock = Callable[[], float]


def timed(
    fn: Callable[..., Any], *args: Any, clock: Clock = time.perf_counter
) -> tuple[Any, float]:
    """Calls ``fn(*args)``, waits for its result, and returns it with the seconds it took.

    Args:
        fn: the function to call.
        *args: its arguments.
        clock: seconds since any fixed point; a test passes a fake one.

    Returns:
        ``(result, seconds)``.
    """
    start = clock()
    out = jax.block_until_ready(fn(*args))
    return out, clock() - start


def interleaved(
    calls: Mapping[Key, Callable[[], Any]],
    rounds: int,
    *,
    seconds: float | None = None,
    min_rounds: int = 1,
    clock: Clock = time.perf_counter,
) -> dict[Key, list[float]]:
    """Seconds of every call in ``calls`` over up to ``rounds`` rounds, one timed call of each per
    round, each right after an untimed call of itself (the first of which compiles: no separate
    warm-up is needed).

    The untimed call puts every timed one in a training loop's steady state, after itself: on a
    CPU a call right after a different, large one (a back-propagation over a long sequence)
    ran measurably slower than after itself (docs/width.md, Measurements), and with that
    penalty the order of the calls in a round, not the methods, would set part of the ratios.

    Args:
        calls: the calls to compare, by name, without arguments (bind them with
            ``functools.partial``).
        rounds: the most rounds to run.
        seconds: a budget counted from this call's start: after ``min_rounds`` rounds, no round
            starts that would end past it, judged by the last round's duration (a round that
            compiles counts as long). ``None``: all ``rounds`` rounds.
        min_rounds: the rounds run whatever the budget (fewer only when ``rounds`` is fewer).
        clock: seconds since any fixed point; a test passes a fake one.

    Returns:
        ``{name: [seconds of each round]}``, every list as long as the rounds run.

    Raises:
        ValueError: for ``rounds`` < 0, ``min_rounds`` < 1 or a negative ``seconds``.
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if min_rounds < 1:
        raise ValueError(f"min_rounds must be >= 1, got {min_rounds}")
    if seconds is not None and seconds < 0:
        raise ValueError(f"seconds must be >= 0 or None, got {seconds}")
    times: dict[Key, list[float]] = {name: [] for name in calls}
    started = clock()
    for done in range(1, rounds + 1):
        round_started = clock()
        for name, call in calls.items():
            timed(call, clock=clock)
            times[name].append(timed(call, clock=clock)[1])
        now = clock()
        next_ends = now + (now - round_started)
        if seconds is not None and done >= min_rounds and next_ends - started > seconds:
            break
    return times
