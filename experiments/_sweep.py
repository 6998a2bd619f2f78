"""Speed sweeps: at every point of a grid (e.g. a sequence length or a batch size), the same short
training with every method, run in lockstep, reduced to per-iteration times and speedups.

The time of each phase of an iteration is its median over the timed iterations (the paper
averaged over an epoch; on a shared machine, stalls of several milliseconds hit single calls
now and then, and a median per phase discards them), and the time of an iteration is the sum
``t = t_grad + t_update`` of the medians of its phases. The forward time ``f`` is the median of
the extra forward-only calls of all methods at the point (the same jitted loss in every run).
As in the paper, with ``t_grad`` the forward + backward time (``value_and_grad``)::

    backward = t_grad - f,   backward speedup = backward_BP / backward_method,
    overall speedup = t_BP / t_method.

A backward time is a difference of two medians, so it is recorded as resolved
(``backward_resolved``) only where it stands clear of the timings' spread: the lower quartile of
``t_grad`` above the upper quartile of ``f``. Below that (a backward of a few microseconds at
T = 8, or a busy machine) the difference is kept as measured, possibly negative, and no backward
speedup is derived from it; tables print it as unresolved and figures leave it out, saying so.

``sweep.jsonl`` holds a ``sweep`` row (run metadata) per session and a ``point`` row per
finished point; a restarted sweep skips finished points and resumes unfinished runs.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from experiments import _timing
from experiments._records import resume_points
from experiments._training import Trainer, run_together, step_rows
from results_io import JsonLines
from results_io import methods as method_names

SWEEP_LOG = "sweep.jsonl"


def summarize(rows: Iterable[dict[str, Any]], skip: int = 0) -> dict[str, Any]:
    """Median, lower and upper quartile of each timed phase (seconds) over the step rows after
    the first ``skip``, and the number of rows used."""
    steps = step_rows(rows)[skip:]
    out: dict[str, Any] = {"iterations": len(steps)}
    for phase in ("forward_s", "grad_s", "update_s", "step_s"):
        values = [row[phase] for row in steps if row.get(phase) is not None]
        out[phase] = _timing.quartiles(values)
    return out


def compare(
    runs: Mapping[str, list[dict[str, Any]]], baseline: str = method_names.BASELINE, skip: int = 0
) -> dict[str, Any]:
    """Per-method times and speedups over ``baseline`` from the logs ``runs[method]``.

    Returns:
        ``{"forward_s": f, "forward_quartiles": ..., "methods": {name: {step_s, grad_s,
        update_s, backward_s, backward_resolved, backward_speedup, overall_speedup,
        quartiles}}}`` (speedups only with a baseline; a backward speedup only where both
        backward times are resolved).
    """
    summaries = {name: summarize(rows, skip) for name, rows in runs.items()}
    forwards = [
        row["forward_s"]
        for rows in runs.values()
        for row in step_rows(rows)[skip:]
        if row.get("forward_s") is not None
    ]
    forward_spread = _timing.quartiles(forwards)
    forward = forward_spread["median"]
    methods = {}
    for name, summary in summaries.items():
        grad, update = summary["grad_s"]["median"], summary["update_s"]["median"]
        step = None if grad is None or update is None else grad + update
        methods[name] = dict(
            iterations=summary["iterations"],
            step_s=step,
            grad_s=grad,
            update_s=update,
            backward_s=None if forward is None or grad is None else grad - forward,
            backward_resolved=resolved(summary["grad_s"], forward_spread),
            quartiles={k: summary[k] for k in ("forward_s", "grad_s", "step_s")},
        )
    if baseline in methods:
        base = methods[baseline]
        for entry in methods.values():
            entry["overall_speedup"] = _ratio(base["step_s"], entry["step_s"])
            both = base["backward_resolved"] and entry["backward_resolved"]
            entry["backward_speedup"] = (
                _ratio(base["backward_s"], entry["backward_s"]) if both else None
            )
    return {"forward_s": forward, "forward_quartiles": forward_spread, "methods": methods}


def run_sweep(
    points: Iterable[dict[str, Any]],
    make_trainers: Callable[[dict[str, Any]], dict[str, Trainer]],
    out_dir: str | pathlib.Path,
    config: dict[str, Any],
    *,
    baseline: str = method_names.BASELINE,
    skip: int = 1,
    chunk: int = 10,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Runs every point not yet in ``out_dir/sweep.jsonl`` and returns all point rows.

    Args:
        points: JSON-able dicts identifying the points (e.g. ``{"sweep": "T", "length": 100,
            "batch": 16}``), in the order to run them.
        make_trainers: ``make_trainers(point) -> {method name: Trainer}``.
        out_dir: folder of ``sweep.jsonl``.
        config: the sweep's configuration, recorded in its ``sweep`` rows; a folder holding a
            sweep with another configuration is refused.
        baseline: method name the speedups are relative to.
        skip: timed iterations left out of each summary (the first runs are the noisiest).
        chunk: iterations per turn when the methods of a point run in lockstep.
        on_point: called with each new point row (e.g. to print it).

    Raises:
        ResultsFolderError: (a ``ValueError``) when ``out_dir`` holds a sweep with another
            configuration.
    """

    def measure(point):
        trainers = make_trainers(point)
        run_together(list(trainers.values()), chunk=chunk)
        runs = {name: trainer.rows() for name, trainer in trainers.items()}
        return compare(runs, baseline, skip)

    log = JsonLines(pathlib.Path(out_dir) / SWEEP_LOG)
    return resume_points(log, config, points, measure, what="sweep", on_point=on_point)


def resolved(grad: dict[str, float | None], forward: dict[str, float | None]) -> bool:
    """Whether ``grad - forward`` (two timings' quartiles) stands clear of their spread: the
    lower quartile of ``grad`` above the upper quartile of ``forward``."""
    if grad["q1"] is None or forward["q3"] is None:
        return False
    return grad["q1"] > forward["q3"]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b
