"""The kernel lab's grid: capture, compile, read and estimate every kernel, one row each.

A row is one captured kernel (:class:`~benchmarks.kernel_lab.capture.Spec`) compiled for one
target (``arch``: 90 for sm_90a, 80 for sm_80) at one ``num_warps``: its footprint (what the
profile's envelope compares: :mod:`~benchmarks.kernel_lab.report` reads which program launches
it from the profile in force), the compiler's resources, the time loop's instruction mix
(``mix``) and the model's estimate (``step_us``). Each kernel is captured at each warps (its
code depends on them: the order of its sums), in worker processes, two kernels at a time. Rows
are appended to a partial file as they come, so an interrupted run resumes where it stopped;
the finished file is written whole, atomically.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from benchmarks.kernel_lab import capture, model, sass

HIDDENS = (8, 20, 32, 64, 128, 256)
WARPS = (1, 2, 4, 8, 16)
ARCHS = (90, 80)
# The kernels also compiled without the step-ahead loads (batched): cells and hidden sizes.
NO_PREFETCH = (("rnn", "gru", "lstm"), (20, 64))
# A thread holds at most 255 registers: a kernel whose resident entries exceed that many a
# thread at some warps spills there for certain, and is not captured nor compiled at those
# warps (its row says so, ``status`` "too large").
MAX_REGISTERS = 255


def specs(
    cells: Sequence[str] = tuple(capture.CELLS),
    hiddens: Sequence[int] = HIDDENS,
    loops: Sequence[str] = capture.LOOPS,
) -> list[capture.Spec]:
    """The grid's kernels, by cell, hidden size, loop, then one example before a batch; then
    the :data:`NO_PREFETCH` kernels among them without the step-ahead loads."""
    grid = [
        capture.Spec(cell, hidden, loop, batched)
        for cell in cells
        for hidden in hiddens
        for loop in loops
        for batched in (False, True)
    ]
    plain = [
        dataclasses.replace(spec, prefetch=False)
        for spec in grid
        if spec.batched and spec.cell in NO_PREFETCH[0] and spec.hidden in NO_PREFETCH[1]
    ]
    return grid + plain


def key(row: dict[str, Any]) -> tuple:
    return (row["kernel"], row.get("prefetch", True), row["arch"], row["num_warps"])


def row_of(
    captured: capture.Captured, size: Any, compiled: Any, ttir_sha: str, compile_s: float
) -> dict[str, Any]:
    """The row of ``captured`` (whose loop's footprint is ``size``) compiled as ``compiled`` (a
    :class:`~benchmarks.kernel_lab.compile.Compiled`)."""
    spec = captured.spec
    used = sass.resources(compiled.log)
    code = sass.instructions(compiled.sass)
    loop = sass.time_loop(code)
    steps = sass.steps_per_iteration(loop, code, capture.LENGTH)
    cycles = model.step_cycles(loop, steps)
    return {
        "kernel": spec.name,
        **dataclasses.asdict(spec),
        "status": "compiled",
        "grid": captured.grid,
        "tile": size.tile,
        "resident": size.resident,
        "arch": compiled.arch,
        "num_warps": compiled.num_warps,
        "registers": used.registers,
        "spill_stores": used.spill_stores,
        "spill_loads": used.spill_loads,
        "stack": used.stack,
        "shared": used.shared,
        "mix": sass.mix(loop),
        "steps_per_iteration": steps,
        "cycles": cycles,
        "step_us": round(cycles / model.CLOCK_HZ[compiled.arch] * 1e6, 4),
        "ttir_sha": ttir_sha,
        "compile_s": round(compile_s, 2),
        "triton": compiled.compiler,
        "jax": jax.__version__,
    }


def too_large(spec: capture.Spec, size: Any, arch: int, count: int) -> dict[str, Any]:
    """The row of a kernel not compiled at ``count`` warps: more resident entries (``size``'s)
    than a thread's registers hold."""
    return {
        "kernel": spec.name,
        **dataclasses.asdict(spec),
        "tile": size.tile,
        "resident": size.resident,
        "arch": arch,
        "num_warps": count,
        "status": "too large",
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


def kernel_rows(
    spec: capture.Spec, warps: Sequence[int], archs: Sequence[int]
) -> list[dict[str, Any]]:
    """The rows of ``spec``: captured at each of ``warps`` (the code depends on them), each
    distinct Triton IR compiled once for each of ``archs``."""
    from benchmarks.kernel_lab.compile import compile_ttir

    size = capture.footprint(spec)
    rows = []
    for count in warps:
        if size.resident > MAX_REGISTERS * 32 * count:
            rows += [too_large(spec, size, arch, count) for arch in archs]
            continue
        captured = capture.capture(spec, num_warps=count)
        sha = hashlib.sha256(captured.ttir.encode()).hexdigest()[:16]
        for arch in archs:
            start = time.perf_counter()
            result = compile_ttir(captured.ttir, count, arch)
            rows.append(row_of(captured, size, result, sha, time.perf_counter() - start))
    return rows


def run(
    grid: Sequence[capture.Spec],
    path: str,
    warps: Sequence[int] = WARPS,
    archs: Sequence[int] = ARCHS,
    progress: Callable[[str], None] = print,
    workers: int = 2,
) -> list[dict[str, Any]]:
    """Every kernel of ``grid`` at every ``warps`` and ``archs``, written to ``path`` (JSON
    lines), ``workers`` kernels at a time (processes); kernels whose rows an interrupted run
    kept (``path + ".partial"``) are not recomputed."""
    partial = f"{path}.partial"
    done = {key(row): row for row in read_rows(partial)}
    wanted = [
        spec
        for spec in grid
        if any(
            (spec.name, spec.prefetch, arch, count) not in done for arch in archs for count in warps
        )
    ]
    with open(partial, "a") as log:

        def record(spec: capture.Spec, rows: list[dict[str, Any]]) -> None:
            for row in rows:
                done[key(row)] = row
                log.write(json.dumps(row, sort_keys=True) + "\n")
            log.flush()
            progress(f"{spec.name}{'' if spec.prefetch else ' (no prefetch)'}: {len(rows)} rows")

        if workers <= 1:
            for spec in wanted:
                record(spec, kernel_rows(spec, warps, archs))
        else:
            context = multiprocessing.get_context("spawn")  # JAX does not survive a fork
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
                futures = {pool.submit(kernel_rows, spec, warps, archs): spec for spec in wanted}
                for future in concurrent.futures.as_completed(futures):
                    record(futures[future], future.result())
    names = {(spec.name, spec.prefetch) for spec in grid}
    rows = [row for row in done.values() if (row["kernel"], row.get("prefetch", True)) in names]
    write_rows(path, rows)
    os.remove(partial)
    return rows
