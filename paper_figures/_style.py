"""Conventions shared by the figure scripts: the machine named in every title, the same colour
per method (its labels: :mod:`paper_figures.result_files.methods`), and every figure saved as PNG
and PDF.

Layout, the same in every figure (:func:`finish`): the axes with their titles and labels on top,
then the legends in a band under them (never inside an axes), then the caption, wrapped to the
figure's width, which also says in full what each method was (legends give short names). The
band and the caption are measured and the figure grown to hold them, so nothing overlaps however
long a label or a caption is; ``tests/paper_figures/test_layout.py`` checks it on every figure.

Figure scripts read result files only (through :mod:`paper_figures.result_files`) and never import
JAX.
"""

from __future__ import annotations

import dataclasses
import pathlib
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.artist import Artist
from matplotlib.legend import Legend

from paper_figures.result_files import methods as method_names

COLORS = {
    method_names.BP: "#d62728",
    method_names.BPPSA: "#1f77b4",
    method_names.BLELLOCH: "#ff7f0e",
    method_names.CHUNKED: "#2ca02c",
    method_names.SEQUENTIAL_JACOBIANS: "#9467bd",
}
_OTHER_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
FORWARD_HATCH = "////"

plt.rcParams.update(
    {
        "font.size": 10,
        "axes.titlesize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "legend.fontsize": 8,
        # Text's width in inches changes with the resolution (hinting): the layout is measured
        # at the resolution the PNG is written at.
        "figure.dpi": 150,
        "savefig.dpi": 150,
    }
)


def color(method: str, index: int = 0) -> str:
    """The colour of a method (fixed for the names of :data:`COLORS`, by ``index`` for the
    others: the benchmarks' ``auto`` too, whose figure was drawn so)."""
    return COLORS.get(method, _OTHER_COLORS[index % len(_OTHER_COLORS)])


