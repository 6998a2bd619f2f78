"""The figure scripts' command lines, written once: ``python -m paper_figures.<figure> RUN
[--out DIR]``, results that cannot be read refused naming the argument, the figures written
into ``--out`` (default ``<RUN>/figures``) and their paths printed."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Callable, Sequence
from typing import Any


def parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the first paragraph of ``doc``."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])


def add_run(parser: argparse.ArgumentParser, help: str, *, name: str = "run") -> None:
    """The positional results folder (or file) ``name``."""
    parser.add_argument(name, type=pathlib.Path, help=help)


def add_out(parser: argparse.ArgumentParser, *, name: str = "run") -> None:
    """``--out``, the output folder (see :func:`out_folder`)."""
    parser.add_argument(
        "--out", type=pathlib.Path, help=f"output folder (default <{name}>/figures)"
    )


def add_smooth(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smooth", type=_window, help="moving-average window (iterations)")


def _window(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def load(parser: argparse.ArgumentParser, name: str, loader: Callable[..., Any], *args: Any):
    """``loader(*args)``; a missing or unusable results file exits naming the argument."""
    try:
        return loader(*args)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"argument {name}: {error}")


def out_folder(out: pathlib.Path | None, run: pathlib.Path) -> pathlib.Path:
    """``out``, by default ``figures/`` beside the results (in ``run``, a folder, or in the
    folder of ``run``, a file)."""
    return out or (run if run.is_dir() else run.parent) / "figures"


def wrote(paths: Sequence[pathlib.Path]) -> list[pathlib.Path]:
    """Prints and returns ``paths``."""
    print("wrote " + ", ".join(str(p) for p in paths))
    return list(paths)
