"""Conventions shared by the figure scripts: the machine named in every title, the same colour
per method (its labels: :mod:`results_io.methods`), a caption under the axes, and every figure
saved as PNG and PDF.

Figure scripts read result files only (through :mod:`results_io`) and never import JAX.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed

import matplotlib.pyplot as plt
from matplotlib import ticker

from results_io import methods as method_names

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


def caption(fig: plt.Figure, text: str) -> None:
    """A caption under the axes (wrapped to the figure's width)."""
    fig.text(0.01, 0.005, text, ha="left", va="bottom", fontsize=7.5, wrap=True)


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