def plain_log_axis(ax: plt.Axes) -> None:
    """A log-scale y axis labelled with plain numbers (0.5, 1, 2, 10) instead of powers."""
    ax.set_yscale("log")
    formatter = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(formatter)
    ax.yaxis.set_minor_locator(ticker.LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(formatter)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def machine(meta: Mapping[str, Any]) -> str:
    """The machine of a run, from its metadata row: e.g. ``CPU: AMD EPYC (2 cores)``."""
    if meta.get("platform") == "cpu":
        name = meta.get("cpu_model") or meta.get("machine") or "unknown model"
        return f"CPU: {name} ({meta.get('cpus', '?')} cores)"
    return f"{str(meta.get('platform', 'device')).upper()}: {meta.get('device', 'unknown')}"


def software(meta: Mapping[str, Any]) -> str:
    """``jax X, bppsa Y, <date>`` of a run, from its metadata row."""
    versions = meta.get("versions", {})
    return (
        f"jax {versions.get('jax', '?')}, bppsa {versions.get('bppsa', '?')}, "
        f"{str(meta.get('started', '?'))[:10]}"
    )


CAPTION_SIZE = 7.5
_EDGE = 6.0  # points left free at the figure's edges and between the parts of the layout


@dataclasses.dataclass
class Key:
    """A legend for :func:`finish`: ``handles`` (labelled artists), under an optional ``title``
    (e.g. the panel it explains)."""

    handles: Sequence[Artist]
    title: str | None = None


def methods_note(labels: Iterable[str]) -> str:
    """The caption's sentence saying in full what the short names in the legends stand for:
    ``labels`` from :func:`paper_figures.result_files.methods.label`, e.g. ``Methods: BP (jax.grad
    through lax.scan); BPPSA (bppsa.Auto) = Chunked(chunks=1).``"""
    return "Methods: " + "; ".join(dict.fromkeys(labels)) + "."


def finish(fig: plt.Figure, caption: str, keys: Sequence[Key] = ()) -> None:
    """Lays ``fig`` out: its axes (``tight_layout`` under the suptitle), the legends ``keys``
    in a band under them (side by side where they fit, each with as many columns as fit), and
    ``caption`` wrapped under the legends. The figure grows by the height of the band and the
    caption, so the axes keep the size they were made with."""
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72.0  # pixels per point
    edge = _EDGE * px
    width = fig.bbox.width - 2 * edge
    legends = [_fitted_legend(fig, key, width, renderer) for key in keys]
    rows: list[list[Legend]] = []
    for legend in legends:
        row_width = sum(_size(lg, renderer)[0] + edge for lg in rows[-1]) if rows else 0.0
        if rows and row_width + _size(legend, renderer)[0] <= width:
            rows[-1].append(legend)
        else:
            rows.append([legend])
    # A margin for the other resolutions text is written at (a PDF, a smaller PNG).
    text = fig.text(0, 0, _wrapped(fig, caption, 0.95 * width, renderer), fontsize=CAPTION_SIZE)
    text.set_verticalalignment("bottom")
    caption_height = text.get_window_extent(renderer).height
    row_heights = [max(_size(lg, renderer)[1] for lg in row) for row in rows]
    band = edge + caption_height + sum(h + edge for h in row_heights) + edge
    fig_width, fig_height = fig.get_size_inches()
    fig.set_size_inches(fig_width, fig_height + band / fig.dpi)
    total = fig.bbox.height
    text.set_position((edge / fig.bbox.width, edge / total))
    y = edge + caption_height + edge
    for row, height in zip(reversed(rows), reversed(row_heights)):
        used = sum(_size(lg, renderer)[0] for lg in row) + edge * (len(row) - 1)
        x = edge + (width - used) / 2
        for legend in row:
            legend.set_bbox_to_anchor((x / fig.bbox.width, y / total), transform=fig.transFigure)
            x += _size(legend, renderer)[0] + edge
        y += height + edge
    fig.tight_layout(rect=(0, y / total, 1, 1))


def _fitted_legend(fig: plt.Figure, key: Key, width: float, renderer) -> Legend:
    """The legend of ``key`` in as few rows as fit in ``width`` (pixels), its entries spread
    evenly over them (8 entries in two rows of 4 rather than 5 and 3)."""
    labels = [h.get_label() for h in key.handles]

    def legend(ncol: int) -> Legend:
        return fig.legend(
            key.handles, labels, title=key.title, ncol=ncol, loc="lower left", borderaxespad=0
        )

    for ncol in range(len(labels), 1, -1):
        widest = legend(ncol)
        fits = _size(widest, renderer)[0] <= width
        widest.remove()
        if fits:
            rows = -(-len(labels) // ncol)
            return legend(-(-len(labels) // rows))
    return legend(1)


def _size(artist: Artist, renderer) -> tuple[float, float]:
    box = artist.get_window_extent(renderer)
    return box.width, box.height


def _wrapped(fig: plt.Figure, text: str, width: float, renderer) -> str:
    """``text`` broken into lines no wider than ``width`` pixels (at the caption's size)."""
    probe = fig.text(0, 0, text, fontsize=CAPTION_SIZE)
    full = probe.get_window_extent(renderer).width
    chars = max(20, int(len(text) * width / max(full, 1.0)))
    while True:
        lines = textwrap.fill(text, chars, break_long_words=True)
        probe.set_text(lines)
        if probe.get_window_extent(renderer).width <= width or chars <= 20:
            probe.remove()
            return lines
        chars -= 2


def baseline_line(ax: plt.Axes, y: float = 1.0, text: str = "BP baseline") -> None:
    ax.axhline(y, color=COLORS[method_names.BASELINE], linestyle="--", linewidth=1.5, label=text)


def save(fig: plt.Figure, out_dir: str | pathlib.Path, name: str) -> list[pathlib.Path]:
    """Writes ``name.png`` and ``name.pdf`` into ``out_dir`` and closes the figure."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return paths
