"""Fig. 7: training loss of the RNN on synthetic bitstreams against wall-clock time, BP vs BPPSA.

Reads ``<run>/<method>/metrics.jsonl`` of every method trained by
``python -m experiments.rnn_synthetic train`` (the paper: T = 1000, B = 16) and draws the
per-iteration training loss against the cumulative time of the training steps (left), and
against the iteration (right, where the curves of an exact method coincide).

Run: ``python -m paper_figures.fig7 results/rnn_synthetic/train-quick [--out DIR]``; writes
``fig7.png`` and ``fig7.pdf`` (default folder: ``<run>/figures``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from paper_figures import _cli, _style
from paper_figures.result_files import methods as method_names
from paper_figures.result_files import read_rows

METRICS = "metrics.jsonl"


def load_runs(run_dir: str | pathlib.Path) -> dict[str, list[dict]]:
    """``{method: rows}`` of the method folders under ``run_dir`` (BP first).

    Raises:
        FileNotFoundError: when ``run_dir`` has no ``<method>/metrics.jsonl``.
    """
    run_dir = pathlib.Path(run_dir)
    paths = sorted(run_dir.glob(f"*/{METRICS}"))
    if not paths:
        raise FileNotFoundError(f"no <method>/{METRICS} under {run_dir}")
    runs = {path.parent.name: read_rows(path) for path in paths}
    return dict(sorted(runs.items(), key=lambda item: item[0] != method_names.BASELINE))


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` values (shorter at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    return (sums[ends] - sums[ends - counts]) / counts


def draw(runs: dict[str, list[dict]], smooth: int | None = None) -> plt.Figure:
    """The figure of ``runs`` (``{method: rows}``); ``smooth``: moving-average window."""
    meta = next(r for rows in runs.values() for r in rows if r.get("kind") == "session")
    config = meta["config"]
    fig, (ax_time, ax_iter) = plt.subplots(1, 2, figsize=(11, 4.0))
    handles, names = [], []
    for index, (method, rows) in enumerate(runs.items()):
        steps = sorted((r for r in rows if r.get("kind") == "step"), key=lambda r: r["iteration"])
        if not steps:
            continue
        resolved = next(
            (r["config"].get("resolved") for r in rows if r.get("kind") == "session"), None
        )
        loss = np.array([r["loss"] for r in steps])
        wall = np.array([r["wall_clock_s"] for r in steps])
        iteration = np.array([r["iteration"] for r in steps])
        window = smooth or max(1, len(steps) // 30)
        c = _style.color(method, index)
        names.append(method_names.label(method, resolved))
        label = f"{method_names.short(method)}: {wall[-1]:.1f} s for {len(steps)} it."
        # Dashes on the later curves keep a curve visible where it lies on top of another.
        dash = "-" if index == 0 else (0, (4, 3))
        for ax, x in ((ax_time, wall), (ax_iter, iteration)):
            ax.plot(x, loss, color=c, alpha=0.18, linewidth=0.6)
            (line,) = ax.plot(
                x, moving_average(loss, window), color=c, linewidth=2, linestyle=dash, label=label
            )
        handles.append(line)
    ax_time.set_xlabel("wall-clock time of the training steps (s)")
    ax_iter.set_xlabel("iteration")
    for ax in (ax_time, ax_iter):
        ax.set_ylabel("training loss (cross-entropy, mini-batch)")
    ax_time.set_title("(a) loss vs wall-clock time")
    ax_iter.set_title("(b) loss vs iteration (the curves coincide)")
    fig.suptitle(
        f"Fig. 7: RNN on synthetic bitstreams, T = {config['length']}, B = {config['batch']}, "
        f"H = {config['hidden']}, {_optimizer(config)}\n{_style.machine(meta)}"
    )
    _style.finish(
        fig,
        "Thin: per-iteration mini-batch loss; thick: its trailing moving average. Wall-clock "
        "time: cumulative time of the jitted training steps (value_and_grad + Adam update), "
        "without data generation, evaluation and logging. Same seed, data order and "
        f"initialization for every method.{_recipe(config)} {_style.methods_note(names)} "
        f"{_style.software(meta)}.",
        [_style.Key(handles)],
    )
    return fig


def _optimizer(config: dict) -> str:
    """The title's optimizer: the paper's single learning rate, or the demo's recipe (whose
    learning rates differ per parameter group) named and spelled out in the caption."""
    return "demo recipe (caption)" if config.get("recipe") else f"Adam lr = {config['lr']:g}"


def _recipe(config: dict) -> str:
    recipe = config.get("recipe")
    if not recipe:
        return ""
    parts = [f"{key}: {value}" for key, value in recipe.items()]
    return " Recipe: " + "; ".join(parts) + "."


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.fig7", __doc__)
    _cli.add_run(parser, "folder holding <method>/metrics.jsonl")
    _cli.add_out(parser)
    _cli.add_smooth(parser)
    args = parser.parse_args(argv)
    runs = _cli.load(parser, "run", load_runs, args.run)
    folder = _cli.out_folder(args.out, args.run)
    return _cli.wrote(_style.save(draw(runs, args.smooth), folder, "fig7"))


if __name__ == "__main__":
    main()
