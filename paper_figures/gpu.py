"""The paper's Fig. 8 on a GPU: BPPSA's speedup over back-propagation (BP) against the sequence
length T, (a) of the backward pass alone and (b) of the whole gradient (forward and backward in
one program), for the RNN and the GRU at H = 20, B = 16, per method (Auto, Blelloch, Chunked),
log-log.

Reads the result files of a GPU run (a folder such as ``benchmarks/results/gpu-h200``, or files):

* the speed grid ``speed_gpu.json`` (``benchmarks/gpu.sh`` through ``python -m
  benchmarks.speed``): its T sweep's whole-gradient times give (b). Its backward times give (a)
  only where the file says the backward was timed as its own program, ``"backward":
  "pullback"`` on the file or on the row (the jitted pullback of a ``jax.vjp`` applied to saved
  residuals). Without that key the file derived the backward as the gradient's time minus the
  standalone forward's: a difference of two different programs, not a measurement of the
  backward. Such a backward is refused, with a message that names the file
  (:func:`speed_backward`), and the caption says it was left out.
* the direct timings ``gpu_backward.jsonl`` (the ``direct_backward.py`` kept beside the H200
  results): BP's and Blelloch's pullbacks, each timed alone, give (a); their ``value_and_grad``
  gives (b).

Run: ``python -m paper_figures.gpu [RESULTS ...] [--out DIR]`` (default results:
``benchmarks/results/gpu-h200``; default folder: ``paper_figures/output``); writes ``gpu.png``
and ``gpu.pdf``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from paper_figures import _cli, _style
from paper_figures.result_files import PULLBACK, read_json, read_rows
from paper_figures.result_files import methods as method_names

NAME = "gpu"
DEFAULT_RESULTS = pathlib.Path("benchmarks/results/gpu-h200")
DEFAULT_OUT = pathlib.Path("paper_figures/output")
DPI = 100  # a small file for the repository
SPEED_FILE = "speed_gpu.json"
DIRECT_FILE = "gpu_backward.jsonl"
DIRECT_METHOD = method_names.BLELLOCH  # direct_backward.py times bppsa.scan(method=Blelloch())
HIDDEN, BATCH = 20, 16  # the paper's Fig. 8 (T sweep)
CELLS = {"rnn": "o", "gru": "s"}
STYLES = ("-", ":", "--", "-.")

__all__ = ["Point", "Source", "draw", "load", "main", "speed_backward", "speed_totals"]


@dataclasses.dataclass(frozen=True)
class Point:
    """BP's time over a method's at one configuration."""

    cell: str
    hidden: int
    batch: int
    length: int
    method: str
    speedup: float
    ran: str | None = None  # what the method ran, where the file says (Auto's choice)


@dataclasses.dataclass
class Source:
    """What one result file gives the figure: the whole gradient's speedups (``totals``), the
    backward's (``backward``) or, where it has none that is a measurement, why (``refused``)."""

    path: pathlib.Path
    kind: str  # "speed" (benchmarks.speed's layout) or "direct" (gpu_backward.jsonl)
    meta: dict[str, Any]
    totals: list[Point]
    backward: list[Point]
    refused: str | None = None


def _ratio(bp: Any, method: Any) -> float | None:
    if bp is None or method is None or bp <= 0 or method <= 0:
        return None
    return bp / method


def _bp(row: dict, key: str) -> float | None:
    """BP's ``key`` in a speed row: under its ``"bp"`` method entry or as ``bp_<key>``."""
    entry = row.get("methods", {}).get(method_names.BP)
    if isinstance(entry, dict) and entry.get(key) is not None:
        return entry[key]
    return row.get(f"bp_{key}")


def _speed_points(payload: dict, key: str) -> list[Point]:
    points = []
    for row in payload.get("t_sweep", []):
        if row.get("status", "ok") != "ok":
            continue
        for method, entry in row.get("methods", {}).items():
            if method == method_names.BP or entry.get("status", "ok") != "ok":
                continue
            speedup = _ratio(_bp(row, key), entry.get(key))
            if speedup is not None:
                where = (row["cell"], row["hidden"], row["batch"], row["length"])
                points.append(Point(*where, method, speedup, entry.get("runs")))
    return points


