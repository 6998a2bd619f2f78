"""Fig. 9: runtime breakdown of a training iteration of the GRU on IRMAS features, BPPSA vs BP,
for the variants S, M, L (rows) and batch sizes 16, 32, 64 (columns).

Reads ``breakdown.jsonl`` written by ``python -m experiments.gru_irmas breakdown``. In each
panel, normalized by BP's forward + backward: the BPPSA bar stacks the forward (FP), BPPSA's
backward scan and parameter gradients, and the overhead of building the transposed Jacobians
(FO); the BP bar stacks the forward and BP's backward. The numbers above the bars are
milliseconds; each panel's title gives BPPSA's backward speedup ``BP bwd / (BPPSA bwd + FO)``.
In a file whose rows say ``"backward": "pullback"`` every part is its own program (each
gradient's forward of ``jax.vjp`` and its pullback; FO, the Jacobians built alone, is drawn
inside BPPSA's backward, which builds them); in an older file FO and both backwards were
differences of the totals and one standalone forward.

Run: ``python -m paper_figures.fig9 results/gru_irmas/breakdown-quick [--out DIR]``; writes
``fig9.png`` and ``fig9.pdf`` (default folder: ``<run>/figures``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import matplotlib.pyplot as plt

from paper_figures import _cli, _style
from paper_figures.result_files import PULLBACK, read_points
from paper_figures.result_files import methods as method_names

BREAKDOWN_LOG = "breakdown.jsonl"
VARIANTS = ("S", "M", "L")
FO_COLOR = "#2ca02c"
FP_COLOR = "#ff7f0e"


def load_breakdown(path: str | pathlib.Path) -> tuple[dict, dict[tuple[str, int], dict]]:
    """The first metadata row, and the last point row of each ``(variant, batch)``.

    Raises:
        FileNotFoundError: when there is no ``breakdown.jsonl``.
        ValueError: when it holds no measured point.
    """
    meta, points = read_points(path, BREAKDOWN_LOG, lambda p: (p["variant"], p["batch"]))
    if not points:
        raise ValueError(f"{path} holds no measured point yet")
    return meta, points


def synthetic(meta: dict) -> bool:
    """Whether any variant of the run was measured on the synthetic fixture."""
    data = meta.get("config", {}).get("data", {})
    return any(entry.get("synthetic") for entry in data.values())


def _pullback(row: dict) -> bool:
    """Whether a row's parts are each their own program (the forward of ``jax.vjp``, its
    pullback, the Jacobians alone), not differences of the totals and a standalone forward."""
    return row.get("backward") == PULLBACK


def _parts(row: dict) -> dict[str, float]:
    """The bars' parts in seconds: ``bppsa_fp``, ``scan`` and ``fo`` (BPPSA's forward, backward
    and, inside the backward, the Jacobians), ``bp_fp`` and ``bp`` (BP's forward and backward).

    In a pullback file the BPPSA backward is its own program and holds the Jacobians, timed
    apart as ``fo`` (drawn inside the backward, not added to it); in an older file FO and the
    scan were differences of the totals and one standalone forward, stacked."""
    if _pullback(row):
        fo = min(row["jacobians_s"], row["bppsa_backward_s"])
        return dict(
            bppsa_fp=row["bppsa_forward_s"],
            scan=row["bppsa_backward_s"] - fo,
            fo=fo,
            bp_fp=row["bp_forward_s"],
            bp=row["bp_backward_s"],
        )
    return dict(
        bppsa_fp=row["forward_s"],
        scan=max(row["bppsa_backward_s"], 0.0),
        fo=max(row["jacobians_s"], 0.0),
        bp_fp=row["forward_s"],
        bp=row["bp_backward_s"],
    )


def _panel(ax: plt.Axes, row: dict) -> float:
    """The two stacked bars of ``row``; returns the taller one's height."""
    total = row["bp_s"]
    part = {k: v / total for k, v in _parts(row).items()}
    fp, scan, fo, bp = part["bppsa_fp"], part["scan"], part["fo"], part["bp"]
    hatch = _style.FORWARD_HATCH
    ax.bar(0, fp, 0.6, color=FP_COLOR, hatch=hatch, edgecolor="white", label="FP (forward)")
    ax.bar(0, scan, 0.6, bottom=fp, color=_style.color(method_names.BPPSA), label="BPPSA backward")
    ax.bar(0, fo, 0.6, bottom=fp + scan, color=FO_COLOR, label="FO (building Jacobians)")
    ax.bar(1, part["bp_fp"], 0.6, color=FP_COLOR, hatch=hatch, edgecolor="white")
    ax.bar(
        1, bp, 0.6, bottom=part["bp_fp"], color=_style.color(method_names.BP), label="BP backward"
    )
    tops = (fp + scan + fo, part["bp_fp"] + bp)
    for x, top, seconds in zip((0, 1), tops, (row["bppsa_s"], row["bp_s"])):
        ax.annotate(
            f"{1e3 * seconds:.1f} ms",
            (x, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_xticks([0, 1], ["BPPSA", "BP"])
    return max(tops)


def _speedup(row: dict) -> float:
    parts = _parts(row)
    return parts["bp"] / max(parts["fo"] + parts["scan"], 1e-12)


def draw(meta: dict, points: dict[tuple[str, int], dict]) -> plt.Figure:
    """The 3 x 3 grid (variants x batch sizes) of ``points``."""
    variants = [v for v in VARIANTS if any(p[0] == v for p in points)]
    batches = sorted({b for _, b in points})
    fig, axes = plt.subplots(
        len(variants),
        len(batches),
        figsize=(2.6 * len(batches) + 1.2, 2.4 * len(variants) + 0.6),
        sharey=True,
        squeeze=False,
    )
    top, handles = 1.0, []
    for i, v in enumerate(variants):
        for j, b in enumerate(batches):
            ax = axes[i][j]
            row = points.get((v, b))
            if row is None:
                ax.set_title(f"batch size {b}")
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                continue
            top = max(top, _panel(ax, row))
            handles = handles or ax.get_legend_handles_labels()[0]
            ax.set_title(f"batch size {b}: bwd {_speedup(row):.2f}x")
            if j == 0:
                shape = f"T={row.get('frames', '?')}, F={row.get('features', '?')}"
                ax.set_ylabel(f"{v} ({shape})\nruntime / BP total")
    axes[0][0].set_ylim(0, 1.25 * top)  # shared: room above every bar for its label
    note = " | SYNTHETIC FIXTURE, NOT IRMAS" if synthetic(meta) else ""
    config = meta.get("config", {})
    resolved = next((r.get("resolved") for r in points.values() if r.get("resolved")), None)
    fig.suptitle(
        f"Fig. 9: GRU (H = {config.get('hidden', '?')}) on IRMAS MFCCs, runtime breakdown"
        f"{note}\n{_style.machine(meta)}",
        y=0.995,
        va="top",
    )
    method = method_names.label(method_names.BPPSA, resolved)
    _style.finish(
        fig,
        f"Medians of {config.get('repeats', '?')} interleaved rounds per panel; normalized by "
        "BP's value_and_grad; above each bar its total in ms. bwd: BPPSA's backward speedup, "
        f"BP backward / (BPPSA backward + FO). {_timing_note(points.values())}"
        "Optimizer update excluded. "
        f"{_style.methods_note([method])} {_style.software(meta)}.",
        [_style.Key(handles)],
    )
    return fig


def _timing_note(rows) -> str:
    if all(_pullback(row) for row in rows):
        return (
            "Each part its own program: FP, the forward of each gradient's jax.vjp; backward, "
            "its pullback on saved residuals; FO, every step's transposed Jacobian "
            "(bppsa.jacobians.gru_jacobian_t, all steps at once) from the saved states, timed "
            "alone and drawn inside BPPSA's backward, which builds them (BPPSA backward + FO: "
            "its pullback's time). "
        )
    return (
        "FP: jitted loss. FO: forward keeping every state plus every step's transposed Jacobian "
        "(bppsa.jacobians.gru_jacobian_t, all steps at once) minus FP. BPPSA backward: "
        "bppsa.value_and_grad total - FP - FO. BP backward: jax.grad through lax.scan total - "
        "FP. "
    )


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.fig9", __doc__)
    _cli.add_run(parser, "folder holding breakdown.jsonl")
    _cli.add_out(parser)
    args = parser.parse_args(argv)
    meta, points = _cli.load(parser, "run", load_breakdown, args.run)
    folder = _cli.out_folder(args.out, args.run)
    return _cli.wrote(_style.save(draw(meta, points), folder, "fig9"))


if __name__ == "__main__":
    main()
