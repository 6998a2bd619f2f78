"""Fig. 13: training loss of the GRU on IRMAS features against wall-clock time, BP vs BPPSA, for
the variants S, M and L (one panel each).

Reads ``<run>/<variant>-B<batch>/<method>/metrics.jsonl`` written by
``python -m experiments.gru_irmas train``. Thin lines: the per-iteration mini-batch loss; thick:
its trailing moving average; markers: the loss over the whole training set at the end of each
epoch (when the run evaluated it). The x axis is the cumulative time of the training steps.

Run: ``python -m paper_figures.fig13 results/gru_irmas/train-quick [--batch 16] [--out DIR]``;
writes ``fig13.png`` and ``fig13.pdf`` (default folder: ``<run>/figures``).
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from paper_figures import _cli, _style
from paper_figures.fig7 import moving_average
from paper_figures.result_files import methods as method_names
from paper_figures.result_files import read_rows

METRICS = "metrics.jsonl"
VARIANTS = ("S", "M", "L")
_FOLDER = re.compile(r"^(?P<variant>[SML])-B(?P<batch>\d+)$")


def load_runs(run_dir: str | pathlib.Path, batch: int | None = None) -> dict[str, dict]:
    """``{variant: {method: rows}}`` of the runs under ``run_dir`` at ``batch`` (default: the
    smallest batch size present), BP first.

    Raises:
        FileNotFoundError: when there is no ``<variant>-B<batch>/<method>/metrics.jsonl``.
    """
    run_dir = pathlib.Path(run_dir)
    found: dict[int, dict[str, dict]] = {}
    for path in sorted(run_dir.glob(f"*/*/{METRICS}")):
        match = _FOLDER.match(path.parent.parent.name)
        if match:
            by_variant = found.setdefault(int(match["batch"]), {})
            by_variant.setdefault(match["variant"], {})[path.parent.name] = read_rows(path)
    if not found or (batch is not None and batch not in found):
        wanted = f"B{batch}" if batch is not None else "B<batch>"
        raise FileNotFoundError(f"no <variant>-{wanted}/<method>/{METRICS} under {run_dir}")
    runs = found[min(found) if batch is None else batch]
    return {
        v: dict(sorted(runs[v].items(), key=lambda item: item[0] != method_names.BASELINE))
        for v in VARIANTS
        if v in runs
    }


def _session(rows: list[dict]) -> dict:
    return next((r for r in rows if r.get("kind") == "session"), {})


def _epoch_dot() -> Line2D:
    """The legend's entry for the dots of the loss over the training set."""
    dot = Line2D([], [], marker="o", markersize=4, color="#666666", linestyle="")
    dot.set_label("training set, epoch end")
    return dot


def _in_variants(chosen: dict[str, dict[str, list[str]]]) -> list[str]:
    """The methods' full labels, naming the variants where a method's differs between them
    (what ``bppsa.Auto`` chose depends on T)."""
    return [
        label if len(labels) == 1 else f"{label} ({', '.join(variants)})"
        for labels in chosen.values()
        for label, variants in labels.items()
    ]


def draw(runs: dict[str, dict], smooth: int | None = None) -> plt.Figure:
    """One panel per variant of ``runs`` (``{variant: {method: rows}}``)."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 4.4), squeeze=False)
    meta, synthetic, evaluated, handles = {}, False, False, {}
    chosen: dict[str, dict[str, list[str]]] = {}  # {method: {full label: variants}}
    for ax, (variant, by_method) in zip(axes[0], runs.items(), strict=True):
        totals: list[str] = []
        for index, (method, rows) in enumerate(by_method.items()):
            session = _session(rows)
            meta = meta or session
            config = session.get("config", {})
            synthetic = synthetic or bool(config.get("data", {}).get("synthetic"))
            steps = [r for r in rows if r.get("kind") == "step"]
            steps.sort(key=lambda r: r["iteration"])
            if not steps:
                continue
            loss = np.array([r["loss"] for r in steps])
            wall = np.array([r["wall_clock_s"] for r in steps])
            window = smooth or max(1, len(steps) // 10)
            c = _style.color(method, index)
            dash = "-" if index == 0 else (0, (4, 3))
            name = method_names.short(method)
            label = method_names.label(method, config.get("resolved"))
            chosen.setdefault(method, {}).setdefault(label, []).append(variant)
            ax.plot(wall, loss, color=c, alpha=0.2, linewidth=0.6)
            (line,) = ax.plot(
                wall, moving_average(loss, window), color=c, linewidth=2, linestyle=dash, label=name
            )
            handles.setdefault(name, line)
            totals.append(f"{name}: {wall[-1]:.2f} s for {len(steps)} it.")
            evals = [r for r in rows if r.get("kind") == "eval" and "train_loss" in r]
            if evals:
                evaluated = True
                ax.plot(
                    [r["wall_clock_s"] for r in evals],
                    [r["train_loss"] for r in evals],
                    "o",
                    color=c,
                    markersize=4,
                )
        data = config.get("data", {})
        ax.set_title(
            f"{variant}: T = {data.get('frames', '?')}, F = {data.get('features', '?')}, "
            f"B = {config.get('batch', '?')}"
        )
        # The totals under the axis' label, where no curve can run into them.
        ax.set_xlabel("\n".join(["wall-clock time of the training steps (s)", *totals]))
    axes[0][0].set_ylabel("training loss (cross-entropy)")
    config = meta.get("config", {})
    note = " | SYNTHETIC FIXTURE, NOT IRMAS" if synthetic else ""
    fig.suptitle(
        f"Fig. 13: GRU (H = {config.get('hidden', '?')}, Adam lr = {config.get('lr', '?')}) on "
        f"IRMAS MFCCs, training loss vs wall-clock{note}\n{_style.machine(meta)}",
        y=0.995,
        va="top",
    )
    _style.finish(
        fig,
        "Thin: per-iteration mini-batch loss; thick: trailing moving average; dots: loss over the "
        "whole training set at the end of each epoch. Wall-clock: cumulative time of the jitted "
        "training steps (value_and_grad + Adam update), without evaluation and logging; under "
        "each panel: the total per method. Same seed, batch order and initialization for both "
        f"methods. {_style.methods_note(_in_variants(chosen))} {_style.software(meta)}.",
        [_style.Key([*handles.values(), *([_epoch_dot()] if evaluated else [])])],
    )
    return fig


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.fig13", __doc__)
    _cli.add_run(parser, "folder holding <variant>-B<batch>/")
    parser.add_argument("--batch", type=int, help="batch size (default: the smallest present)")
    _cli.add_out(parser)
    _cli.add_smooth(parser)
    args = parser.parse_args(argv)
    runs = _cli.load(parser, "run", load_runs, args.run, args.batch)
    folder = _cli.out_folder(args.out, args.run)
    return _cli.wrote(_style.save(draw(runs, args.smooth), folder, "fig13"))


if __name__ == "__main__":
    main()
