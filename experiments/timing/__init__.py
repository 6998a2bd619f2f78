"""The one place where compiled programs are timed, shared by the benchmarks and the experiments
(not part of the ``bppsa`` wheel):

- the protocol (:mod:`experiments.timing.protocol`): :func:`timed` waits for the result;
  :func:`interleaved` times the calls compared round by round, each timed call right after an
  untimed call of itself, within an optional budget;
- a gradient's three quantities, each its own program (:mod:`experiments.timing.gradients`):
  :class:`GradientPrograms` and :func:`time_gradients`; never a difference of two programs;
- summaries as result rows key them (:mod:`experiments.timing.summary`): :func:`ms_fields` and the
  like;
- the device's kernel time from the profiler as a cross-check (:mod:`experiments.timing.kernels`).
"""

from experiments.timing.gradients import QUANTITIES, GradientPrograms, time_gradients
from experiments.timing.kernels import (
    KernelTime,
    kernel_seconds,
    kernel_time,
    summed_kernel_seconds,
)
from experiments.timing.protocol import interleaved, timed
from experiments.timing.summary import min_median, ms_fields, quartiles

__all__ = [
    "QUANTITIES",
    "GradientPrograms",
    "KernelTime",
    "interleaved",
    "kernel_seconds",
    "kernel_time",
    "min_median",
    "ms_fields",
    "quartiles",
    "summed_kernel_seconds",
    "time_gradients",
    "timed",
]
