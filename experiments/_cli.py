"""The experiments' command lines, written once: argument types (bad values are refused by
argparse, naming the argument, before any work starts), the options the experiments share (the
preset, the results folder, the backward methods, a training run's options), every default
shown in ``--help``, and what their ``main`` does with them (the preset, the run folder, the
progress bars, a fatal error).

Presets, the same flags in every script: ``--smoke`` (tiny sizes: seconds to minutes),
``--quick`` (minutes on a CPU; the default), ``--paper`` (the paper's sizes) and ``--gpu`` (for
one accelerator), each script offering those it has (:func:`add_presets`). A run folder is named
after its configuration (:func:`run_name`).

A new option of the training commands (``rnn_synthetic train/sweep``, ``gru_irmas train``)
belongs in :func:`add_training` and :func:`training_config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from experiments._help import HelpFormatter
from experiments.methods import FORWARDS, OVER_TIME, SEQUENTIAL_FORWARD
from paper_figures.result_files import methods as method_names

COMMANDS_EPILOG = "Run '<command> --help' for a command's options."
# What bppsa.Auto() runs today (bppsa/scan/_core/methods/auto.py, docs/guide.md).
AUTO_HELP = (
    "bppsa.Auto(): on accelerators the fastest of BP, Blelloch and Chunked by the cost model "
    "(and FusedSequential on a profile with a fused rate), on CPUs its measured rules "
    "(a blocked sequential scan, or BP for large batches); over the memory limit a "
    "lower-memory method that fits"
)
METHODS_HELP = (
    f"backward methods: bp (back-propagation), bppsa ({AUTO_HELP}), blelloch, chunked, "
    "chunked-C, sequential-jacobians (default: bp bppsa)"
)
FORWARD_HELP = (
    "forward pass of the BPPSA methods: sequential (the default: the library's own choice, "
    "lax.scan on a CPU, the fused kernel where it runs on a GPU), newton (bppsa.Newton(): "
    "Newton iterations over the whole sequence, each a parallel scan) or fused "
    "(bppsa.Fused(): the loop in one kernel; interpreted, slowly, on a CPU); bp always runs "
    "jax.grad through lax.scan, the reference the losses are compared with"
)

# The presets' flags, in the order --help lists them.
PRESETS = ("smoke", "quick", "paper", "gpu")
DEFAULT_PRESET = "quick"

# ----------------------------------------------------------------------------- argument types


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1)."""
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def fraction_or_zero(text: str) -> float:
    """A number in [0, 1)."""
    value = positive_float(text) if text.strip() not in ("0", "0.0") else 0.0
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def method_name(forms: Sequence[str] = OVER_TIME):
    """The argument type of a backward method's name of one of ``forms``
    (:mod:`paper_figures.result_files.methods`)."""

    def method_name(text: str) -> str:
        try:
            method_names.parse(text, forms)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text

    return method_name


# ----------------------------------------------------------------------------- parsers


class Parser(argparse.ArgumentParser):
    """An argument parser whose help shows the defaults (:class:`HelpFormatter`); its
    subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the first paragraph of ``doc``."""
    return Parser(prog=f"python -m {module}", description=doc.split("\n\n")[0])


def add_commands(parser: argparse.ArgumentParser, commands: Sequence[str]):
    """The subcommands of ``parser``, named in its usage line (``args.command``: the one given)."""
    parser.epilog = COMMANDS_EPILOG
    metavar = "{" + ",".join(commands) + "}"
    return parser.add_subparsers(dest="command", required=True, metavar=metavar)


def add_presets(
    parser: argparse.ArgumentParser, helps: Mapping[str, str], default: str = DEFAULT_PRESET
) -> None:
    """One flag per preset of ``helps`` (``{name of PRESETS: its help}``), at most one given;
    ``args.preset`` is its name, ``default`` when none is (see :func:`configuration`)."""
    unknown = sorted(set(helps) - set(PRESETS))
    if unknown or default not in helps:
        raise ValueError(f"presets {unknown or [default]}: expected names of {PRESETS}")
    group = parser.add_mutually_exclusive_group()
    for name in PRESETS:
        if name in helps:
            text = helps[name] + (" (the default)" if name == default else "")
            group.add_argument(
                f"--{name}", dest="preset", action="store_const", const=name, help=text
            )
    parser.set_defaults(preset=default)