def speed_totals(payload: dict) -> list[Point]:
    """The whole gradient's speedups of a speed file's T sweep (medians: ``total_ms``)."""
    return _speed_points(payload, "total_ms")


def speed_backward(payload: dict, path: str | pathlib.Path) -> list[Point]:
    """The backward's speedups of a speed file's T sweep (medians: ``backward_ms``), where each
    backward was timed as its own program.

    Raises:
        ValueError: naming ``path``, when a row of its T sweep does not say ``"backward":
            "pullback"`` (on the row or the file): its backward is the gradient's time minus
            the standalone forward's, two different programs.
    """
    rows = [r for r in payload.get("t_sweep", []) if r.get("status", "ok") == "ok"]
    other = [r for r in rows if r.get("backward", payload.get("backward")) != PULLBACK]
    if other:
        raise ValueError(
            f"{path}: {len(other)} of its {len(rows)} T-sweep rows do not say "
            f'"backward": "{PULLBACK}": their backward is the gradient\'s time minus the '
            "standalone forward's, a difference of two different programs, not a measurement; "
            "not drawn"
        )
    return _speed_points(payload, "backward_ms")


def _direct(rows: list[dict], key: str) -> list[Point]:
    points = []
    for row in rows:
        speedup = _ratio(row.get(f"bp_{key}"), row.get(f"bppsa_{key}"))
        if speedup is not None:
            where = (row["cell"], row["H"], row["B"], row["T"])
            points.append(Point(*where, row.get("method", DIRECT_METHOD), speedup))
    return points


def _load_file(path: pathlib.Path) -> Source:
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    if path.suffix == ".jsonl":
        rows = [r for r in read_rows(path) if "bp_bwd_min_ms" in r]
        if not rows:
            raise ValueError(f"{path} holds no row of direct backward timings (bp_bwd_min_ms)")
        meta = {"device": rows[0].get("device"), "jax": rows[0].get("jax")}
        return Source(path, "direct", meta, _direct(rows, "vg_min_ms"), _direct(rows, "bwd_min_ms"))
    payload = read_json(path)
    if not isinstance(payload, dict) or "t_sweep" not in payload:
        raise ValueError(f"{path} is not a result file of benchmarks.speed (no 't_sweep')")
    meta = {k: v for k, v in payload.items() if not k.endswith("_sweep")}
    source = Source(path, "speed", meta, speed_totals(payload), [])
    try:
        source.backward = speed_backward(payload, path)
    except ValueError as refusal:
        source.refused = str(refusal)
    return source


def load(paths: str | pathlib.Path | Iterable[str | pathlib.Path]) -> list[Source]:
    """The sources of result files or folders (a folder: its ``speed_gpu.json`` and
    ``gpu_backward.jsonl``, those present).

    Raises:
        FileNotFoundError: naming a missing file, or a folder with neither file.
        ValueError: naming a file of neither layout.
    """
    if isinstance(paths, str | pathlib.Path):
        paths = [paths]
    sources = []
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            files = [path / f for f in (SPEED_FILE, DIRECT_FILE) if (path / f).is_file()]
            if not files:
                raise FileNotFoundError(f"neither {SPEED_FILE} nor {DIRECT_FILE} in {path}")
            sources += [_load_file(f) for f in files]
        else:
            sources.append(_load_file(path))
    if not sources:
        raise ValueError("no result files given")
    return sources


