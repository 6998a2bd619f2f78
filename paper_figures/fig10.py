"""Fig. 10: the FLOPs of every product of BPPSA's scan over the sparse transposed Jacobians of a
pruned VGG-11, against the dense product's 2mnk, with the critical path highlighted and the BP
baseline.

Reads ``analyze.json`` written by ``python -m experiments.pruned_vgg11 analyze``. Panel (a):
one bar per product of the scan with ``--levels`` parallel levels (default: 2, the paper's;
``all``: the full scan), in the order the scan forms them (up-sweep levels, the linear scan,
down-sweep levels), coloured by kind (SpGEMM, SpMM: sparse @ dense, SpMV, GEMM/GEMV) and
outlined in black where the product lies on a longest chain of dependent products; a grey tick
marks what the same product would cost dense (2mnk), log scale; the dashed line is dense BP's
largest per-layer input gradient. Panel (b): totals, log scale: dense BP's chain of input
gradients (all on its critical path), the sequential sparse chain, and every analysed scan's
FLOPs in all and on its critical path (the largest sum of FLOPs along dependent products).

Run: ``python -m paper_figures.fig10 results/pruned_vgg11/analyze-quick [--levels all]
[--out DIR]``; writes ``fig10.png`` and ``fig10.pdf`` (default folder: ``<run>/figures``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from paper_figures import _cli, _style
from paper_figures.result_files import read_json

RESULT = "analyze.json"
KIND_COLORS = {
    "SpGEMM": "#1f77b4",
    "SpMM": "#17becf",
    "SpMV": "#2ca02c",
    "GEMM": "#ff7f0e",
    "GEMV": "#bcbd22",
}
SWEEPS = ("up", "linear", "down")
GROUP_GAP = 3.0  # points between the axes and the labels of the groups of products above it
DATA_SHARE = 0.78  # of the height of panel (b) that its bars may reach


def load(path: str | pathlib.Path) -> dict:
    """The analysis result of a run folder or of its ``analyze.json``.

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: a file that is not an analysis result.
    """
    path = pathlib.Path(path)
    file = path / RESULT if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no analysis result at {file}")
    result = read_json(file)
    if not isinstance(result, dict) or "scans" not in result or "baselines" not in result:
        raise ValueError(f"{file} is not an analysis result of experiments.pruned_vgg11 analyze")
    return result


def _scan_label(key: str) -> str:
    if key == "all":
        return "full scan"
    return f"{key} level" if key == "1" else f"{key} levels"


def _order(rows: list[dict]) -> list[dict]:
    """Up-sweep by level, the linear scan, down-sweep from the top level down."""

    def key(row):
        sweep = SWEEPS.index(row["sweep"])
        level = row["level"] if row["sweep"] != "down" else -row["level"]
        return sweep, level, row["index"]

    return sorted(rows, key=key)


def _products(ax: plt.Axes, result: dict, key: str) -> _style.Key:
    """Panel (a); returns its legend."""
    rows = _order(result["scans"][key]["rows"])
    x = np.arange(len(rows))
    flops = np.array([max(r["flops"], 1) for r in rows], float)
    dense = np.array([max(r["dense_flops"], 1) for r in rows], float)
    colors = [KIND_COLORS.get(r["kind"], "#7f7f7f") for r in rows]
    edges = ["black" if r["critical"] else "none" for r in rows]
    ax.bar(x, flops, 0.8, color=colors, edgecolor=edges, linewidth=1.4)
    ax.scatter(x, dense, marker="_", s=90, color="#555555", zorder=3, label="dense 2mnk")
    bp_layer = max(r["bp_input_flops"] for r in result["layers"])
    _style.baseline_line(ax, bp_layer, "BP: largest dense input gradient of one layer")
    ax.set_yscale("log")
    ax.set_xticks(x[:: max(1, len(x) // 20)])
    ax.set_xlim(-0.8, len(rows) - 0.2)
    groups, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or (rows[i]["sweep"], rows[i]["level"]) != (
            rows[start]["sweep"],
            rows[start]["level"],
        ):
            groups.append((start, i - 1, rows[start]["sweep"], rows[start]["level"]))
            start = i
    _group_labels(ax, groups)
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    handles = [Patch(color=KIND_COLORS.get(k, "#7f7f7f"), label=k) for k in kinds]
    handles.append(Patch(facecolor="white", edgecolor="black", label="on the critical path"))
    handles += ax.get_legend_handles_labels()[0]
    ax.set_xlabel("product of the scan, in the order formed")
    ax.set_ylabel("FLOPs (log scale)")
    return _style.Key(handles, "(a) products")


def _group_labels(ax: plt.Axes, groups: list[tuple[int, int, str, int]]) -> None:
    """The sweep and level of each group of products, above the axes: upright where the group
    is wide enough for it (judged at the axes' width before the layout, less a margin), turned
    otherwise; the title is raised above the tallest."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    left, right = ax.get_xlim()
    points_per_unit = 0.9 * ax.get_position().width * fig.get_figwidth() * 72 / (right - left)
    tallest = 0.0
    for first, last, sweep, level in groups:
        if first:
            ax.axvline(first - 0.5, color="#999999", linewidth=0.8)
        label = ax.annotate(
            "linear" if sweep == "linear" else f"{sweep} {level}",
            ((first + last) / 2, 1.0),
            xycoords=ax.get_xaxis_transform(),
            xytext=(0, GROUP_GAP),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
        points = 72 / fig.dpi
        if label.get_window_extent(renderer).width * points > (last - first + 1) * points_per_unit:
            label.set_rotation(90)
        tallest = max(tallest, label.get_window_extent(renderer).height * points)
    ax.set_title(ax.get_title(), pad=2 * GROUP_GAP + tallest)


def _totals(ax: plt.Axes, result: dict) -> _style.Key:
    """Panel (b); returns its legend."""
    base = result["baselines"]
    labels = ["BP\n(dense)", "sparse\nchain"]
    all_flops = [base["bp"]["flops"], base["sparse_chain"]["flops"]]
    critical = [base["bp"]["critical_path_flops"], base["sparse_chain"]["critical_path_flops"]]
    for key, scan in result["scans"].items():
        labels.append(f"BPPSA\n{_scan_label(key)}")
        all_flops.append(scan["totals"]["flops"])
        critical.append(scan["totals"]["critical_path_flops"])
    x = np.arange(len(labels))
    width = 0.38
    bars_all = ax.bar(x - width / 2, np.maximum(all_flops, 1), width, color="#1f77b4", label="all")
    bars_crit = ax.bar(
        x + width / 2, np.maximum(critical, 1), width, color="#d62728", label="critical path"
    )
    _style.baseline_line(ax, base["bp"]["flops"], "BP baseline")
    ax.set_yscale("log")
    # The ratios stand in a row along the top, in a band the data leave free: the bars reach
    # at most DATA_SHARE of the log axis' height.
    low, high = np.log10(max(min(all_flops + critical), 1) / 3), np.log10(max(all_flops + critical))
    ax.set_ylim(10**low, 10 ** (low + (high - low) / DATA_SHARE))
    for bars, values in ((bars_all, all_flops), (bars_crit, critical)):
        for bar, value in zip(bars, values):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                0.98,
                f"{value / base['bp']['flops']:.2g}x",
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=6.5,
                rotation=90,
            )
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("FLOPs of the backward's chain (log scale)")
    ax.set_title("(b) totals (top row: ratio to BP)")
    return _style.Key(ax.get_legend_handles_labels()[0], "(b) totals")


def draw(result: dict, levels: str | None = None) -> plt.Figure:
    """The figure of an analysis ``result``; ``levels``: the key of the scan of panel (a)."""
    scans = result["scans"]
    key = levels or ("2" if "2" in scans else next(iter(scans)))
    if key not in scans:
        raise KeyError(f"the analysis holds no scan with levels {key!r}; it has {sorted(scans)}")
    fig, (ax_products, ax_totals) = plt.subplots(
        1, 2, figsize=(13, 4.6), gridspec_kw=dict(width_ratios=(2.2, 1))
    )
    ax_products.set_title(f"(a) every product of the scan with {_scan_label(key)}")
    keys = [_products(ax_products, result, key), _totals(ax_totals, result)]
    config = result.get("config", {})
    sparsity = result.get("sparsity", {}).get("overall")
    source = "a trained checkpoint" if config.get("checkpoint") else "a seeded initialization"
    fig.suptitle(
        f"Fig. 10: FLOPs of BPPSA's scan over the sparse J^T of {result.get('net', 'VGG-11')}, "
        f"B = {result['batch']}\n"
        + (f"{100 * sparsity:.3g}% of weights pruned" if sparsity is not None else "")
        + f" ({config.get('scope', '?')} magnitude pruning of {source})"
    )
    base = result["baselines"]
    empty = result.get("empty_layers") or []
    _style.finish(
        fig,
        (f"WARNING: layers {empty} pruned to nothing (network disconnected). " if empty else "")
        + "FLOPs = 2 x matched index pairs of each sparse product (analysed from the static "
        "patterns, nothing run); dense 2mnk: the same product on dense matrices. BP: the dense "
        "backward as XLA runs it (conv input gradient 2 B Cout Cin k^2 Ho Wo, ReLU/MaxPool one "
        "per element), a sequential chain; weight gradients "
        f"({base['weight_gradient_flops']:.3g} FLOPs) are the same for every method and left "
        "out. Critical path: the largest sum of FLOPs along dependent products."
        + f" {_style.software(result.get('metadata', {}))}.",
        keys,
    )
    return fig


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.fig10", __doc__)
    _cli.add_run(parser, "analyze run folder or its analyze.json")
    parser.add_argument("--levels", help="scan of panel (a): 1, 2, ... or all (default 2)")
    _cli.add_out(parser)
    args = parser.parse_args(argv)
    result = _cli.load(parser, "run", load, args.run)
    if args.levels is not None and args.levels not in result["scans"]:
        parser.error(
            f"argument --levels: the analysis holds the scans {sorted(result['scans'])}, "
            f"not {args.levels!r}"
        )
    folder = _cli.out_folder(args.out, args.run)
    return _cli.wrote(_style.save(draw(result, args.levels), folder, "fig10"))


if __name__ == "__main__":
    main()
