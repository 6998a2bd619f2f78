"""The kernel lab's grid: capture, compile, read and estimate every kernel, one row each.

A row is one captured kernel (:class:`~benchmarks.kernel_lab.capture.Spec`) compiled for one
target (``arch``: 90 for sm_90a, 80 for sm_80) at one ``num_warps``: its footprint and what the
library's profile does with it (``library_warps``: the warps it launches it with, ``None``:
refused, ``library_why_not`` then says why), the compiler's resources, the time loop's
instruction mix (``mix``) and the model's estimate (``step_us``). Kernels whose TTIR is the same (a
batched and an unbatched loop usually are) are compiled once. Rows are appended to a partial
file as they come, so an interrupted run resumes where it stopped; the finished file is
written whole, atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from benchmarks.kernel_lab import capture, model, sass

HIDDENS = (8, 20, 32, 64, 128, 256)
WARPS = (1, 2, 4, 8, 16)
ARCHS = (90, 80)
# A thread holds at most 255 registers: a kernel whose resident entries exceed that many a
# thread at some warps spills there for certain, and is not compiled at those warps (its row
# says so, ``status`` "too large").
MAX_REGISTERS = 255


def specs(
    cells: Sequence[str] = tuple(capture.CELLS),
    hiddens: Sequence[int] = HIDDENS,
    loops: Sequence[str] = capture.LOOPS,
) -> list[capture.Spec]:
    """The grid's kernels, by cell, hidden size, loop, then one example before a batch."""
    return [
        capture.Spec(cell, hidden, loop, batched)
        for cell in cells
        for hidden in hiddens
        for loop in loops
        for batched in (False, True)
    ]


def key(row: dict[str, Any]) -> tuple:
    return (row["kernel"], row["arch"], row["num_warps"])


def row_of(
    captured: capture.Captured, compiled: Any, ttir_sha: str, compile_s: float
) -> dict[str, Any]:
    """The row of ``captured`` compiled as ``compiled`` (a
    :class:`~benchmarks.kernel_lab.compile.Compiled`)."""
    spec = captured.spec
    used = sass.resources(compiled.log)
    loop = sass.time_loop(sass.instructions(compiled.sass))
    cycles = model.iteration_cycles(loop)
    return {
        "kernel": spec.name,
        **dataclasses.asdict(spec),
        "status": "compiled",
        "grid": captured.grid,
        "tile": captured.tile,
        "resident": captured.resident,
        "library_warps": captured.library_warps,
        "library_why_not": captured.library_why_not,
        "arch": compiled.arch,
        "num_warps": compiled.num_warps,
        "registers": used.registers,
        "spill_stores": used.spill_stores,
        "spill_loads": used.spill_loads,
        "stack": used.stack,
        "shared": used.shared,
        "mix": sass.mix(loop),
        "cycles": cycles,
        "step_us": round(cycles / model.CLOCK_HZ[compiled.arch] * 1e6, 4),
        "ttir_sha": ttir_sha,
        "compile_s": round(compile_s, 2),
        "triton": compiled.compiler,
        "jax": jax.__version__,
    }


def too_large(captured: capture.Captured, arch: int, count: int, sha: str) -> dict[str, Any]:
    """The row of a kernel not compiled at ``count`` warps: more resident entries than a
    thread's registers hold."""
    return {
        "kernel": captured.spec.name,
        **dataclasses.asdict(captured.spec),
        "grid": captured.grid,
        "tile": captured.tile,
        "resident": captured.resident,
        "library_warps": captured.library_warps,
        "library_why_not": captured.library_why_not,
        "arch": arch,
        "num_warps": count,
        "status": "too large",
        "ttir_sha": sha,
    }


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a result file (``[]`` where there is none)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_rows(path: str, rows: Iterable[dict[str, Any]]) -> None:
    """Writes ``rows`` to ``path`` whole, atomically, sorted by kernel, target and warps."""
    ordered = sorted(rows, key=key)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for row in ordered:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, path)


def run(
    grid: Sequence[capture.Spec],
    path: str,
    warps: Sequence[int] = WARPS,
    archs: Sequence[int] = ARCHS,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every kernel of ``grid`` at every ``warps`` and ``archs``, written to ``path`` (JSON
    lines); rows of an interrupted run (``path + ".partial"``) are kept, not recomputed."""
    from benchmarks.kernel_lab.compile import compile_ttir

    partial = f"{path}.partial"
    done = {key(row): row for row in read_rows(partial)}
    compiled: dict[tuple, tuple[Any, float]] = {}
    with open(partial, "a") as log:
        for spec in grid:
            captured = capture.capture(spec)
            sha = hashlib.sha256(captured.ttir.encode()).hexdigest()[:16]
            for arch in archs:
                for count in warps:
                    k = (spec.name, arch, count)
                    if k in done and done[k]["ttir_sha"] == sha:
                        continue
                    if captured.resident > MAX_REGISTERS * 32 * count:
                        row = too_large(captured, arch, count, sha)
                        done[k] = row
                        log.write(json.dumps(row, sort_keys=True) + "\n")
                        continue
                    if (sha, arch, count) not in compiled:
                        start = time.perf_counter()
                        result = compile_ttir(captured.ttir, count, arch)
                        compiled[sha, arch, count] = (result, time.perf_counter() - start)
                    result, seconds = compiled[sha, arch, count]
                    row = row_of(captured, result, sha, seconds)
                    done[k] = row
                    log.write(json.dumps(row, sort_keys=True) + "\n")
                    log.flush()
            progress(f"{spec.name}: {len(warps) * len(archs)} compiles")
    rows = [row for row in done.values() if row["kernel"] in {s.name for s in grid}]
    write_rows(path, rows)
    os.remove(partial)
    return rows
