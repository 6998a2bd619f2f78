"""``python -m paper_figures``: the figures it can draw, and each drawn from its result files.

With no argument or ``--list``, lists every figure: its name, what it shows, the results it
reads by default and the command that writes them. With names (or ``all``), draws each by its
own script (``python -m paper_figures.<name>``, from the default results, or from ``NAME=RUN``);
``all`` draws those whose results are there and names the others. ``--out`` puts every figure in
one folder (default: each script's own, beside its results or ``paper_figures/output``).

Examples:
    python -m paper_figures
    python -m paper_figures fig7 fig8
    python -m paper_figures fig7=results/rnn_synthetic/train-quick-T300 --out figures
    python -m paper_figures all
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib
import pathlib
from collections.abc import Sequence

ALL = "all"


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure script, ``paper_figures.<name>``: what it shows, the results it reads unless
    given others (paths, or glob patterns), and what writes them."""

    name: str
    summary: str
    results: tuple[str, ...]
    written_by: str

    def default_results(self) -> list[pathlib.Path]:
        """The default results that are there (a pattern's matches, sorted)."""
        found = []
        for pattern in self.results:
            found += [pathlib.Path(p) for p in sorted(glob.glob(pattern))]
        return found


FIGURES = (
    Figure(
        "fig7",
        "RNN on bitstreams: training loss against wall-clock, BP vs BPPSA",
        ("results/rnn_synthetic/train-quick",),
        "python -m experiments.rnn_synthetic train",
    ),
    Figure(
        "fig8",
        "RNN on bitstreams: BPPSA's speedup over T and over 1/B",
        ("results/rnn_synthetic/sweep-quick",),
        "python -m experiments.rnn_synthetic sweep",
    ),
    Figure(
        "fig9",
        "GRU on IRMAS: runtime breakdown of an iteration, BP vs BPPSA",
        ("results/gru_irmas/breakdown-quick",),
        "python -m experiments.gru_irmas breakdown --data <IRMAS>",
    ),
    Figure(
        "fig10",
        "pruned VGG-11: FLOPs of the scan's sparse products against dense",
        ("results/pruned_vgg11/analyze-quick",),
        "python -m experiments.pruned_vgg11 analyze",
    ),
    Figure(
        "fig13",
        "GRU on IRMAS: training loss against wall-clock per variant, BP vs BPPSA",
        ("results/gru_irmas/train-quick",),
        "python -m experiments.gru_irmas train --data <IRMAS>",
    ),
    Figure(
        "table1",
        "pruned VGG-11: analytic vs autodiff Jacobian generation times",
        ("results/pruned_vgg11/jacobians-quick",),
        "python -m experiments.pruned_vgg11 jacobians",
    ),
    Figure(
        "char_lm",
        "character-level language model: validation bits per character, every method",
        ("results/char_lm/quick-diagonal-gru",),
        "python -m experiments.char_lm",
    ),
    Figure(
        "gpu",
        "Fig. 8 on a GPU: BPPSA's speedup over T, backward and whole gradient",
        ("benchmarks/results/gpu-h200",),
        "benchmarks/gpu.sh",
    ),
    Figure(
        "accuracy",
        "float32 gradient error of BP and BPPSA against float64, over T",
        ("benchmarks/results/accuracy_cpu.json",),
        "python -m benchmarks.accuracy",
    ),
    Figure(
        "width",
        "backward time per step against the hidden size, structured cells",
        ("benchmarks/results/width/cpu_h_seq_run*.json",),
        "python -m benchmarks.width",
    ),
)
BY_NAME = {figure.name: figure for figure in FIGURES}


def listing() -> str:
    """One line per figure (name and summary), then the results it reads and their writer."""
    width = max(len(name) for name in BY_NAME)
    lines = ["Figures (python -m paper_figures NAME ... | all):"]
    for figure in FIGURES:
        lines.append(f"  {figure.name:<{width}}  {figure.summary}")
        reads = ", ".join(figure.results)
        lines.append(f"  {'':<{width}}  reads {reads} (from {figure.written_by})")
    return "\n".join(lines)


def _request(text: str) -> tuple[str, pathlib.Path | None]:
    """A figure name, ``all``, or ``NAME=RUN``: the name and the results given (or ``None``)."""
    name, _, run = text.partition("=")
    if name != ALL and name not in BY_NAME:
        raise argparse.ArgumentTypeError(
            f"unknown figure {name!r}; expected one of {', '.join(BY_NAME)} or {ALL}"
        )
    if name == ALL and run:
        raise argparse.ArgumentTypeError(f"{ALL} takes no results ({text!r})")
    return name, pathlib.Path(run) if run else None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paper_figures", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "figures",
        nargs="*",
        type=_request,
        metavar="FIGURE",
        help=f"a figure's name (drawn from its default results), NAME=RUN, or {ALL}; "
        "none: list the figures",
    )
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        help="one folder for every figure (default: each figure's own, beside its results)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Lists the figures, or draws those named; returns the exit status."""
    cli = parser()
    args = cli.parse_args(argv)
    if args.list or not args.figures:
        print(listing())
        return 0
    names = [name for name, _ in args.figures]
    requests = {figure.name: None for figure in FIGURES} if ALL in names else {}
    requests |= {name: run for name, run in args.figures if name != ALL}
    drawn, missing = [], []
    for name, run in requests.items():
        figure = BY_NAME[name]
        results = [run] if run is not None else figure.default_results()
        if not results or not all(path.exists() for path in results):
            where = run or ", ".join(figure.results)
            missing.append(f"{name}: no results at {where} (written by: {figure.written_by})")
            continue
        module = importlib.import_module(f"paper_figures.{name}")
        out = [] if args.out is None else ["--out", str(args.out)]
        drawn += module.main([*map(str, results), *out])
    for line in missing:
        print(f"skipped {line}")
    if missing and (ALL not in names or not drawn):
        cli.exit(2, f"{cli.prog}: error: {len(missing)} figure(s) without results\n")
    return 0