def _count(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _describe(source: Source) -> str:
    if source.kind == "direct":
        return f"{source.path.name}: direct timings, minima"
    return f"{source.path.name}: benchmarks.speed's T sweep, medians"


def _panel(ax, sources, series_of, hidden, batch, methods) -> None:
    """One panel's series: a line per source, cell and method (colour: method; marker: cell;
    line style: source; hollow markers: direct timings)."""
    for index, source in enumerate(sources):
        groups: dict[tuple[str, str], list[Point]] = {}
        for p in series_of(source):
            if (p.hidden, p.batch) == (hidden, batch) and p.cell in CELLS:
                groups.setdefault((p.cell, p.method), []).append(p)
        for (cell, method), points in sorted(groups.items()):
            points.sort(key=lambda p: p.length)
            color = _style.color(method_names.canonical(method), methods.index(method))
            ax.plot(
                [p.length for p in points],
                [p.speedup for p in points],
                STYLES[index % len(STYLES)],
                marker=CELLS[cell],
                color=color,
                markerfacecolor="white" if source.kind == "direct" else color,
            )


def _axes(ax, lengths: list[int], title: str, ylabel: str, empty: str) -> None:
    """Titles, the BP baseline and log axes labelled with plain numbers; a panel without data
    says so instead."""
    ax.set_title(title)
    if not ax.lines:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
        return
    ax.set_xlabel("sequence length T (log scale)")
    _style.baseline_line(ax)
    ax.set_xscale("log")
    ax.set_xticks(lengths, [_count(t) for t in lengths])
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    _style.plain_log_axis(ax)
    low, high = ax.get_ylim()
    if high / low < 20:  # less than about a decade: label more of the minor ticks
        ax.yaxis.set_minor_locator(ticker.LogLocator(subs=(1.5, 2.0, 3.0, 4.0, 6.0)))
    ax.set_ylabel(ylabel)


def _auto_runs(sources: Sequence[Source], hidden: int, batch: int) -> str:
    """What Auto ran, per cell, as the speed files record it."""
    ran: dict[str, dict[str, list[int]]] = {}
    for p in (p for s in sources for p in s.totals):
        if (p.hidden, p.batch) == (hidden, batch) and p.method == method_names.AUTO and p.ran:
            ran.setdefault(p.cell, {}).setdefault(p.ran, []).append(p.length)
    parts = []
    for cell, choices in ran.items():
        said = ", ".join(
            f"{runs} at T = {', '.join(_count(t) for t in sorted(set(ts)))}"
            for runs, ts in choices.items()
        )
        parts.append(f"{cell.upper()}: {said}")
    return f"Auto() ran {'; '.join(parts)}. " if parts else ""


def draw(sources: Sequence[Source], *, hidden: int = HIDDEN, batch: int = BATCH) -> plt.Figure:
    """The figure of ``sources`` (:func:`load`) at hidden size ``hidden`` and batch ``batch``."""
    points = [p for s in sources for p in (*s.totals, *s.backward)]
    methods = sorted({p.method for p in points}, key=lambda m: (m != method_names.AUTO, m))
    lengths = sorted({p.length for p in points if (p.hidden, p.batch) == (hidden, batch)})
    fig, (ax_backward, ax_total) = plt.subplots(1, 2, figsize=(11, 4.4))
    _panel(ax_backward, sources, lambda s: s.backward, hidden, batch, methods)
    _panel(ax_total, sources, lambda s: s.totals, hidden, batch, methods)
    _axes(
        ax_backward,
        lengths,
        "(a) backward speedup",
        "backward speedup over BP (×, log scale)",
        "no backward timed as its own program\nin these files",
    )
    _axes(
        ax_total,
        lengths,
        "(b) whole-gradient speedup",
        "whole-gradient speedup over BP (×, log scale)",
        "no whole-gradient times in these files",
    )
    keys = [
        _style.Key(
            [
                Patch(
                    color=_style.color(method_names.canonical(m), i), label=method_names.in_table(m)
                )
                for i, m in enumerate(methods)
            ],
            "methods",
        ),
        _style.Key(
            [
                Line2D([], [], color="#666666", marker=marker, linestyle="", label=cell.upper())
                for cell, marker in CELLS.items()
            ],
            "cells",
        ),
        _style.Key(
            [
                Line2D(
                    [],
                    [],
                    color="#666666",
                    linestyle=STYLES[i % len(STYLES)],
                    marker="o",
                    markerfacecolor="white" if s.kind == "direct" else "#666666",
                    label=_describe(s),
                )
                for i, s in enumerate(sources)
            ],
            "result files",
        ),
    ]
    meta = next((s.meta for s in sources if s.kind == "speed"), sources[0].meta)
    fig.suptitle(
        f"The paper's Fig. 8 on a GPU: BPPSA against BP, H = {hidden}, B = {batch} "
        f"| {_machine(meta)}"
    )
    _style.finish(fig, _caption(sources, methods, hidden, batch), keys)
    return fig


def _machine(meta: dict) -> str:
    if meta.get("platform"):
        return _style.machine(meta)
    return f"device {meta.get('device', '?')}"


def _software(sources: Sequence[Source]) -> str:
    """``jax X, bppsa Y`` of the sources (every version seen)."""
    names = {"jax": [], "bppsa": []}
    for source in sources:
        for name, seen in names.items():
            version = source.meta.get(name)
            if version and version not in seen:
                seen.append(version)
    return ", ".join(f"{name} {' / '.join(seen)}" for name, seen in names.items() if seen)


def _timing(source: Source) -> str:
    """How a source's times were taken, for the caption."""
    if source.kind == "direct":
        return (
            f"{source.path.name}: jax.value_and_grad, and jax.vjp's pullback alone, of BP "
            "and of bppsa.scan with Blelloch(), minima of 5 calls after an untimed call"
        )
    timed = (
        "the whole gradient and the backward, each its own program"
        if source.backward
        else "jax.grad against bppsa.grad"
    )
    rounds = source.meta.get("repeats") or "the"
    return f"{source.path.name}: {timed}, medians of {rounds} interleaved rounds"


def _caption(sources: Sequence[Source], methods: list[str], hidden: int, batch: int) -> str:
    refused = [s for s in sources if s.refused]
    left_out = (
        "Not drawn in (a): the backward of "
        + ", ".join(s.path.name for s in refused)
        + ", which is the gradient's time minus the standalone jitted forward's (the file has "
        f'no "backward": "{PULLBACK}"): a difference of two different programs, not a '
        "measurement of the backward. "
        if refused
        else ""
    )
    precision = next(
        (s.meta["matmul_precision"] for s in sources if s.meta.get("matmul_precision")), None
    )
    names = [method_names.label(method_names.BP)] + [method_names.label(m) for m in methods]
    return (
        "(a) BP's backward time over the method's, each backward the jitted pullback of a "
        "jax.vjp applied to its saved residuals, timed as its own program (a pullback timed "
        "alone can carry artefacts of its own; the device profiler's kernel times are the "
        "cross-check). (b) BP's time for the whole gradient (forward and backward in one "
        f"program) over the method's. Rows at H = {hidden}, B = {batch}; filled markers from "
        "the speed grid, hollow from the direct timings. "
        + "; ".join(_timing(s) for s in sources)
        + ". "
        + left_out
        + _auto_runs(sources, hidden, batch)
        + _style.methods_note(names)
        + f" float32, matmul precision: {precision or 'JAX default'}; {_software(sources)}."
    )


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    parser = _cli.parser("paper_figures.gpu", __doc__)
    parser.add_argument(
        "results",
        type=pathlib.Path,
        nargs="*",
        default=[DEFAULT_RESULTS],
        help=f"result folders or files (default {DEFAULT_RESULTS})",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help=f"output folder (default {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    sources = _cli.load(parser, "results", load, args.results)
    for source in sources:
        if source.refused:
            print(f"paper_figures.gpu: {source.refused}")
    with plt.rc_context({"savefig.dpi": DPI}):
        return _cli.wrote(_style.save(draw(sources), args.out, NAME))


if __name__ == "__main__":
    main()
