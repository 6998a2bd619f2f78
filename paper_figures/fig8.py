"""Fig. 8: speed of BPPSA against BP for the RNN on synthetic bitstreams, over the sequence
length T (at B = 16; panels a-c) and over the fraction of the device per sample 1/B (at
T = 1000; panels d-f).

Reads ``sweep.jsonl`` written by ``python -m experiments.rnn_synthetic sweep``. Per row of
panels: (a, d) backward time per iteration of every method; (b, e) backward speedup over BP,
log scale; (c, f) runtime per iteration split into forward, backward and optimizer update,
normalized by BP's. A sweep that covers only T or only B gets only its row.

Run: ``python -m paper_figures.fig8 results/rnn_synthetic/sweep-quick [--out DIR]``; writes
``fig8.png`` and ``fig8.pdf`` (default folder: ``<sweep>/figures``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from paper_figures import _cli, _style
from paper_figures.result_files import PULLBACK, read_points
from paper_figures.result_files import methods as method_names

SWEEP_LOG = "sweep.jsonl"
UPDATE_ALPHA = 0.35


def load_sweep(path: str | pathlib.Path) -> tuple[dict, list[dict]]:
    """The first metadata row and the point rows (the last row of each point) of a sweep.

    Raises:
        FileNotFoundError: when there is no ``sweep.jsonl``.
        ValueError: when it holds no finished point.
    """
    meta, points = read_points(path, SWEEP_LOG, lambda p: (p["sweep"], p["length"], p["batch"]))
    if not points:
        raise ValueError(f"{path} holds no finished sweep point yet")
    return meta, list(points.values())


def _methods(points: list[dict]) -> list[str]:
    methods = list(dict.fromkeys(name for row in points for name in row["methods"]))
    return sorted(methods, key=lambda name: name != method_names.BASELINE)


def _log_bars(ax, positions, values_by_method, methods, order, include=()):
    """Grouped bars per method on a log axis spanning the data and ``include`` (e.g. 1). Bars
    rise from the axis' bottom."""
    width = 0.8 / max(len(methods), 1)
    finite = list(include)
    for index, method in enumerate(methods):
        values = np.array([np.nan if v is None else v for v in values_by_method[method]], float)
        values[values <= 0] = np.nan  # a noisy non-positive value has no place on a log axis
        finite += [v for v in values if np.isfinite(v)]
        offset = (index - (len(methods) - 1) / 2) * width
        ax.bar(
            positions + offset,
            values,
            width,
            color=_style.color(method, order.index(method)),
        )
    _style.plain_log_axis(ax)
    if finite:
        ax.set_ylim(min(finite) / 2, max(finite) * 2)


def _row(axes, points, methods, sweep, letters):
    """Three panels of one sweep."""
    if sweep == "T":
        points = sorted(points, key=lambda r: r["point"]["length"])
        ticks = [_count(r["point"]["length"]) for r in points]
        xlabel = f"sequence length T (B = {points[0]['point']['batch']})"
    else:
        points = sorted(points, key=lambda r: -r["point"]["batch"])
        ticks = [f"1/{r['point']['batch']}" for r in points]
        xlabel = (
            f"fraction of the device per sample, 1/B (T = {_count(points[0]['point']['length'])})"
        )
    x = np.arange(len(points))

    def values(key, method):
        return [row["methods"].get(method, {}).get(key) for row in points]

    ax_time, ax_speedup, ax_breakdown = axes
    backward_ms = {
        m: [
            None if v is None or not _resolved(row["methods"].get(m, {})) else 1e3 * v
            for v, row in zip(values("backward_s", m), points)
        ]
        for m in methods
    }
    _log_bars(ax_time, x, backward_ms, methods, methods)
    ax_time.set_ylabel("backward time per iteration (ms, log scale)")
    ax_time.set_title(f"({letters[0]}) backward runtime per iteration")

    others = [m for m in methods if m != method_names.BASELINE]
    speedups = {m: values("backward_speedup", m) for m in others}
    _log_bars(ax_speedup, x, speedups, others, methods, include=(1.0,))
    _style.baseline_line(ax_speedup)
    ax_speedup.set_ylabel("backward speedup over BP (×, log scale)")
    ax_speedup.set_title(f"({letters[1]}) backward speedup")

    _breakdown(ax_breakdown, x, points, methods)
    ax_breakdown.set_ylabel("runtime per iteration / BP's")
    ax_breakdown.set_title(f"({letters[2]}) normalized runtime breakdown")
    for ax in axes:
        ax.set_xticks(x, ticks)
        ax.set_xlabel(xlabel)
    return [
        f"{method_names.short(m)} at {sweep} = {tick}"
        for row, tick in zip(points, ticks)
        for m in methods
        if not _resolved(row["methods"].get(m, {}))
    ]


def _resolved(m: dict) -> bool:
    """Whether a backward time was resolved (older result files do not say: resolved)."""
    return m.get("backward_s") is None or m.get("backward_resolved", True)


def _pullback(row: dict) -> bool:
    """Whether a point's forward and backward are each their own program (the forward of
    ``jax.vjp`` and its pullback, every phase its own median), not ``grad - forward``."""
    return row.get("backward") == PULLBACK


def _parts(row: dict, m: dict) -> tuple[float, float, float] | None:
    """A method's forward, backward and update (seconds) at a point, or ``None``: each its own
    program's median in a pullback file; in an older file, the one standalone forward, grad -
    forward, and the rest of the iteration."""
    if _pullback(row):
        parts = (m.get("forward_s"), m.get("backward_s"), m.get("update_s"))
        return None if not m or any(v is None for v in parts) else parts
    if not m or row["forward_s"] is None or m.get("backward_s") is None or not _resolved(m):
        return None
    update = max(m["step_s"] - row["forward_s"] - m["backward_s"], 0.0)
    return row["forward_s"], m["backward_s"], update


