"""Table 1: time to generate the transposed Jacobians of VGG-11's first Conv2d, ReLU and MaxPool2d
analytically (sparse, static patterns) against by reverse-mode autodiff (``jax.jacrev``, dense).

Reads ``jacobians.jsonl`` written by ``python -m experiments.pruned_vgg11 jacobians`` and writes
``table1.md`` (a Markdown table: layer, input, ``J^T`` shape, guaranteed-zero fraction next to
the paper's, median times, speedup, whether both gave the same matrix) and a small figure
``table1.png``/``table1.pdf`` (the median times of both, log scale, with the speedups).

Run: ``python -m paper_figures.table1 results/pruned_vgg11/jacobians-quick [--out DIR]``
(default folder: ``<run>/figures``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from paper_figures import _cli, _style
from paper_figures.result_files import methods as method_names
from paper_figures.result_files import read_points

POINTS = "jacobians.jsonl"
ORDER = ("conv", "relu", "maxpool")


def load(path: str | pathlib.Path) -> tuple[dict, list[dict]]:
    """The first metadata row and the last row of each layer (in the order conv, relu, pool).

    Raises:
        FileNotFoundError: when there is no ``jacobians.jsonl``.
        ValueError: when it holds no measured layer.
    """
    meta, layers = read_points(path, POINTS, lambda p: (p["input_size"], p["layer"]))
    if not layers:
        raise ValueError(f"{path} holds no measured layer yet")
    ordered = sorted(layers.items(), key=lambda item: (item[0][0], ORDER.index(item[0][1])))
    return meta, [row for _, row in ordered]


def markdown(meta: dict, rows: list[dict]) -> str:
    """The table, with a line on how it was measured."""
    lines = [
        "| layer | input (C x H x W) | J^T shape | guaranteed zeros | paper | analytic (ms) "
        "| jax.jacrev (ms) | speedup | same matrix |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        paper = "-" if row.get("paper_sparsity") is None else f"{row['paper_sparsity']:.5f}"
        check = row["check"]
        same = "yes" if check["same"] else f"NO (max diff {check['max_abs_diff']:.2g})"
        lines.append(
            f"| {row['layer']} | {' x '.join(map(str, row['input_shape'][1:]))} | "
            f"{row['shape_t'][0]:,} x {row['shape_t'][1]:,} | {row['sparsity']:.5f} | {paper} | "
            f"{1e3 * row['analytic_s']:.3f} | {1e3 * row['dense_s']:,.1f} | "
            f"{row['speedup']:,.0f}x | {same} |"
        )
    blocked = [r["layer"] for r in rows if r["dense_blocks"] > 1]
    notes = [
        "",
        f"Medians of {rows[0]['repeats']} interleaved rounds after a warm-up call, B = 1, "
        f"float32; {_style.machine(meta)}; {_style.software(meta)}. Analytic: "
        "bppsa.jacobians builders under jax.jit (the static pattern is built once, at trace "
        "time); dense: jax.jacrev of the layer, jitted.",
    ]
    if blocked:
        notes.append(
            f"The dense Jacobians of {', '.join(blocked)} are computed in blocks of rows "
            "(jax.vmap of the VJP over rows of the identity, which is jax.jacrev's algorithm), "
            "since a whole one would not fit in memory; the time is that of all blocks."
        )
    return "\n".join(lines + notes) + "\n"


def draw(meta: dict, rows: list[dict]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    x = np.arange(len(rows))
    width = 0.38
    analytic = [1e3 * r["analytic_s"] for r in rows]
    dense = [1e3 * r["dense_s"] for r in rows]
    ax.bar(
        x - width / 2,
        analytic,
        width,
        color=_style.color(method_names.BPPSA),
        label="analytic (sparse)",
    )
    bars = ax.bar(
        x + width / 2, dense, width, color=_style.color(method_names.BP), label="jax.jacrev (dense)"
    )
    for bar, row in zip(bars, rows):
        ax.annotate(
            f"{row['speedup']:,.0f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    _style.plain_log_axis(ax)
    ax.set_ylim(min(analytic) / 3, max(analytic + dense) * 12)  # room above for the speedups
    sizes = [f"{r['layer']}\n{' x '.join(map(str, r['input_shape'][1:]))}" for r in rows]
    ax.set_xticks(x, sizes, fontsize=8)
    ax.set_ylabel("time to generate J^T (ms, log scale)")
    fig.suptitle(f"Table 1: generating transposed Jacobians | {_style.machine(meta)}", fontsize=9)
    _style.finish(
        fig,
        "Medians after warm-up, B = 1; numbers: speedup of the analytic builder. "
        f"{_style.software(meta)}.",
        [_style.Key(ax.get_legend_handles_labels()[0])],
    )
    return fig


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.table1", __doc__)
    _cli.add_run(parser, "jacobians run folder or its jsonl")
    _cli.add_out(parser)
    args = parser.parse_args(argv)
    meta, rows = _cli.load(parser, "run", load, args.run)
    folder = _cli.out_folder(args.out, args.run)
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "table1.md"
    table.write_text(markdown(meta, rows))
    return _cli.wrote([table, *_style.save(draw(meta, rows), folder, "table1")])


if __name__ == "__main__":
    main()