def add_results(
    parser: argparse.ArgumentParser, default: pathlib.Path, *, name: bool = True
) -> None:
    """``--out`` (the results root, ``default``), ``--name`` (the run folder under it; see
    :func:`run_folder`), ``--overwrite`` and ``--no-progress``."""
    parser.add_argument("--out", type=pathlib.Path, default=default, help="results root")
    if name:
        add_name(parser)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start the run folder afresh instead of resuming it (needed when it holds another "
        "configuration's results)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name",
        help="run folder under --out (default: named after the command, the preset and each "
        "size that differs from the preset's, e.g. train-quick-T300-B4)",
    )


def add_methods(
    parser: argparse.ArgumentParser,
    default: Sequence[str],
    *,
    forms: Sequence[str] = OVER_TIME,
    help: str = METHODS_HELP,
) -> None:
    """``--methods``/``--method NAME ...`` (``args.methods``), names of ``forms``."""
    parser.add_argument(
        "--methods",
        "--method",
        dest="methods",
        nargs="+",
        type=method_name(forms),
        default=list(default),
        metavar="NAME",
        help=help,
    )


def add_training(parser: argparse.ArgumentParser, *, lr: str) -> None:
    """The options of training runs (read by :func:`training_config`): ``--methods`` (default
    ``bp bppsa``), ``--forward`` (the forward pass of the BPPSA methods; ``bp`` keeps
    ``lax.scan``), ``--lr`` (Adam's learning rate, ``lr`` the default as text), and the run
    length, ``--iterations`` or ``--epochs``."""
    add_methods(parser, [method_names.BP, method_names.BPPSA])
    parser.add_argument(
        "--forward",
        choices=FORWARDS,
        default=SEQUENTIAL_FORWARD,
        help=FORWARD_HELP,
    )
    parser.add_argument("--lr", type=positive_float, help=f"Adam learning rate (default: {lr})")
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--iterations", type=positive_int, help="iterations per run (default: the preset's)"
    )
    length.add_argument(
        "--epochs", type=positive_float, help="epochs per run (default: the preset's)"
    )


def add_checkpoint_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every", type=positive_int, default=100, help="iterations between checkpoints"
    )


# ----------------------------------------------------------------------------- main


def training_config(base: Any, args: argparse.Namespace, **overrides: Any) -> Any:
    """``base`` (a frozen dataclass with ``lr``, ``forward``, ``iterations`` and ``epochs``) with
    the options of :func:`add_training` and ``overrides`` that were given (not ``None``)
    applied; the run length given replaces the other."""
    options = dict(lr=args.lr, forward=args.forward) | overrides
    given = {k: v for k, v in options.items() if v is not None}
    config = dataclasses.replace(base, **given)
    if args.iterations is not None:
        config = dataclasses.replace(config, iterations=args.iterations, epochs=None)
    elif args.epochs is not None:
        config = dataclasses.replace(config, iterations=None, epochs=args.epochs)
    return config


def methods(args: argparse.Namespace) -> list[str]:
    """The ``--methods`` given, each once, in order."""
    return list(dict.fromkeys(args.methods))


def configuration(args: argparse.Namespace) -> str:
    """The name of the preset given (:func:`add_presets`)."""
    return args.preset


def run_name(base: str, sizes: Mapping[str, tuple[Any, Any]] | None = None) -> str:
    """The name of a run folder: ``base`` (``<command>-<preset>``), then ``-<label><value>``
    for each size whose value differs from the preset's, in the order of ``sizes``
    (``{label: (value, the preset's value)}``); e.g. ``train-quick-T300-B4``. The same
    configuration gets the same folder (and resumes there); the sizes of a sweep's points
    are not part of it (its points join the same log).
    """
    parts = [base]
    for label, (value, preset) in (sizes or {}).items():
        if value is not None and value != preset:
            parts.append(f"{label}{value:g}" if isinstance(value, float) else f"{label}{value}")
    return "-".join(parts)


def run_folder(args: argparse.Namespace, name: str) -> pathlib.Path:
    """``<--out>/<--name>``, by default ``<--out>/<name>`` (:func:`run_name`)."""
    return args.out / (args.name or name)


def progress(args: argparse.Namespace) -> bool | None:
    """``False`` with ``--no-progress``, else ``None`` (bars when stderr is a terminal)."""
    return False if args.no_progress else None


def fail(parser: argparse.ArgumentParser, args: argparse.Namespace, error: Exception) -> NoReturn:
    """Exits with status 2 and ``error``, for what is found only once the work has started (a
    results folder of another configuration, bad data)."""
    parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")
