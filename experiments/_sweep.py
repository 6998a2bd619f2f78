"""Speed sweeps: at every point of a grid (e.g. a sequence length or a batch size), the same short
training with every method, run in lockstep, reduced to per-iteration times and speedups.

The time of each phase of an iteration is its median over the timed iterations (the paper
averaged over an epoch; on a shared machine, stalls of several milliseconds hit single calls
now and then, and a median per phase discards them), and the time of an iteration is the sum
``t = t_grad + t_update`` of the medians of its phases. Each method's forward ``f`` and backward
``b`` are the medians of its trainer's extra calls of the forward and of the backward of its
gradient, each its own program (:mod:`experiments._training`: the forward of ``jax.vjp``, the
pullback on saved residuals), never a difference of two timings::

    backward speedup = b_BP / b_method,   overall speedup = t_BP / t_method.

``sweep.jsonl`` holds a ``sweep`` row (run metadata) per session and a ``point`` row per
finished point (``"backward": "pullback"``: how its backward was timed); a restarted sweep skips
finished points and resumes unfinished runs.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from experiments._records import resume_points
from experiments._training import Trainer, run_together, step_rows
from experiments.timing import quartiles
from paper_figures.result_files import PULLBACK, JsonLines
from paper_figures.result_files import methods as method_names

SWEEP_LOG = "sweep.jsonl"
PHASES = ("forward_s", "backward_s", "grad_s", "update_s", "step_s")


def summarize(rows: Iterable[dict[str, Any]], skip: int = 0) -> dict[str, Any]:
    """Median, lower and upper quartile of each timed phase (seconds) over the step rows after
    the first ``skip``, and the number of rows used."""
    steps = step_rows(rows)[skip:]
    out: dict[str, Any] = {"iterations": len(steps)}
    for phase in PHASES:
        values = [row[phase] for row in steps if row.get(phase) is not None]
        out[phase] = quartiles(values)
    return out


def compare(
    runs: Mapping[str, list[dict[str, Any]]], baseline: str = method_names.BASELINE, skip: int = 0
) -> dict[str, Any]:
    """Per-method times and speedups over ``baseline`` from the logs ``runs[method]``.

    Returns:
        ``{"backward": "pullback", "methods": {name: {iterations, step_s, grad_s, update_s,
        forward_s, backward_s, backward_speedup, overall_speedup, quartiles}}}``: medians in
        seconds, each phase its own program's (speedups only with a baseline).
    """
    methods = {}
    for name, rows in runs.items():
        summary = summarize(rows, skip)
        median = {phase: summary[phase]["median"] for phase in PHASES}
        grad, update = median["grad_s"], median["update_s"]
        methods[name] = dict(
            iterations=summary["iterations"],
            step_s=None if grad is None or update is None else grad + update,
            grad_s=grad,
            update_s=update,
            forward_s=median["forward_s"],
            backward_s=median["backward_s"],
            quartiles={k: summary[k] for k in PHASES},
        )
    if baseline in methods:
        base = methods[baseline]
        for entry in methods.values():
            entry["overall_speedup"] = _ratio(base["step_s"], entry["step_s"])
            entry["backward_speedup"] = _ratio(base["backward_s"], entry["backward_s"])
    return {"backward": PULLBACK, "methods": methods}


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


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b
