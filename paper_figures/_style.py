"""Conventions shared by the figure scripts: the machine named in every title, the same colour
and label per method, a caption under the axes, and every figure saved as PNG and PDF.

Figure scripts read result files only (through :func:`read_rows`) and never import JAX.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed

import matplotlib.pyplot as plt
from matplotlib import ticker

from experiments._records import JsonLines

BASELINE = "bp"
COLORS = {
    "bp": "#d62728",
    "bppsa": "#1f77b4",
    "blelloch": "#ff7f0e",
    "chunked": "#2ca02c",
    "sequential-jacobians": "#9467bd",
}
_OTHER_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
LABELS = {
    "bp": "BP (jax.grad through lax.scan)",
    "bppsa": "BPPSA (bppsa.Auto)",
    "blelloch": "BPPSA, Blelloch scan (bppsa.Blelloch)",
    "chunked": "BPPSA, chunked scan (bppsa.Chunked)",
}
SHORT = {"bp": "BP", "bppsa": "BPPSA", "blelloch": "Blelloch", "chunked": "Chunked"}
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


def read_rows(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines results file (a torn last line is ignored).

    Raises:
        FileNotFoundError: naming the missing file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    return JsonLines(path).read()


def color(method: str, index: int = 0) -> str:
    """The colour of a method (fixed for the named methods, by ``index`` for the others)."""
    return COLORS.get(method, _OTHER_COLORS[index % len(_OTHER_COLORS)])


def label(method: str, resolved: str | None = None) -> str:
    """Legend label of a method, with what ``bppsa.Auto`` chose when known."""
    text = LABELS.get(method, method)
    if method == "bppsa" and resolved and "->" in resolved:
        text += f" = {resolved.split('->', 1)[1].strip()}"
    return text


def short(method: str) -> str:
    """A method's name in a crowded legend."""
    return SHORT.get(method, method)


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
    ax.axhline(y, color=COLORS[BASELINE], linestyle="--", linewidth=1.5, label=text)


def save(fig: plt.Figure, out_dir: str | pathlib.Path, name: str) -> list[pathlib.Path]:
    """Writes ``name.png`` and ``name.pdf`` into ``out_dir`` and closes the figure."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return paths
