"""Width: the backward's time per step against the hidden size, back-propagation and BPPSA, for
cells whose Jacobians stay structured (log-log), and the backward speedup.

Reads one or more JSON files written by ``python -m benchmarks.width`` (several runs of the same
grid: each point is then the median over the runs, its bar the runs' range). A point whose
backward time is not resolved (the gradient's rounds inside the forward's spread) is left out
and named in the caption.

Run: ``python -m paper_figures.width benchmarks/results/width/cpu_h_seq_run*.json [--out DIR]``;
writes ``width.png`` and ``width.pdf`` (default folder: ``figures/`` beside the first file).
"""

from __future__ import annotations

import json
import pathlib
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib import ticker

from paper_figures import _cli, _style
from paper_figures.result_files import PULLBACK

NAME = "width"
BP = "bp"

__all__ = ["draw", "load", "main"]


def load(paths: Sequence[str | pathlib.Path]) -> list[dict[str, Any]]:
    """The benchmark files ``paths`` (each ``{"rows": [...], ...}``)."""
    runs = []
    for path in paths:
        path = pathlib.Path(path)
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{path} is not a result file of benchmarks.width (no 'rows')")
        runs.append(data)
    if not runs:
        raise ValueError("no result files given")
    return runs


def _entries(runs: Sequence[dict]):
    """Every ``(row, method, entry)`` of the runs' rows that did not fail."""
    for run in runs:
        for row in run["rows"]:
            if row.get("status") != "error":
                for method, entry in row.get("methods", {}).items():
                    yield row, method, entry


def _series(runs: Sequence[dict]) -> tuple[dict, list[str]]:
    """``{(cell, method): {hidden: [per-step backward us of each run]}}`` and the points left
    out (unresolved)."""
    series: dict = defaultdict(lambda: defaultdict(list))
    unresolved = []
    for row, method, entry in _entries(runs):
        if "per_step_backward_us" not in entry:
            continue
        if not entry.get("backward_resolved", True):
            unresolved.append(f"{row['cell']} {method} H = {row['hidden']}")
            continue
        series[row["cell"], method][row["hidden"]].append(entry["per_step_backward_us"])
    return series, sorted(set(unresolved))


def _speedups(runs: Sequence[dict]) -> dict:
    """``{(cell, method): {hidden: [backward speedup over BP of each run]}}``."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for row, method, entry in _entries(runs):
        value = entry.get("backward_speedup_median")
        if method != BP and value is not None:
            out[row["cell"], method][row["hidden"]].append(value)
    return out


def _plot(ax, points: dict, **style):
    hiddens = sorted(points)
    mid = [statistics.median(points[h]) for h in hiddens]
    low = [m - min(points[h]) for h, m in zip(hiddens, mid)]
    high = [max(points[h]) - m for h, m in zip(hiddens, mid)]
    return ax.errorbar(hiddens, mid, yerr=[low, high], capsize=3, **style)


def draw(runs: Sequence[dict]) -> plt.Figure:
    series, unresolved = _series(runs)
    speedups = _speedups(runs)
    fig, (ax_time, ax_speed) = plt.subplots(1, 2, figsize=(11, 4.4))
    methods = sorted({m for _, m in series} - {BP})
    handles, names = [], []
    cells = sorted({c for c, _ in series})
    markers = dict(zip(cells, "osD^v"))
    for cell in cells:
        for index, method in enumerate([BP, *methods]):
            points = series.get((cell, method))
            if not points:
                continue
            name = f"{cell}, {'BP' if method == BP else 'BPPSA ' + method}"
            c = _style.color("bp" if method == BP else method, index)
            bars = _plot(ax_time, points, color=c, fmt=f"-{markers[cell]}", label=name)
            handles.append(bars)
            names.append(name)
            if method != BP and speedups.get((cell, method)):
                _plot(ax_speed, speedups[cell, method], color=c, fmt=f"-{markers[cell]}")
    reference = _linear_reference(ax_time, series)
    if reference is not None:
        handles.append(reference)
    ax_time.set_xscale("log", base=2)
    ax_time.set_yscale("log")
    ax_time.set_xlabel("hidden size H")
    ax_time.set_ylabel("backward time per step (µs)")
    ax_time.set_title("backward per step against width")
    ax_speed.set_xscale("log", base=2)
    _style.plain_log_axis(ax_speed)
    ax_speed.yaxis.set_minor_locator(ticker.LogLocator(subs=(1.5, 2.0, 3.0, 5.0)))
    _style.baseline_line(ax_speed)
    ax_speed.set_xlabel("hidden size H")
    ax_speed.set_ylabel("backward speedup over BP (x)")
    ax_speed.set_title("BPPSA backward speedup")
    first = runs[0]
    lengths = sorted({r["length"] for run in runs for r in run["rows"]})
    batches = sorted({r["batch"] for run in runs for r in run["rows"]})
    fig.suptitle(
        f"Width: T = {', '.join(map(str, lengths))}, B = {', '.join(map(str, batches))}, "
        f"float32\n{str(first.get('backend', '?')).upper()} ({first.get('cpus', '?')} cores), "
        f"jax {first.get('jax', '?')}",
        y=0.995,
        va="top",
    )
    left_out = (
        " Left out, backward not resolved (the gradient's rounds inside the forward's spread): "
        + "; ".join(unresolved)
        + "."
        if unresolved
        else ""
    )
    timed = (
        "the jitted pullback of a jax.vjp, timed as its own program"
        if all(run.get("backward") == PULLBACK for run in runs)
        else f'gradient minus forward in the files without "backward": "{PULLBACK}"'
    )
    caption = (
        f"{len(runs)} run(s) of benchmarks.width; each point the median over the runs of the "
        f"per-point median backward time ({timed}; interleaved rounds after a warm-up), "
        "divided by T; bars: the runs' range. BP: jax.grad through lax.scan. BPPSA "
        "<method>: bppsa.grad with that method, on the cells' structured (diagonal or "
        "block-diagonal) Jacobians. Dotted: a line of slope 1 (time proportional to H) through "
        f"BP's first point.{left_out}"
    )
    _style.finish(fig, caption, [_style.Key(handles)])
    return fig


def _linear_reference(ax, series):
    bp = [points for (cell, method), points in sorted(series.items()) if method == BP]
    if not bp or len(bp[0]) < 2:
        return None
    hiddens = sorted(bp[0])
    start = statistics.median(bp[0][hiddens[0]])
    ys = [start * h / hiddens[0] for h in hiddens]
    (line,) = ax.plot(hiddens, ys, ":", color="#7f7f7f", label="proportional to H")
    return line


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.width", __doc__)
    parser.add_argument("runs", nargs="+", type=pathlib.Path, help="benchmarks.width JSON files")
    _cli.add_out(parser, name="runs")
    args = parser.parse_args(argv)
    runs = _cli.load(parser, "runs", load, args.runs)
    folder = _cli.out_folder(args.out, args.runs[0])
    return _cli.wrote(_style.save(draw(runs), folder, NAME))


if __name__ == "__main__":
    main()
