"""The experiments' command lines, written once: argument types (bad values are refused by
argparse, naming the argument, before any work starts), the options the experiments share (the
configuration, the results folder, the backward methods, a training run's options) and what
their ``main`` does with them (the preset, the run folder, the progress bars, a fatal error).

A new option of the training commands (``rnn_synthetic train/sweep``, ``gru_irmas train``)
belongs in :func:`add_training` and :func:`training_config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Sequence
from typing import Any, NoReturn

from experiments.methods import FORWARDS, OVER_TIME, SEQUENTIAL_FORWARD
from paper_figures.result_files import methods as method_names

COMMANDS_EPILOG = "Run '<command> --help' for a command's options."
METHODS_HELP = (
    "backward methods: bp (back-propagation), bppsa (bppsa.Auto(): Blelloch on accelerators), "
    "blelloch, chunked, chunked-C, sequential-jacobians (default: bp bppsa)"
)
FORWARD_HELP = (
    "forward pass of the BPPSA methods: sequential (lax.scan; default) or newton "
    "(bppsa.Newton(): Newton iterations over the whole sequence, each a parallel scan); "
    "bp always runs jax.grad through lax.scan, the reference the losses are compared with"
)

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


def parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the first paragraph of ``doc``."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])


def add_commands(parser: argparse.ArgumentParser, commands: Sequence[str]):
    """The subcommands of ``parser``, named in its usage line (``args.command``: the one given)."""
    parser.epilog = COMMANDS_EPILOG
    metavar = "{" + ",".join(commands) + "}"
    return parser.add_subparsers(dest="command", required=True, metavar=metavar)


def add_configuration(parser: argparse.ArgumentParser, paper: str) -> None:
    """``--quick`` (the default) or ``--paper`` (help: ``paper``); see :func:`configuration`."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small configuration (default)")
    size.add_argument("--paper", action="store_true", help=paper)


def add_results(
    parser: argparse.ArgumentParser, default: pathlib.Path, *, name: bool = True
) -> None:
    """``--out`` (the results root, ``default``), ``--name`` (the run folder under it; see
    :func:`run_folder`), ``--overwrite`` and ``--no-progress``."""
    parser.add_argument("--out", type=pathlib.Path, default=default, help="results root")
    if name:
        add_name(parser)
    parser.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", help="run folder under --out (default: <command>-<config>)")


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
    parser.add_argument("--lr", type=positive_float, help=f"Adam learning rate (default {lr})")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--iterations", type=positive_int, help="iterations per run")
    length.add_argument("--epochs", type=positive_float, help="epochs per run")


def add_checkpoint_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every", type=positive_int, default=100, help="iterations (default 100)"
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
    """``"paper"`` with ``--paper``, else ``"quick"``."""
    return "paper" if args.paper else "quick"


def run_folder(args: argparse.Namespace, config: str) -> pathlib.Path:
    """``<--out>/<--name>``, by default ``<--out>/<command>-<config>``."""
    return args.out / (args.name or f"{args.command}-{config}")


def progress(args: argparse.Namespace) -> bool | None:
    """``False`` with ``--no-progress``, else ``None`` (bars when stderr is a terminal)."""
    return False if args.no_progress else None


def fail(parser: argparse.ArgumentParser, args: argparse.Namespace, error: Exception) -> NoReturn:
    """Exits with status 2 and ``error``, for what is found only once the work has started (a
    results folder of another configuration, bad data)."""
    parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")
