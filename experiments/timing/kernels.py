"""The device's own time for a compiled program, from the profiler: a cross-check of a
wall-clock timing where the host distorts it (a program timed alone, away from the programs it
runs beside in a training step).

Reads a profile that JAX writes (an XSpace, through ``jax.profiler.ProfileData``): on a GPU,
every event on the lines of a ``/device:GPU:<n>`` plane named ``Stream #<id>...`` is a kernel,
copy or memset the program ran on the device. A CPU backend's profile has no device plane, and
this returns ``None``, as it does for every failure: a cross-check must never lose the row it
checks.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.profiler

# (plane name, line name, event name, duration in nanoseconds)
Event = tuple[str, str, str, float]

_GPU_PLANE = "/device:GPU:"
_STREAM_LINE = "Stream #"


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """The device's time per call, or why there is none.

    Attributes:
        seconds: the durations of the device's kernels (and copies) per call, summed over the
            device's streams and devices; gaps between them (launches, the host's share of a
            loop) are not in it. ``None`` when not measured.
        reason: why ``seconds`` is ``None``; ``None`` when measured.
    """

    seconds: float | None
    reason: str | None = None


def summed_kernel_seconds(events: Iterable[Event]) -> float | None:
    """Seconds of the GPU stream events among ``events``; ``None`` if there is none.

    Only the lines of the device planes that hold the device's own activity count: not the
    host's threads, nor the lines a profile viewer derives from them (``XLA Ops``,
    ``XLA Modules``, ``Steps``: the same time again), nor ``CUPTI overhead``.

    Args:
        events: ``(plane name, line name, event name, duration in ns)`` of every event of a
            profile.

    Returns:
        The sum of the durations of the events on lines named ``Stream #...`` of planes named
        ``/device:GPU:...``, in seconds, or ``None`` when there are none.
    """
    durations = [
        duration
        for plane, line, _, duration in events
        if plane.startswith(_GPU_PLANE) and line.startswith(_STREAM_LINE)
    ]
    return 1e-9 * sum(durations) if durations else None


def profile_events(profile: Any) -> Iterator[Event]:
    """``(plane name, line name, event name, duration in ns)`` of every event of a
    ``jax.profiler.ProfileData``."""
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                yield plane.name, line.name, event.name, event.duration_ns


def kernel_time(fn: Callable[..., Any], *args: Any, repeats: int = 3) -> KernelTime:
    """The device's time per call of ``fn(*args)``, from the profiler; never raises.

    Calls ``fn`` once untimed (so nothing of a compilation or a first call is profiled), then
    ``repeats`` times, each waited for, under ``jax.profiler.trace`` into a temporary directory
    that is removed after it is read.

    Args:
        fn: a compiled program (or any call that runs one).
        *args: its arguments.
        repeats: the calls profiled; the result is their mean.

    Returns:
        :class:`KernelTime`: ``seconds`` per call, or ``None`` with the reason (no device
        kernels, as on a CPU backend; a JAX without ``jax.profiler.ProfileData``; another
        trace already running; any error of ``fn`` or of the profiler).

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    profile_data = getattr(jax.profiler, "ProfileData", None)
    if profile_data is None:
        return KernelTime(None, f"jax.profiler.ProfileData is missing in JAX {jax.__version__}")
    try:
        jax.block_until_ready(fn(*args))
        with tempfile.TemporaryDirectory(prefix="timing-kernels-") as log_dir:
            with jax.profiler.trace(log_dir):
                for _ in range(repeats):
                    jax.block_until_ready(fn(*args))
            paths = sorted(pathlib.Path(log_dir).glob("**/*.xplane.pb"))
            seconds = summed_kernel_seconds(
                event
                for path in paths
                for event in profile_events(profile_data.from_file(str(path)))
            )
    except Exception as error:  # a cross-check must not lose the row it checks
        return KernelTime(None, f"profiling failed: {type(error).__name__}: {error}"[:300])
    if seconds is None:
        return KernelTime(
            None, f"no GPU kernel events in the profile ({jax.default_backend()} backend)"
        )
    return KernelTime(seconds / repeats)


def kernel_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 3) -> float | None:
    """The device's seconds per call of ``fn(*args)`` (:func:`kernel_time`), ``None`` when not
    measured (as on a CPU backend); never raises but for ``repeats`` < 1."""
    return kernel_time(fn, *args, repeats=repeats).seconds
