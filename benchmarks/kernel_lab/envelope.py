"""The fused kernels' envelope from the lab's rows: the largest loops that compile without
spilling, by warps a program, per target.

Algorithm summary. For one target and one ``num_warps``, the rows split into kernels that spill
(spill stores or loads in ``ptxas``'s log, or "too large" to compile: more resident entries than
a thread's registers hold) and kernels that do not. ``max_resident`` is the largest resident
count of a spill-free kernel below the smallest resident count of a spilling one, so that every
kernel of the lab with at most that many resident entries is spill-free; ``max_tile`` is the
largest tile among those kernels. A program of more warps than the grid's first admits more
only where its limits exceed the smaller program's, so the programs listed grow strictly: the
loop gets the fewest warps that hold it (one warp where the carry fits one). The profile's
``Kernels.fused_programs`` holds the result for its target; ``tests/benchmarks/
test_kernel_lab.py`` checks the two agree and that no kernel the profile admits spills.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import bppsa


def spills(row: dict[str, Any]) -> bool:
    """Whether the kernel of ``row`` spills (or cannot be compiled without spilling)."""
    if row.get("status") == "too large":
        return True
    return row["spill_stores"] > 0 or row["spill_loads"] > 0


def limits(rows: Iterable[dict[str, Any]]) -> tuple[int, int] | None:
    """``(max_tile, max_resident)`` of the spill-free kernels among ``rows`` (one target and
    warps), or ``None`` where the smallest kernel spills."""
    rows = list(rows)
    spilling = [row["resident"] for row in rows if spills(row)]
    below = min(spilling, default=None)
    clean = [row for row in rows if not spills(row) and (below is None or row["resident"] < below)]
    if not clean:
        return None
    return max(row["tile"] for row in clean), max(row["resident"] for row in clean)


def programs(rows: Iterable[dict[str, Any]], arch: int) -> list[tuple[int, int, int]]:
    """``[(num_warps, max_tile, max_resident), ...]`` for target ``arch``: by warps, each
    admitting more resident entries than the one before."""
    rows = [row for row in rows if row["arch"] == arch]
    out: list[tuple[int, int, int]] = []
    for count in sorted({row["num_warps"] for row in rows}):
        found = limits(row for row in rows if row["num_warps"] == count)
        if found is None:
            continue
        if out and found[1] <= out[-1][2]:
            continue
        out.append((count, *found))
    return out


def admitted(
    row: dict[str, Any], listed: Sequence[tuple[int, int, int]]
) -> tuple[int, int, int] | None:
    """The program of ``listed`` that launches ``row``'s kernel when the warps are left to the
    profile: the first whose limits hold it (``None``: refused)."""
    for program in listed:
        if holds(program, row):
            return program
    return None


def holds(program: tuple[int, int, int], row: dict[str, Any]) -> bool:
    """Whether ``program``'s limits hold ``row``'s kernel, by the library's own rule
    (:meth:`bppsa.FusedProgram.holds`)."""
    return bppsa.FusedProgram(*program).holds(row["tile"], row["resident"]) is None


def step_estimates(
    rows: Iterable[dict[str, Any]], listed: Sequence[tuple[int, int, int]], arch: int
) -> dict[int, float]:
    """``{num_warps: seconds}``: for each program of ``listed``, the slowest estimated step
    (``step_us``) of target ``arch``'s kernels it launches at its warps with the step-ahead
    loads (the profile's default), the static estimate of its step
    (``FusedProgram.step_latency``)."""
    out: dict[int, float] = {}
    for row in rows:
        if row["arch"] != arch or row.get("status") != "compiled" or not row.get("prefetch", True):
            continue
        program = admitted(row, listed)
        if program is None or program[0] != row["num_warps"]:
            continue
        out[program[0]] = max(out.get(program[0], 0.0), row["step_us"] * 1e-6)
    return out
