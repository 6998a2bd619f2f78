"""Character-level language model: the validation bits per character of every method (BP,
BPPSA, ...) against the iterations and against the wall-clock time of the training steps, and
the training loss.

Reads ``<run>/<method>/metrics.jsonl`` of every method trained by ``python -m experiments.char_lm``
(the same initialization, batches and optimizer for all: the curves of an exact method coincide
with BP's against the iterations, and differ against the wall-clock only by the step times).

Run: ``python -m paper_figures.char_lm results/char_lm/quick-diagonal-gru [--out DIR]``; writes
``char_lm.png`` and ``char_lm.pdf`` (default folder: ``<run>/figures``).
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from paper_figures import _cli, _style
from paper_figures.fig7 import load_runs, moving_average
from paper_figures.result_files import methods as method_names

NAME = "char_lm"
NEWTON_SUFFIX = "-newton"  # a BPPSA method with the Newton forward (experiments.char_lm)

__all__ = ["draw", "load_runs", "main"]


def _session(rows: Sequence[dict]) -> dict:
    return next((r for r in rows if r.get("kind") == "session"), {})


def _steps(rows: Sequence[dict]) -> list[dict]:
    return sorted((r for r in rows if r.get("kind") == "step"), key=lambda r: r["iteration"])


def _evaluations(rows: Sequence[dict]) -> list[dict]:
    """The eval rows by iterations done (the last of each, after a resume)."""
    by_done = {r["iterations_done"]: r for r in rows if r.get("kind") == "eval"}
    return [by_done[k] for k in sorted(by_done)]


def _short(method: str) -> str:
    base = method.removesuffix(NEWTON_SUFFIX)
    return method_names.short(base) + (" + Newton" if base != method else "")


def _label(method: str, config: Mapping[str, Any]) -> str:
    """The method in full, for the caption."""
    base = method.removesuffix(NEWTON_SUFFIX)
    text = method_names.label(base, config.get("resolved"))
    if config.get("forward") == "newton":
        text += ", Newton forward (bppsa.Newton)"
    return text if base == method else f"{_short(method)}: {text}"


def loss_difference(runs: Mapping[str, Sequence[dict]]) -> dict[str, float]:
    """Max over common iterations of ``|loss - loss_BP| / |loss_BP|`` per method but BP."""
    if method_names.BASELINE not in runs:
        return {}
    base = {r["iteration"]: r["loss"] for r in _steps(runs[method_names.BASELINE])}
    out = {}
    for method, rows in runs.items():
        if method != method_names.BASELINE:
            diffs = [
                abs(r["loss"] - base[r["iteration"]]) / max(abs(base[r["iteration"]]), 1e-30)
                for r in _steps(rows)
                if r["iteration"] in base
            ]
            out[method] = max(diffs, default=math.nan)
    return out


def _uniform(ax: plt.Axes, vocabulary: int | None) -> Line2D | None:
    """The bits per character of a uniform guess over the vocabulary, as a reference line."""
    if not vocabulary:
        return None
    return ax.axhline(
        math.log2(vocabulary),
        color="#7f7f7f",
        linestyle=":",
        linewidth=1.2,
        label=f"uniform over {vocabulary} characters",
    )


def draw(runs: dict[str, list[dict]], smooth: int | None = None) -> plt.Figure:
    """The figure of ``runs`` (``{method: rows}``, BP first); ``smooth``: the training loss's
    moving-average window (default: a thirtieth of the run)."""
    meta = next((_session(rows) for rows in runs.values() if _session(rows)), {})
    config = meta.get("config", {})
    data = config.get("data", {})
    fig, (ax_iter, ax_time, ax_loss) = plt.subplots(1, 3, figsize=(14, 4.4))
    handles, labels, finals = {}, [], []
    for index, (method, rows) in enumerate(runs.items()):
        session_config = _session(rows).get("config", {})
        evals, steps = _evaluations(rows), _steps(rows)
        c = _style.color(method, index)
        # Dashes on the later curves keep a curve visible where it lies on top of another.
        dash = "-" if index == 0 else (0, (4, 3))
        name = _short(method)
        labels.append(_label(method, session_config))
        if evals:
            bpc = [r["val_bpc"] for r in evals]
            for ax, x in (
                (ax_iter, [r["iterations_done"] for r in evals]),
                (ax_time, [r["wall_clock_s"] for r in evals]),
            ):
                (line,) = ax.plot(
                    x, bpc, color=c, linestyle=dash, marker="o", markersize=3, label=name
                )
            handles.setdefault(name, line)
            finals.append(f"{name} {bpc[-1]:.3f} after {evals[-1]['iterations_done']} iterations")
        if steps:
            loss = np.array([r["loss"] for r in steps]) / math.log(2.0)
            iteration = np.array([r["iteration"] for r in steps])
            window = smooth or max(1, len(steps) // 30)
            ax_loss.plot(iteration, loss, color=c, alpha=0.18, linewidth=0.6)
            (line,) = ax_loss.plot(
                iteration, moving_average(loss, window), color=c, linewidth=2, linestyle=dash
            )
            line.set_label(name)
            handles.setdefault(name, line)
    reference = None
    for ax in (ax_iter, ax_time, ax_loss):
        reference = _uniform(ax, data.get("vocabulary")) or reference
    ax_iter.set_xlabel("iteration")
    ax_time.set_xlabel("wall-clock time of the training steps (s)")
    ax_loss.set_xlabel("iteration")
    ax_iter.set_ylabel("validation bits per character")
    ax_loss.set_ylabel("training loss (bits per character)")
    ax_iter.set_title("validation vs iterations")
    ax_time.set_title("validation vs wall-clock")
    ax_loss.set_title("training loss (mini-batch)")
    synthetic = " | SYNTHETIC FIXTURE, NOT SHAKESPEARE" if data.get("synthetic") else ""
    fig.suptitle(
        f"Character-level language model on {data.get('source', '?')}: "
        f"{config.get('cell', '?')} cells, H = {config.get('width', '?')}, "
        f"L = {config.get('layers', '?')}, T = {config.get('length', '?')}, "
        f"B = {config.get('batch', '?')}{synthetic}\n{_style.machine(meta)}",
        y=0.995,
        va="top",
    )
    _style.finish(fig, _caption(config, runs, finals, labels, meta), [_key(handles, reference)])
    return fig


def _key(handles: dict[str, Line2D], reference: Line2D | None) -> _style.Key:
    return _style.Key([*handles.values(), *([reference] if reference is not None else [])])


def _caption(config, runs, finals, labels, meta) -> str:
    characters = config.get("data", {}).get("characters", {})
    windows = config.get("eval_batches", 0) * config.get("batch", 0)
    diffs = loss_difference(runs)
    agreement = (
        "Largest relative difference of the per-iteration training losses from BP's: "
        + ", ".join(f"{_short(m)} {d:.1e}" for m, d in diffs.items())
        + ". "
        if diffs
        else ""
    )
    lr = config.get("lr", math.nan)
    return (
        f"Validation: bits per character on the same {windows} validation windows of "
        f"{config.get('length', '?')} characters at every evaluation; final: "
        f"{'; '.join(finals) or 'none'}. Training loss: the per-iteration mini-batch "
        "cross-entropy in bits (thin) and its trailing moving average (thick). Wall-clock: the "
        "cumulative time of the jitted training steps (value_and_grad + optimizer update), "
        "without evaluation. Same initialization, batches and optimizer for every method: "
        f"AdamW, peak learning rate {lr:g} after {config.get('warmup', '?')} warm-up "
        f"iterations, cosine decay to {config.get('final_lr', math.nan) * lr:g} at iteration "
        f"{config.get('schedule_iterations', '?')}, weight decay "
        f"{config.get('weight_decay', '?')}, gradients clipped to norm {config.get('clip', '?')}; "
        f"{_count(characters.get('train'))} training characters. {agreement}"
        f"{_style.methods_note(labels)} {_style.software(meta)}."
    )


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.char_lm", __doc__)
    _cli.add_run(parser, "folder holding <method>/metrics.jsonl")
    _cli.add_out(parser)
    _cli.add_smooth(parser)
    args = parser.parse_args(argv)
    runs = _cli.load(parser, "run", load_runs, args.run)
    folder = _cli.out_folder(args.out, args.run)
    return _cli.wrote(_style.save(draw(runs, args.smooth), folder, NAME))


if __name__ == "__main__":
    main()