def _breakdown(ax, x, points, methods):
    """Stacked forward / backward / update per method, normalized by BP's iteration."""
    width = 0.8 / max(len(methods), 1)
    tops = [1.0]
    for index, method in enumerate(methods):
        offset = (index - (len(methods) - 1) / 2) * width
        fwd, bwd, upd = [], [], []
        for row in points:
            base = row["methods"].get(method_names.BASELINE, row["methods"][method])["step_s"]
            m = row["methods"].get(method, {})
            parts = _parts(row, m)
            if parts is None:
                fwd.append(np.nan), bwd.append(np.nan), upd.append(np.nan)
                continue
            fwd.append(parts[0] / base)
            bwd.append(parts[1] / base)
            upd.append(parts[2] / base)
        c = _style.color(method, index)
        tops.extend(np.add(np.add(fwd, bwd), upd))
        ax.bar(
            x + offset,
            fwd,
            width,
            color="white",
            edgecolor=c,
            hatch=_style.FORWARD_HATCH,
        )
        ax.bar(x + offset, bwd, width, bottom=fwd, color=c)
        ax.bar(x + offset, upd, width, bottom=np.add(fwd, bwd), color=c, alpha=UPDATE_ALPHA)
    _style.baseline_line(ax)
    ax.set_ylim(0, 1.1 * np.nanmax(tops))


def _keys(methods: list[str]) -> list[_style.Key]:
    """The methods' colours and the BP baseline; the phases of the breakdown panels."""
    colours = [
        Patch(color=_style.color(m, i), label=method_names.short(m)) for i, m in enumerate(methods)
    ]
    line = Line2D([], [], color=_style.COLORS[method_names.BASELINE], linestyle="--")
    line.set_label("BP baseline (speedup 1, BP's iteration)")
    grey = "#666666"
    phases = [
        Patch(facecolor="white", edgecolor=grey, hatch=_style.FORWARD_HATCH, label="forward"),
        Patch(color=grey, label="backward"),
        Patch(color=grey, alpha=UPDATE_ALPHA, label="optimizer update"),
    ]
    return [
        _style.Key([*colours, line], "methods"),
        _style.Key(phases, "runtime breakdown: phases (in each method's colour)"),
    ]


def _unresolved_note(unresolved: list[str]) -> str:
    if not unresolved:
        return ""
    return (
        f"Not drawn in (a), (b) and the breakdown: {len(unresolved)} backward time"
        f"{'s' if len(unresolved) > 1 else ''} within the timings' spread (value_and_grad's "
        f"lower quartile not above the forward's upper quartile): {', '.join(unresolved)}. "
    )


def _timing_note(points: list[dict]) -> str:
    if all(_pullback(row) for row in points):
        return (
            "Forward: the forward of each method's jax.vjp; backward: its pullback on saved "
            "residuals, its own program; update: Adam. Backward speedup = BP's backward / the "
            "method's. "
        )
    return (
        "Forward: the jitted loss alone; backward = value_and_grad - forward; update: Adam. "
        "Backward speedup = (t_BP - t_fwd) / (t_method - t_fwd), with t = value_and_grad. "
    )


def _count(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def draw(meta: dict, points: list[dict]) -> plt.Figure:
    """The figure of a sweep's point rows (one row of panels per sweep present)."""
    methods = _methods(points)
    config = meta.get("config", {})
    resolved = config.get("resolved", {})
    sweeps = [s for s in ("T", "B") if any(r["point"]["sweep"] == s for r in points)]
    fig, axes = plt.subplots(len(sweeps), 3, figsize=(15, 4.0 * len(sweeps)), squeeze=False)
    unresolved: list[str] = []
    for row_axes, sweep in zip(axes, sweeps):
        letters = "abc" if sweep == "T" else "def"
        rows = [r for r in points if r["point"]["sweep"] == sweep]
        unresolved += _row(row_axes, rows, methods, sweep, letters)
    counts = sorted({m["iterations"] for r in points for m in r["methods"].values()})
    span = (
        "?"
        if not counts
        else str(counts[0])
        if counts[0] == counts[-1]
        else (f"{counts[0]}-{counts[-1]}")
    )
    fig.suptitle(
        f"Fig. 8: RNN on synthetic bitstreams (H = {config.get('hidden', '?')}), BP vs BPPSA "
        f"| {_style.machine(meta)}"
    )
    names = [method_names.label(m, resolved.get(m)) for m in methods]
    _style.finish(
        fig,
        f"Times of each phase are medians over {span} timed training iterations per point and "
        "method (methods run in lockstep, after compilation and a warm-up call); an iteration "
        f"is the sum of its phases. {_timing_note(points)}"
        f"{_unresolved_note(unresolved)}{_style.methods_note(names)} "
        f"{_style.software(meta)}.",
        _keys(methods),
    )
    return fig


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.fig8", __doc__)
    _cli.add_run(parser, "sweep folder or its sweep.jsonl", name="sweep")
    _cli.add_out(parser, name="sweep")
    args = parser.parse_args(argv)
    meta, points = _cli.load(parser, "sweep", load_sweep, args.sweep)
    folder = _cli.out_folder(args.out, args.sweep)
    return _cli.wrote(_style.save(draw(meta, points), folder, "fig8"))


if __name__ == "__main__":
    main()
