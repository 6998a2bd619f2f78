"""The compile grid of :mod:`benchmarks.fused` (part ``compile``): a device's check that the
fused kernels the profile admits compile and run right, and how far beyond its envelope
(``fused_programs`` of the profile's ``bppsa.Kernels``, which the kernel lab sets: the largest
loops that compile without spilling) the device still compiles them
(``python -m benchmarks.tools.fit_profile --compile`` reads the rows).

Each point is the fused forward alone (``jax.vmap`` of ``bppsa.scan(..., forward="fused")``)
traced with the envelope lifted (:func:`benchmarks._fused_envelope.lifted`: a point the profile
admits keeps its warps, one beyond runs in the largest program), then
``jax.jit(...).lower(...).compile()`` on the device, then one run checked against ``lax.scan``.
A row records the envelope's counts (``tile``, ``resident``), the warps the profile launches it
with (``num_warps``), whether the profile admits the point (``library_why_not``, ``None``: it
does), the outcome (``status``: ``"compiled"``, ``"failed"``, ``"ran wrong"``, ``"not fused"``,
``"crashed"``, ``"skipped"``) and the compile seconds. The points run by hidden size, every cell
at each size: a cell whose compile failed, crashed or took longer than ``slow_s`` tries no
larger size (those rows say ``"skipped"``). :func:`summary` reads the largest size each cell
compiled at and every admitted point that did not compile and run right.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax

import bppsa
from benchmarks import _fused_envelope as envelope
from benchmarks._fused_rows import (
    FUSED,
    Case,
    final_states,
    machine,
    problem,
    relative_difference,
    step_of,
    why_not_fused,
)

HIDDENS = (16, 20, 32, 64, 100, 128, 256, 512, 1024, 2048, 4096)
CELLS = ("rnn", "gru", "lstm", "diagonal-gru")
# A compile that took longer than this: the larger sizes of its cell are not tried.
SLOW_S = 30.0
# The difference from lax.scan above which a compiled kernel "ran wrong" (float32 rounding of a
# short sequence is ~1e-6).
WRONG = 1e-3
STOPS = ("failed", "crashed", "ran wrong")


def grid(cells: Sequence[str], hiddens: Sequence[int], length: int, batch: int, inputs: int):
    """The points in the order they run: by hidden size, then cell."""
    return [
        Case(cell, hidden, length, batch, inputs) for hidden in sorted(hiddens) for cell in cells
    ]


def stopped(rows: Iterable[dict[str, Any]], slow_s: float = SLOW_S) -> dict[str, str]:
    """``{cell: why its larger sizes are not tried}`` from the rows so far."""
    out: dict[str, str] = {}
    for row in rows:
        if row.get("part") != "compile" or "status" not in row or row["cell"] in out:
            continue
        if row["status"] in STOPS:
            out[row["cell"]] = f"H = {row['hidden']} {row['status']}"
        elif row["status"] == "compiled" and row["compile_s"] > slow_s:
            out[row["cell"]] = f"H = {row['hidden']} compiled in {row['compile_s']:.0f} s"
    return out


def skipped_row(case: Case, because: str) -> dict[str, Any]:
    return {"part": "compile", **case.fields(), **machine(), "status": "skipped",
            "because": because}  # fmt: skip


def crashed_row(case: Case) -> dict[str, Any]:
    """The row of a point whose process died (a crash inside XLA or Triton)."""
    return {"part": "compile", **case.fields(), **machine(), "status": "crashed",
            "because": "the process died in this point (a rerun records and skips it)"}  # fmt: skip


def compile_row(case: Case) -> dict[str, Any]:
    """One point of the grid (see the module docstring)."""
    params, _, xs = problem(case)
    body, kind = step_of(case.cell, params)
    row: dict[str, Any] = {"part": "compile", **case.fields(), **machine()}
    row |= envelope.sizes(body, kind.initial_state(case.hidden), xs[0]) or {
        "tile": None,
        "resident": None,
        "num_warps": None,
    }
    row["library_envelope"] = envelope.limits()
    with bppsa.trace_plans() as plans:
        jax.eval_shape(functools.partial(final_states, FUSED, case), params, xs)
    row["library_why_not"] = why_not_fused(plans)
    with envelope.lifted() as lifted:
        row["envelope_lifted"] = lifted
        start = time.perf_counter()
        # A new function object, and the lifted profile in jax.jit's cache key: the trace
        # above, made under the library's envelope, is not served here.
        fn = functools.partial(final_states, FUSED, case)
        with bppsa.trace_plans() as plans:
            lowered = jax.jit(fn).lower(params, xs)
    row["why_not"] = why = why_not_fused(plans)
    if why is not None:
        return row | {"status": "not fused", "compile_s": None}
    try:
        compiled = lowered.compile()
    except Exception as error:  # the device's compiler refused it: the datum sought
        row["compile_s"] = time.perf_counter() - start
        return row | {"status": "failed", "error": f"{type(error).__name__}: {str(error)[:400]}"}
    row["compile_s"] = time.perf_counter() - start
    try:
        out = jax.block_until_ready(compiled(params, xs))
    except Exception as error:  # compiled but did not run (e.g. too many resources at launch)
        return row | {"status": "failed", "error": f"{type(error).__name__}: {str(error)[:400]}"}
    reference = jax.jit(functools.partial(final_states, jax.lax.scan, case))(params, xs)
    row["difference"] = difference = relative_difference(out, reference)
    row["status"] = "compiled" if difference <= WRONG else "ran wrong"
    return row


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per cell the largest hidden size whose kernel compiled and ran right, and the smallest
    that did not, with their envelope counts; over all cells the largest counts that compiled
    and the smallest that failed, and the check: ``admitted_failed``, the points the profile
    admits (``library_why_not`` ``None``) that failed, crashed or ran wrong (none where its
    envelope is right), out of ``admitted`` points run."""
    points = [
        r for r in rows if r.get("part") == "compile" and r.get("status", "skipped") != "skipped"
    ]
    cells: dict[str, Any] = {}
    for cell in dict.fromkeys(r["cell"] for r in points):
        mine = [r for r in points if r["cell"] == cell]
        good = [r for r in mine if r["status"] == "compiled"]
        bad = [r for r in mine if r["status"] in STOPS]
        best = max(good, key=lambda r: r["hidden"], default=None)
        worst = min(bad, key=lambda r: r["hidden"], default=None)
        cells[cell] = {
            "largest_compiled": None if best is None else _point(best),
            "smallest_failed": None if worst is None else _point(worst),
        }
    good = [r for r in points if r["status"] == "compiled"]
    bad = [r for r in points if r["status"] in STOPS]
    bounds = {}
    for count in ("tile", "resident"):
        bounds[f"largest_{count}_compiled"] = max(
            (r[count] for r in good if r.get(count) is not None), default=None
        )
        bounds[f"smallest_{count}_failed"] = min(
            (r[count] for r in bad if r.get(count) is not None), default=None
        )
    admitted = [r for r in points if "library_why_not" in r and r["library_why_not"] is None]
    failed = [_point(r) | {"cell": r["cell"]} for r in admitted if r["status"] in STOPS]
    return {"part": "compile-summary", **machine(), "cells": cells, **bounds,
            "admitted": len(admitted), "admitted_failed": failed,
            "library_envelope": envelope.limits()}  # fmt: skip


def _point(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("hidden", "tile", "resident", "num_warps", "compile_s", "status")
    return {k: row.get(k) for k in keys}


def report(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The summary as lines of text."""
    s = summary(rows)
    for cell, entry in s["cells"].items():
        best, worst = entry["largest_compiled"], entry["smallest_failed"]
        line = f"{cell:<13} largest compiled: "
        line += "none" if best is None else f"H = {best['hidden']} (tile {best['tile']}, "
        line += "" if best is None else f"resident {best['resident']}, {best['compile_s']:.1f} s)"
        if worst is not None:
            line += f"; {worst['status']} at H = {worst['hidden']} (tile {worst['tile']}, "
            line += f"resident {worst['resident']})"
        yield line
    yield (
        f"envelope today {s['library_envelope']}; compiled up to tile "
        f"{s['largest_tile_compiled']}, resident {s['largest_resident_compiled']}; failed from "
        f"tile {s['smallest_tile_failed']}, resident {s['smallest_resident_failed']}"
    )
    failed = ", ".join(f"{p['cell']} H = {p['hidden']} {p['status']}" for p in s["admitted_failed"])
    yield f"admitted by the profile: {s['admitted']} point(s) run; failed: {failed or 'none'}"
