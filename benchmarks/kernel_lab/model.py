"""A per-step latency estimate of a kernel's time loop from its SASS schedule.

Algorithm summary. One warp issues the loop's instructions in order, as the compiler scheduled
them (:mod:`benchmarks.kernel_lab.sass`): after an instruction the warp waits its ``stall``
cycles; an instruction that waits on scoreboards issues only once the variable-latency
operations that set them have completed (their issue cycle plus the class's latency in
:data:`LATENCY`); a barrier adds :data:`BARRIER` cycles (every warp of a program runs the same
instructions, so all arrive together). The loop is walked :data:`ITERATIONS` times with the
scoreboards carried from one iteration to the next, so that a load issued a step ahead hides its
latency; the estimate is the steady state, the cycles of the last iteration over the steps an
iteration runs (LLVM unrolls small loop bodies), over the clock of the target
(:data:`CLOCK_HZ`).

It is a static estimate, not a measurement: no contention between warps or programs, no cache
misses beyond the global load latency, no dual issue. Compare variants of a kernel with it; a
device run (``benchmarks/gpu.sh``) measures the step, and
``python -m benchmarks.tools.fit_profile --kernel-lab`` fits these constants to such runs.
The latencies are round numbers of the order microbenchmarks report for Volta to Hopper (Jia et
al. 2018/2019; Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
2024): global memory several hundred cycles, shared memory and shuffles tens, special functions
about twenty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from benchmarks.kernel_lab.sass import NO_SCOREBOARD, Instruction

# Cycles from issue to a variable-latency result, by mnemonic (OTHER for the rest: conversions,
# S2R, ...).
LATENCY: Mapping[str, int] = {
    "LDG": 260,  # an L2 hit: a step's residuals, streamed in order
    "LDL": 40,  # spill reloads: local memory, an L1 hit at best
    "LDS": 30,
    "LDSM": 30,
    "SHFL": 30,
    "MUFU": 20,
}
OTHER = 20
# Cycles a source register stays read after a store or a variable-latency op issues.
READ = 10
# Cycles a barrier adds once the warp reaches it.
BARRIER = 20
ITERATIONS = 4
# Boost clocks: sm_90 (H100 and H200 SXM), sm_80 (A100 SXM).
CLOCK_HZ: Mapping[int, float] = {90: 1.98e9, 80: 1.41e9}


@dataclasses.dataclass(frozen=True)
class Constants:
    """The model's constants (the defaults above; :mod:`benchmarks.tools.fit_profile` fits
    them to device runs)."""

    latency: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict(LATENCY))
    other: int = OTHER
    read: int = READ
    barrier: int = BARRIER


def _latency(ins: Instruction, constants: Constants) -> int:
    return constants.latency.get(ins.base, constants.other)


def iteration_cycles(loop: Sequence[Instruction], constants: Constants | None = None) -> float:
    """Cycles of one steady-state iteration of ``loop`` by the in-order model."""
    constants = constants or Constants()
    ready = [0.0] * 6  # cycle each scoreboard is released
    now = 0.0
    ends = []
    for _ in range(ITERATIONS):
        for ins in loop:
            now = max([now, *(ready[s] for s in ins.wait)])
            if ins.base == "BAR":
                now += constants.barrier
            if ins.write != NO_SCOREBOARD:
                ready[ins.write] = now + _latency(ins, constants)
            if ins.read != NO_SCOREBOARD:
                ready[ins.read] = max(ready[ins.read], now + constants.read)
            now += max(ins.stall, 1)
        ends.append(now)
    return ends[-1] - ends[-2]


def step_cycles(
    loop: Sequence[Instruction], steps: int = 1, constants: Constants | None = None
) -> float:
    """Cycles of one step of the time loop ``loop``, an iteration of which runs ``steps``
    steps (:func:`~benchmarks.kernel_lab.sass.steps_per_iteration`)."""
    return iteration_cycles(loop, constants) / steps


def step_seconds(
    loop: Sequence[Instruction], arch: int, steps: int = 1, constants: Constants | None = None
) -> float:
    """Seconds of one step of ``loop`` on the target ``arch`` (``90``: sm_90a)."""
    return step_cycles(loop, steps, constants) / CLOCK_HZ[arch]
