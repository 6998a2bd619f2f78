"""The speed benchmark's command line: its options, its grids, and its result file.

Kept apart from :mod:`benchmarks.speed` (which measures) so that each file is one concept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import bppsa
from experiments import methods
from paper_figures.result_files import PULLBACK
from paper_figures.result_files import methods as method_names

CELL_NAMES = ("rnn", "gru")
SWEEPS = ("t_sweep", "b_sweep", "h_sweep")

FULL_T = [10, 30, 100, 300, 1000, 3000, 10000, 30000]
FULL_B = [1, 2, 4, 8, 16, 32, 64, 128, 256]
QUICK_T = [100, 1000, 10000]
QUICK_B = [1, 16, 128]
# --dry-run: these sizes in place of the requested ones (a sweep that is empty stays empty).
DRY_RUN = dict(lengths=[3, 5], batches=[1, 2], hiddens=[2, 3], h_batches=[1, 2])
DRY_RUN.update(t_batch=2, b_length=5, h_length=5, hidden=2, repeats=1)
MIN_ROUNDS = 2  # timed rounds a row gets even past --row-seconds (fewer only if --repeats is)
MESSAGE_CHARS = 2000  # of an exception's text kept in the JSON (XLA's can hold whole programs)
UNFINISHED = "the process ended (time-out or crash) while this row was being measured"
# The value of "backward" on a result file and its rows: every backward time is the jitted
# pullback of a jax.vjp applied to saved residuals, its own program (experiments.timing),
# never the gradient's time minus a forward's. Readers (paper_figures, fit_profile) check it.
# The names --methods takes (paper_figures.result_files.methods); the baseline, BP, is always
# measured.
METHOD_FORMS = (
    method_names.AUTO,
    method_names.BLELLOCH,
    method_names.CHUNKED,
    method_names.CHUNKED_CHUNKS,
    method_names.CHUNKED_BLOCKED,
    method_names.SEQUENTIAL,
    method_names.SEQUENTIAL_JACOBIANS,
)


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration, a row of the sweep ``sweep``."""

    sweep: str
    cell: str
    length: int
    batch: int
    hidden: int

    @property
    def key(self) -> tuple:
        return (self.cell, self.length, self.batch, self.hidden)


def plan(args: argparse.Namespace) -> list[Config]:
    """The configurations in the order they are measured: the T sweep and the B sweep (every
    cell, at ``--hidden``), then the H sweep by increasing H (cheap and most important first)."""
    t_sweep = [
        ("t_sweep", c, t, args.t_batch, args.hidden) for c in args.cells for t in args.lengths
    ]
    b_sweep = [
        ("b_sweep", c, args.b_length, b, args.hidden) for c in args.cells for b in args.batches
    ]
    hs = [(c, b, h) for h in args.hiddens for c in args.h_cells for b in args.h_batches]
    h_sweep = [("h_sweep", c, args.h_length, b, h) for c, b, h in hs]
    return [Config(*fields) for fields in [*t_sweep, *b_sweep, *h_sweep]]


def parse_method(name: str) -> bppsa.Method:
    """``auto``, ``blelloch``, ``chunked``, ``chunked-C``, ``chunked-C-bK`` (C chunks in time
    blocks of K steps), ``sequential`` or ``sequential-jacobians``.

    Raises:
        ValueError: for another name, listing these.
    """
    return methods.parse_method(name, METHOD_FORMS)


def write_atomically(path: pathlib.Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def previous_run(path: pathlib.Path) -> tuple[dict, int]:
    """The rows of an earlier run written to ``path`` by configuration, and its attempts
    (nothing when there is none or it is unreadable). Rows without ``"backward": "pullback"``
    (an older layout, whose backward was a difference of two programs) are measured again."""
    try:
        payload = json.loads(path.read_text())
        rows = {
            (r["cell"], r["length"], r["batch"], r["hidden"]): r
            for sweep in SWEEPS
            for r in payload.get(sweep, [])
            if r.get("backward") == PULLBACK
        }
        return rows, int(payload.get("attempts", 1))
    except (OSError, ValueError, KeyError, TypeError):
        return {}, 0


def parse_args(argv, description: str = "") -> argparse.Namespace:
    """The options, checked, with the grids filled in (and shrunk by ``--dry-run``)."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--quick", action="store_true", help="small grids (a few minutes)")
    add("--cells", nargs="+", default=["rnn", "gru"], choices=list(CELL_NAMES))
    add("--hidden", type=int, default=20, help="H of the T and B sweeps (20)")
    add(
        "--methods",
        nargs="+",
        default=[method_names.AUTO, method_names.BLELLOCH, method_names.CHUNKED],
    )
    add("--lengths", type=int, nargs="*", help="T sweep (at --t-batch); empty: no T sweep")
    add("--batches", type=int, nargs="*", help="B sweep (at --b-length); empty: no B sweep")
    add("--t-batch", type=int, default=16, help="B of the T sweep (16)")
    add("--b-length", type=int, default=1000, help="T of the B sweep (1000)")
    add("--hiddens", type=int, nargs="*", default=[], help="H sweep (default: none)")
    add("--h-batches", type=int, nargs="+", default=[1, 16, 256], help="B of the H sweep")
    add("--h-length", type=int, default=1000, help="T of the H sweep (1000)")
    add(
        "--h-cells",
        nargs="+",
        default=["rnn"],
        choices=list(CELL_NAMES),
        help="cells of the H sweep",
    )
    add("--repeats", type=int, default=7, help="timed rounds per row at most")
    add("--row-seconds", type=float, help="time budget of a row's timed rounds (2 at least)")
    add("--memory-limit", type=float, help="bytes for bppsa.grad (default: the device's)")
    add("--require-backend", help="stop unless JAX's default backend is this (e.g. gpu)")
    add("--dry-run", action="store_true", help="the same grids with tiny sizes, one round")
    add("--resume", action="store_true", help="keep the rows already in --out")
    add("--out", type=pathlib.Path, default=pathlib.Path("results/speed.json"))
    args = parser.parse_args(argv)
    for name in ("hidden", "repeats", "t_batch", "b_length", "h_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("row_seconds", "memory_limit"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.lengths is None:
        args.lengths = QUICK_T if args.quick else FULL_T
    if args.batches is None:
        args.batches = QUICK_B if args.quick else FULL_B
    if any(n < 1 for n in [*args.lengths, *args.batches, *args.hiddens, *args.h_batches]):
        parser.error("--lengths, --batches, --hiddens and --h-batches take positive ints")
    for name in args.methods:
        try:
            parse_method(name)
        except ValueError as error:
            parser.error(f"--methods: {name!r}: {error}")
    if args.dry_run:
        for name, tiny in DRY_RUN.items():
            empty = isinstance(tiny, list) and not getattr(args, name)
            setattr(args, name, [] if empty else tiny)
    return args
