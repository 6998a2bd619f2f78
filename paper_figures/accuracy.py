"""Accuracy study: float32 gradient error of BPPSA and of BP against float64, over T.

Reads the JSON of ``python -m benchmarks.accuracy`` and draws one panel per cell (RNN, GRU) and
recurrent weights (contractive, expansive): the median over the examples of each float32
gradient's normwise relative error, end to end (solid) and of the backward pass alone along one
float32 forward trajectory (dashed), for BP and every BPPSA method. Also writes the table of
those numbers (markdown).

Run: ``python -m paper_figures.accuracy [RESULTS] [--out DIR]`` (default results:
``benchmarks/results/accuracy_cpu.json``; default folder: ``paper_figures/output``); writes
``accuracy.png``, ``accuracy.pdf`` and ``accuracy.md``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Sequence

import matplotlib.pyplot as plt

from paper_figures import _cli, _style
from paper_figures.result_files import methods as method_names
from paper_figures.result_files import read_json

DEFAULT_RESULTS = pathlib.Path("benchmarks/results/accuracy_cpu.json")
DEFAULT_OUT = pathlib.Path("paper_figures/output")
DPI = 100
KINDS = {"end_to_end": ("end to end", "-"), "backward_only": ("backward only", "--")}


def load(path: str | pathlib.Path) -> dict:
    """The results of ``benchmarks.accuracy``.

    Raises:
        FileNotFoundError: naming the missing file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    return read_json(path)


def _methods(rows: list[dict]) -> list[str]:
    return list(rows[0]["end_to_end"]) if rows else []


def _median(row: dict, kind: str, method: str) -> float | None:
    return row[kind][method]["median"]


def draw(payload: dict) -> plt.Figure:
    """The figure of a results payload."""
    rows = payload["rows"]
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    methods = _methods(rows)
    fig, axes = plt.subplots(
        len(cells),
        len(regimes),
        figsize=(5.2 * len(regimes), 3.4 * len(cells) + 0.4),
        squeeze=False,
    )
    for i, cell in enumerate(cells):
        for j, regime in enumerate(regimes):
            ax = axes[i][j]
            panel = sorted(
                (r for r in rows if r["cell"] == cell and r["regime"] == regime),
                key=lambda r: r["length"],
            )
            if not panel:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"no results for {cell}, {regime}", ha="center")
                continue
            lengths = [r["length"] for r in panel]
            for index, method in enumerate(methods):
                for kind, (label, style) in KINDS.items():
                    values = [_median(r, kind, method) for r in panel]
                    ax.plot(
                        lengths,
                        [float("nan") if v is None else v for v in values],
                        style,
                        marker="o" if method == method_names.BP else ".",
                        color=_style.color(method, index),
                        linewidth=2.2 if method == method_names.BP else 1.2,
                        label=f"{method_names.in_table(method)}, {label}",
                    )
            overflow = [
                r["length"] for r in panel if _median(r, "end_to_end", method_names.BP) is None
            ]
            title = f"{cell.upper()}, {regime} weights (||W_hh|| = {panel[0]['gain']:g})"
            if overflow:
                ax.axvspan(min(overflow) / 1.5, max(overflow) * 1.5, color="0.85", zorder=0)
                title += f"\ngrey: float32 overflows (every method), T >= {min(overflow):,}"
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(title)
            ax.set_xlabel("sequence length T")
            ax.set_ylabel("float32 gradient error vs float64")
    handles = next((ax.get_legend_handles_labels()[0] for ax in axes.flat if ax.lines), [])
    fig.suptitle(
        f"Float32 gradient error of BPPSA and BP (B = {payload.get('batch')}, "
        f"H = {payload.get('hidden')}; {payload.get('device', payload.get('backend', '?'))}, "
        f"jax {payload.get('jax', '?')})"
    )
    _style.finish(
        fig,
        "Error of each example's gradient: max over parameter leaves of max|g - g64| / max|g64|; "
        "the median over the examples. Solid: against jax.grad through lax.scan in float64. "
        "Dashed: every method back-propagates along the same float32 forward trajectory, "
        "against float64 back-propagation along it (the error of the backward pass alone). "
        "Expansive weights: the float32 and float64 trajectories part ways (chaos), so "
        "end-to-end errors reach 1e-2 and beyond for BP as much as for BPPSA.",
        [_style.Key(handles)] if handles else [],
    )
    return fig


def _fmt(value: float | None) -> str:
    return "overflow" if value is None else f"{value:.1e}"


def table(payload: dict, lengths: Iterable[int] | None = None) -> str:
    """A markdown table of the medians (all lengths, or only ``lengths``)."""
    rows = payload["rows"]
    methods = _methods(rows)
    heads = [method_names.in_table(m) for m in methods]
    head = (
        "| cell | weights | T | max abs gradient (float64, median) | "
        + " | ".join(f"end to end: {n}" for n in heads)
        + " | "
        + " | ".join(f"backward only: {n}" for n in heads)
        + " |"
    )
    lines = [head, "|" + "---|" * (4 + 2 * len(methods))]
    for r in rows:
        if lengths is not None and r["length"] not in lengths:
            continue
        cells = [r["cell"].upper(), f"{r['regime']} ({r['gain']:g})", f"{r['length']:,}"]
        cells.append(f"{r['grad_norm']:.1e}")
        cells += [_fmt(_median(r, kind, m)) for kind in KINDS for m in methods]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.accuracy", __doc__)
    parser.add_argument(
        "results",
        type=pathlib.Path,
        nargs="?",
        default=DEFAULT_RESULTS,
        help=f"the JSON of benchmarks.accuracy (default {DEFAULT_RESULTS})",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help=f"output folder (default {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    payload = _cli.load(parser, "results", load, args.results)
    with plt.rc_context({"savefig.dpi": DPI}):  # a small file for the repository
        paths = _style.save(draw(payload), args.out, "accuracy")
    markdown = args.out / "accuracy.md"
    markdown.write_text(table(payload))
    return _cli.wrote([*paths, markdown])


if __name__ == "__main__":
    main()
