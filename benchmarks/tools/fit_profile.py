"""Fits a backend's cost-model profile to measured times, and says how close it comes to every row.

**CPU** (the default): reads the JSON files of ``benchmarks.speed`` (every row keeps the HLO count
of each compiled backward: kernels in sequence, flops, bytes; see :mod:`benchmarks._speed_model`)
and fits the :class:`bppsa.Rates` of a profile (step latency, FLOP rate, bandwidth) that best
predict the measured median backward times (:func:`benchmarks.tools.hlo_cost.fit_profile`, least
squares in log time). A device's ``backward_ms`` is read only where it was timed as its own
program (below): elsewhere it is ``total - forward``.

**Accelerators** (``--device``), as the H200 files (``benchmarks/results/gpu-h200/``) require:

* Times: never ``total - forward``. On the H200 the standalone forward runs at half the speed of
  the forward inside a gradient, so that difference is negative in most rows. Read instead
  (medians): each method's whole gradient (a speed JSON's ``bp_total_ms`` and ``total_ms``,
  ``benchmarks.total``'s ``bp_total_ms`` / ``bppsa_total_ms`` (``*_median_s`` in older files),
  ``benchmarks.width``'s ``total_ms`` (``grad_median_s``), ``direct_backward.py``'s
  ``*_vg_med_ms``), predicted as the sequential
  forward plus the method's backward; and the backward timed as its own program:
  ``direct_backward.py``'s jitted pullback of a ``jax.vjp`` (``*_bwd_med_ms``; a pullback whose
  fastest run is slower than the fastest whole gradient is an artefact of timing it alone, as BP
  at RNN B = 1 there, and is left out), and a speed JSON's ``backward_ms`` / ``bp_backward_ms``
  where the payload, the row or the method entry says ``"backward": "pullback"``
  (:data:`paper_figures.result_files.PULLBACK`: the key the timing harness,
  :mod:`experiments.timing`, writes).
* Costs: the library's own model (``method.cost(footprint)``, :mod:`bppsa.scan._core.cost`),
  the one ``Auto()`` ranks methods by on accelerators, not HLO counts: in the H200's speed rows
  ``hlo_backward`` was the compiled gradient minus the compiled standalone forward, again two
  programs (Blelloch at T = 1000 counts about 2,070 kernels there where the model counts 62:
  the two forwards' loops differ by two kernels a step; newer rows count the backward program
  itself), and ``direct_backward.py`` kept no counts.
* Objective: ``Auto()`` uses the rates only to rank methods, and the model leaves costs out
  (BP's steps move the weights and their gradient, 46 MB a step at H = 1024 in the HLO counts
  against 20 kB in the model; a GRU step counts as an RNN step; a ``Chunked()`` step as one
  kernel where its program runs about 12), so the rates that fit the times best do not rank
  the methods right everywhere (on the H200 they rank BP first at RNN H = 1024, B = 1, where
  Blelloch's gradient was 1.2x faster). ``--choices`` takes, among the rates whose picks lose
  least against the fastest measured gradient of each row (beyond ``--tolerance``, the spread
  of repeats; a pick counts as right only if it stays right with any rate moved by
  ``--margin`` decades), those that fit the times best. ``--flops gemm`` pins the FLOP rate to
  the speed run's large float32 GEMM (``gemm_gflops``), a rate measured as its own program.
* The fused loops' envelope (``fused_programs`` of the profile's :class:`bppsa.Kernels`) is the
  kernel lab's (``python -m benchmarks.kernel_lab``: the largest loops that compile without
  spilling); ``--compile`` checks it against a device: it reads the compile grid's results
  (``fused_compile_gpu.jsonl`` of ``benchmarks/gpu.sh``, :mod:`benchmarks._fused_compile`) and
  reports every point the profile admits that did not compile and run right (exit status 1
  where there is one), and the points beyond it that did (:func:`envelope_check`).
* The fused forward's step latency (``Rates.fused_step_latency``, by which ``Auto()`` and the
  forward's policy rank the fused loops): ``--fused`` reads ``benchmarks/fused.py``'s forward
  rows (``fused_forward_gpu.jsonl``) and sets it to the median per-step time of the kernel on
  the library's dense cells, less the arithmetic the model counts (:func:`fused_latency`). The
  device fit itself keeps the base profile's value.

Run: ``.venv/bin/python -m benchmarks.tools.fit_profile benchmarks/results/cpu_floor.json``, or the
H200 (:data:`bppsa.scan._profile.GPU`): ``.venv/bin/python -m benchmarks.tools.fit_profile --device
--choices --flops gemm benchmarks/results/gpu-h200/{speed_gpu,total_gpu,width_gpu}.json
benchmarks/results/gpu-h200/gpu_backward.jsonl`` (``--out`` writes the profile and the ratios;
``--compile .../fused_compile_gpu.jsonl`` checks the envelope on that device's compile grid,
``--fused .../fused_forward_gpu.jsonl`` sets the fused step latency). ``--kernel-lab
.../fused_lab_gpu.jsonl`` fits the kernel lab's latency model to the fused loops' measured steps
(:mod:`benchmarks.tools.fit_kernel_lab`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import pathlib
import statistics

import numpy as np

from benchmarks import _speed_model
from benchmarks._speed_cli import SWEEPS
from benchmarks.tools import fit_kernel_lab, hlo_cost
from bppsa.scan._core import cost
from bppsa.scan._core.cost import Cost
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods.auto import ACCELERATOR_CHOICES
from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.profiles import get_profile
from bppsa.scan._profile import Profile
from paper_figures.result_files import PULLBACK, read_json, read_rows, write_json

METHODS = {repr(m): m for m in ACCELERATOR_CHOICES}  # what Auto() ranks on accelerators
BP = METHODS["Sequential()"]
# The device fit's search box, in log10 of: seconds per step, FLOP/s, B/s.
DEVICE_BOUNDS = np.array([(-7.0, -4.0), (11.0, 16.0), (10.0, 13.0)])


def _pullback(*entries: dict) -> bool:
    return any(entry.get("backward") == PULLBACK for entry in entries)


def samples(payload: dict) -> list[tuple[str, Cost, float]]:
    """``(label, HLO cost of the backward, measured seconds)`` of every measured backward (on a
    device, only those timed as their own program)."""
    device = payload.get("backend", "cpu") != "cpu"
    out = []
    for sweep in SWEEPS:
        for row in payload.get(sweep, []):
            if row.get("status") != "ok":
                continue
            head = f"{row['cell']} T={row['length']} B={row['batch']} H={row['hidden']}"
            entries = [("bp", row.get("bp_hlo_backward"), row.get("bp_backward_ms"), {})]
            entries += [
                (name, m.get("hlo_backward"), m.get("backward_ms"), m)
                for name, m in row["methods"].items()
                if m.get("status") == "ok"
            ]
            for name, count, ms, entry in entries:
                if device and not _pullback(payload, row, entry):
                    continue
                if count and ms and ms > 0 and count["steps"] > 0:
                    cost_ = Cost(count["steps"], max(count["flops"], 0), max(count["bytes"], 0))
                    out.append((f"{head} {name}", cost_, ms / 1e3))
    return out


@dataclasses.dataclass(frozen=True)
class Timing:
    """One sound time on a device: a method's whole gradient, or its backward alone.

    Attributes:
        row: the configuration (file, cell and sizes); timings of one row share a footprint.
        method: what ran (``Sequential()``: BP, ``lax.scan``'s own gradient).
        footprint: the scan's footprint, as ``Auto()`` weighs it.
        whole: the whole gradient (forward and backward) rather than the backward alone.
        seconds: the measured median.
    """

    row: str
    method: Method
    footprint: Footprint
    whole: bool
    seconds: float

    def cost(self) -> Cost:
        backward = self.method.cost(self.footprint)
        return (
            cost.plus(cost.sequential_forward(self.footprint), backward) if self.whole else backward
        )

    @property
    def label(self) -> str:
        return f"{self.row} {self.method!r} {'gradient' if self.whole else 'backward'}"


def footprint(cell: str, length: int, batch: int, hidden: int) -> Footprint | None:
    """The footprint of a benchmark's scan (``None`` for a cell the model does not cover)."""
    if cell in ("diag-gru", "diagonal-gru"):  # diagonal Jacobians, diagonal products
        return cost.footprint_of(length, hidden, batch, hidden, width=1)
    if cell in _speed_model.CHAIN_FORMS:
        return _speed_model.footprint(cell, length, batch, hidden)
    return None


def _speed(payload: dict, source: str) -> list[Timing]:
    out = []
    for sweep in SWEEPS:
        for row in payload.get(sweep, []):
            fp = footprint(row["cell"], row["length"], row["batch"], row["hidden"])
            if row.get("status") != "ok" or fp is None:
                continue
            head = f"{source} {row['cell']} T={row['length']} B={row['batch']} H={row['hidden']}"
            entries = [(BP, row.get("bp_total_ms"), row.get("bp_backward_ms"), {})]
            entries += [  # Auto's entry repeats the method it ran
                (METHODS[m["runs"]], m.get("total_ms"), m.get("backward_ms"), m)
                for name, m in row["methods"].items()
                if name != "auto" and m.get("status") == "ok" and m.get("runs") in METHODS
            ]
            for method, total, backward, entry in entries:
                if total and total > 0:
                    out.append(Timing(head, method, fp, True, total / 1e3))
                if backward and backward > 0 and _pullback(payload, row, entry):
                    out.append(Timing(head, method, fp, False, backward / 1e3))
    return out


def _total(payload: dict, source: str) -> list[Timing]:
    out = []
    for row in payload["rows"]:
        fp = footprint(row["cell"], row["length"], row["batch"], row["hidden"])
        if fp is None or row.get("ran") not in METHODS:
            continue
        head = f"{source} {row['cell']} T={row['length']} B={row['batch']} H={row['hidden']}"
        for prefix, method in (("bp", BP), ("bppsa", METHODS[row["ran"]])):
            if f"{prefix}_total_ms" in row:  # the harness's layout: each quantity its program
                out.append(Timing(head, method, fp, True, row[f"{prefix}_total_ms"] / 1e3))
                backward = row.get(f"{prefix}_backward_ms")
                if backward and _pullback(payload, row, {}):
                    out.append(Timing(head, method, fp, False, backward / 1e3))
            else:
                out.append(Timing(head, method, fp, True, row[f"{prefix}_median_s"]))
    return out


def _width(payload: dict, source: str) -> list[Timing]:
    out = []
    for row in payload["rows"]:
        fp = footprint(row["cell"], row["length"], row["batch"], row["hidden"])
        head = f"{source} {row['cell']} T={row['length']} B={row['batch']} H={row['hidden']}"
        for name, entry in row["methods"].items():
            method = BP if name == "bp" else METHODS.get(entry.get("ran"))
            if fp is None or name == "auto" or method is None:
                continue
            if "total_ms" in entry:  # the harness's layout
                out.append(Timing(head, method, fp, True, entry["total_ms"] / 1e3))
                if entry.get("backward_ms") and _pullback(payload, row, entry):
                    out.append(Timing(head, method, fp, False, entry["backward_ms"] / 1e3))
            else:
                out.append(Timing(head, method, fp, True, entry["grad_median_s"]))
    return out


def _direct(rows: list[dict], source: str) -> list[Timing]:
    """``direct_backward.py``'s rows: BP is ``lax.scan``, BPPSA ``Blelloch()``."""
    out = []
    for row in rows:
        fp = footprint(row["cell"], row["T"], row["B"], row["H"])
        if fp is None:
            continue
        head = f"{source} {row['cell']} T={row['T']} B={row['B']} H={row['H']}"
        for prefix, method in (("bp", BP), ("bppsa", METHODS["Blelloch()"])):
            out.append(Timing(head, method, fp, True, row[f"{prefix}_vg_med_ms"] / 1e3))
            if row[f"{prefix}_bwd_min_ms"] < row[f"{prefix}_vg_min_ms"]:
                out.append(Timing(head, method, fp, False, row[f"{prefix}_bwd_med_ms"] / 1e3))
    return out


def timings(path: pathlib.Path) -> list[Timing]:
    """The sound timings of a results file: a speed, total or width JSON, or the JSON lines of
    ``direct_backward.py``."""
    if path.suffix == ".jsonl":
        return _direct(read_rows(path), path.name)
    payload = read_json(path)
    rows = payload.get("rows") or [{}]
    if any(sweep in payload for sweep in SWEEPS):
        return _speed(payload, path.name)
    if "bp_median_s" in rows[0] or "bp_total_ms" in rows[0]:
        return _total(payload, path.name)
    if "methods" in rows[0]:
        return _width(payload, path.name)
    raise ValueError(f"{path}: not a speed, total, width or direct-backward results file")


@dataclasses.dataclass(frozen=True)
class Choice:
    """A row whose whole gradient was timed for several methods: what ``Auto()`` should pick."""

    row: str
    footprint: Footprint
    seconds: dict[Method, float]

    def fastest(self) -> Method:
        return min(self.seconds, key=self.seconds.get)

    def pick(self, profile: Profile) -> Method:
        """The measured method the model ranks first on ``profile``."""
        return min(self.seconds, key=lambda m: m.cost(self.footprint).seconds(profile))

    def loss(self, method: Method) -> float:
        """How much slower ``method``'s gradient was than the fastest (1: it is the fastest)."""
        return self.seconds[method] / min(self.seconds.values())


def choices(measured: list[Timing]) -> list[Choice]:
    """The rows with whole gradients of at least two methods (a method timed twice: the mean)."""
    rows: dict[str, dict[Method, list[float]]] = {}
    fps = {}
    for t in measured:
        if t.whole:
            rows.setdefault(t.row, {}).setdefault(t.method, []).append(t.seconds)
            fps[t.row] = t.footprint
    return [
        Choice(row, fps[row], {m: statistics.fmean(s) for m, s in seconds.items()})
        for row, seconds in rows.items()
        if len(seconds) > 1
    ]


def _regret(rows: list[Choice], grid: list[np.ndarray], tolerance: float) -> np.ndarray:
    """Summed ``log(picked / fastest)`` beyond ``log(1 + tolerance)`` at every grid point."""
    latency, rate, bandwidth = np.meshgrid(*(10.0**axis for axis in grid), indexing="ij")
    total = np.zeros(latency.shape)
    for row in rows:
        methods = list(row.seconds)
        costs = [m.cost(row.footprint) for m in methods]
        times = [c.steps * latency + np.maximum(c.flops / rate, c.bytes / bandwidth) for c in costs]
        loss = np.log([row.loss(m) for m in methods]) - math.log1p(tolerance)
        total += np.maximum(loss, 0)[np.argmin(np.stack(times), axis=0)]
    return total


def _robust(penalty: np.ndarray, shift: int) -> np.ndarray:
    """The largest ``penalty`` within ``shift`` grid steps along each axis, corners included
    (an axis of one point stays put)."""
    pads = [(shift, shift) if n > 1 else (0, 0) for n in penalty.shape]
    padded, out = np.pad(penalty, pads, mode="edge"), penalty
    offsets = [(-shift, 0, shift) if n > 1 else (0,) for n in penalty.shape]
    for offset in itertools.product(*offsets):
        starts = [pad + o for (pad, _), o in zip(pads, offset, strict=True)]
        window = tuple(slice(s, s + n) for s, n in zip(starts, penalty.shape, strict=True))
        out = np.maximum(out, padded[window])
    return out


def fit_device(
    measured: list[Timing],
    name: str,
    base: Profile | None = None,
    *,
    flops: float | None = None,
    rows: list[Choice] | None = None,
    tolerance: float = 0.1,
    margin: float = 0.1,
    step: float = 0.05,
) -> Profile:
    """The device profile whose rates best fit ``measured`` in squared log time, among the rates
    whose picks over ``rows`` lose least (see the module docstring).

    A log-spaced grid (``step`` decades) over :data:`DEVICE_BOUNDS`; deterministic.

    Args:
        measured: the sound timings.
        name: the profile's name.
        base: the profile whose other constants it keeps (default: the GPU's).
        flops: a FLOP rate measured on its own (then not fitted).
        rows: the choices to rank right (``None``: a plain time fit).
        tolerance: a pick within this fraction of the fastest counts as right.
        margin: decades by which every rate may move without a pick turning wrong.
        step: the grid's step in decades.
    """
    if not measured:
        raise ValueError("measured: expected at least one timing")
    grid = [np.arange(lo, hi + step / 2, step) for lo, hi in DEVICE_BOUNDS]
    if flops is not None:
        grid[1] = np.array([math.log10(flops)])
    costs = np.array([(c.steps, c.flops, c.bytes) for c in (t.cost() for t in measured)])
    log_measured = np.log([t.seconds for t in measured])
    points = np.stack(np.meshgrid(*grid, indexing="ij"), axis=-1).reshape(-1, 3)
    chunks = np.array_split(points, max(1, len(points) // 4096))
    errors = np.concatenate([hlo_cost.log_errors(costs, log_measured, c) for c in chunks])
    penalty = np.zeros(len(points))
    if rows:
        shift = round(margin / step)
        penalty = _robust(_regret(rows, grid, tolerance), shift).reshape(-1)
    least = penalty <= penalty.min() + 1e-9
    best = 10.0 ** points[np.flatnonzero(least)[np.argmin(errors[least])]]
    return hlo_cost.with_rates(base or get_profile("gpu"), name, best)


def gemm_flops(paths: list[pathlib.Path]) -> float | None:
    """The large GEMM's rate of the first speed run among ``paths``, in FLOP/s."""
    for path in paths:
        if path.suffix == ".json" and (gflops := read_json(path).get("gemm_gflops")):
            return gflops * 1e9
    return None


# Outcomes of a compile point that the envelope must keep out (benchmarks._fused_compile.STOPS).
BROKEN = ("failed", "crashed", "ran wrong")


@dataclasses.dataclass(frozen=True)
class EnvelopeCheck:
    """The compile grid's points against a profile's envelope, each as a label.

    Attributes:
        verified: admitted points that compiled and ran right.
        failed: admitted points that failed to compile or run, crashed or ran wrong.
        unverified: admitted points not run (skipped after a failure, an error, no counts).
        beyond: points the envelope refuses that compiled and ran right (room to grow).
    """

    verified: list[str]
    failed: list[str]
    unverified: list[str]
    beyond: list[str]

    def lines(self) -> list[str]:
        out = [
            f"envelope check: {len(self.verified)} admitted point(s) compiled and ran right, "
            f"{len(self.failed)} failed, {len(self.unverified)} not run; {len(self.beyond)} "
            "beyond the envelope compiled"
        ]
        out += [f"  admitted, {label}" for label in self.failed]
        return out


def envelope_check(path: pathlib.Path, profile: Profile) -> EnvelopeCheck:
    """The compile grid's points in ``path`` (:mod:`benchmarks._fused_compile`) against the
    envelope of ``profile`` (``Kernels.fused_programs``: a point is admitted where a program
    holds its ``tile`` and ``resident``; one without counts, by its row's ``library_why_not``).

    Raises:
        ValueError: ``path`` holds no point of the compile grid.
    """
    points = [r for r in read_rows(path) if r.get("part") == "compile" and "event" not in r]
    if not points:
        raise ValueError(f"{path}: no point of the compile grid (benchmarks.fused's 'compile')")
    check = EnvelopeCheck([], [], [], [])
    for row in points:
        label = f"{row['cell']} H = {row['hidden']} {row.get('status')}"
        if row.get("tile") is not None and row.get("resident") is not None:
            label += f" (tile {row['tile']}, resident {row['resident']})"
            admitted = any(
                p.holds(row["tile"], row["resident"]) is None
                for p in profile.kernels.fused_programs
            )
        else:
            admitted = "library_why_not" in row and row["library_why_not"] is None
        status = row.get("status")
        if not admitted:
            if status == "compiled":
                check.beyond.append(label)
        elif status == "compiled":
            check.verified.append(label)
        elif status in BROKEN:
            check.failed.append(label + (f": {row['error'][:200]}" if row.get("error") else ""))
        else:
            check.unverified.append(label)
    return check


def fused_latency(path: pathlib.Path, profile: Profile) -> float:
    """The fused forward's seconds per step (``Rates.fused_step_latency``) measured by the
    forward rows of ``benchmarks/fused.py`` in ``path`` (``fused_forward_gpu.jsonl``): the
    median over the rows of the library's dense cells where the kernel ran of the fused
    forward's median time less the arithmetic the model counts on ``profile``
    (:func:`bppsa.scan._core.cost.fused_forward` inverted), per step.

    Raises:
        ValueError: no such row.
    """
    per_step = []
    for row in read_rows(path):
        if row.get("part") != "forward" or row.get("fused_why_not") is not None:
            continue
        if row.get("cell") not in _speed_model.CHAIN_FORMS or row.get("fused_ms") is None:
            continue
        fp = _speed_model.footprint(row["cell"], row["length"], row["batch"], row["hidden"])
        work = cost.sequential_forward(fp)
        arithmetic = Cost(0, work.flops, work.bytes).seconds(profile)
        per_step.append(max(row["fused_ms"] / 1e3 - arithmetic, 0.0) / row["length"])
    if not per_step:
        raise ValueError(f"{path}: no forward row of a dense cell where the fused kernel ran")
    return max(statistics.median(per_step), 1e-9)


def with_fused_latency(profile: Profile, seconds: float) -> Profile:
    """``profile`` with the fused forward's ``seconds`` per step (:func:`fused_latency`)."""
    return dataclasses.replace(
        profile, rates=dataclasses.replace(profile.rates, fused_step_latency=seconds)
    )


def _report(args, backend: str, profile: Profile, rows: list, extra: dict | None = None) -> None:
    """Prints measured / model for every ``(label, seconds, ratio)`` of ``rows``, their spread
    and how to use ``profile``; writes them (and ``extra``) to ``args.out``."""
    ratios = [ratio for *_, ratio in rows]
    for label, seconds, ratio in rows:
        print(f"  {label:<64} measured {seconds * 1e3:9.2f} ms  measured/model {ratio:5.2f}")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"measured/model: median {statistics.median(ratios):.2f}, quartiles "
        f"{quartiles[0]:.2f}-{quartiles[-1]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f}"
    )
    rates = {f: getattr(profile.rates, f) for f in ("step_latency", "flops", "bandwidth")}
    if profile.rates.fused_step_latency is not None:
        rates["fused_step_latency"] = profile.rates.fused_step_latency
    use = f"rates=bppsa.Rates({', '.join(f'{k}={v:.4g}' for k, v in rates.items())})"
    print(
        f"to use it: bppsa.set_profile({backend!r}, dataclasses.replace(bppsa.get_profile("
        f"{backend!r}), {use}))"
    )
    if args.out:
        write_json(
            args.out,
            dict(
                profile=dict(name=profile.name, **rates),
                sources=[str(p) for p in args.results],
                rows=[dict(label=lab, measured_s=sec, ratio=r) for lab, sec, r in rows],
                **(extra or {}),
            ),
        )


def _main_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    measured = [t for path in args.results for t in timings(path)]
    if not measured:
        parser.error("no whole gradient or backward timed as its own program")
    flops = gemm_flops(args.results) if args.flops == "gemm" else args.flops
    if args.flops == "gemm" and flops is None:
        parser.error("--flops gemm: no speed run with gemm_gflops among the results")
    rows = choices(measured) if args.choices else None
    current = get_profile("gpu")
    name = args.name or "accelerator (fitted to whole gradients and pullbacks)"
    profile = fit_device(
        measured,
        name,
        current,
        flops=flops,
        rows=rows,
        tolerance=args.tolerance,
        margin=args.margin,
    )
    check = envelope_check(args.compile, profile) if args.compile else None
    if args.fused:
        profile = with_fused_latency(profile, fused_latency(args.fused, profile))
    print(
        f"fitted: {profile.rates.step_latency * 1e6:.2f} us per step, "
        f"{profile.rates.flops / 1e12:.0f} TFLOP/s, {profile.rates.bandwidth / 1e12:.2f} TB/s "
        f"over {len(measured)} timings"
    )
    table = []
    for row in rows or []:
        was, now, best = row.pick(current), row.pick(profile), row.fastest()
        print(
            f"  {row.row:<44} current {was!r:<22} fitted {now!r:<22} fastest {best!r:<22} "
            f"x{row.loss(now):.2f}"
        )
        ms = {repr(m): seconds * 1e3 for m, seconds in row.seconds.items()}
        table.append(
            dict(row=row.row, current=repr(was), fitted=repr(now), fastest=repr(best), ms=ms)
        )
        table[-1]["loss"] = row.loss(now)
    timed = [(t.label, t.seconds, t.seconds / t.cost().seconds(profile)) for t in measured]
    extra: dict = dict(choices=table)
    if check is not None:
        extra["envelope_check"] = dataclasses.asdict(check)
    _report(args, "gpu", profile, timed, extra)
    if check is not None:
        print("\n".join(check.lines()))
        if check.failed:
            raise SystemExit(1)


def _main_kernel_lab(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    lab_rows = read_rows(args.lab) if args.lab.exists() else []
    try:
        fitted = fit_kernel_lab.report(args, fit_kernel_lab.load(args.kernel_lab), lab_rows)
    except ValueError as error:
        parser.error(f"--kernel-lab: {error}")
    if args.out:
        write_json(args.out, fitted | {"sources": [str(p) for p in args.kernel_lab]})


def _flops(value: str) -> str | float:
    return value if value == "gemm" else float(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=pathlib.Path, help="results files")
    parser.add_argument("--device", action="store_true", help="an accelerator's fit (see above)")
    parser.add_argument(
        "--choices", action="store_true", help="--device: rank each row's fastest first"
    )
    parser.add_argument("--flops", type=_flops, help="--device: FLOP/s measured alone, or gemm")
    parser.add_argument("--tolerance", type=float, default=0.1, help="--choices: noise allowed")
    parser.add_argument("--margin", type=float, default=0.1, help="--choices: decades to spare")
    parser.add_argument("--name", help="the profile's name")
    parser.add_argument("--out", type=pathlib.Path, help="write the profile and ratios here")
    parser.add_argument(
        "--compile", type=pathlib.Path, help="--device: check the envelope on a compile grid"
    )
    parser.add_argument(
        "--fused", type=pathlib.Path, help="--device: the fused forward rows (its step latency)"
    )
    parser.add_argument(
        "--kernel-lab",
        nargs="+",
        type=pathlib.Path,
        help="fit the kernel lab's model to these device rows (benchmarks.fused --parts lab)",
    )
    parser.add_argument(
        "--lab", type=pathlib.Path, default=fit_kernel_lab.LAB_ROWS, help="--kernel-lab: lab rows"
    )
    parser.add_argument(
        "--refit",
        action="store_true",
        help="--kernel-lab: fit the model's constants (compiles the kernels: the triton wheel)",
    )
    args = parser.parse_args(argv)
    if args.kernel_lab:
        if args.results:
            parser.error("--kernel-lab fits the kernel lab's model alone: no results files")
        _main_kernel_lab(parser, args)
        return
    if not args.results:
        parser.error("the following arguments are required: results")
    if args.device:
        _main_device(parser, args)
        return
    if args.compile or args.fused:
        parser.error("--compile, --fused: the fused kernels' envelope and rate are a device's")
    rows = [s for path in args.results for s in samples(read_json(path))]
    if not rows:
        parser.error("no row with an HLO count and a measured backward")
    name = args.name or "2-core CPU (fitted to HLO counts of a speed run)"
    profile = hlo_cost.fit_profile([(c, t) for _, c, t in rows], name)
    ratios = hlo_cost.errors([(c, t) for _, c, t in rows], profile)
    print(
        f"fitted: {profile.rates.step_latency * 1e9:.1f} ns per kernel, "
        f"{profile.rates.flops / 1e9:.1f} GFLOP/s, {profile.rates.bandwidth / 1e9:.1f} GB/s "
        f"over {len(rows)} backward passes"
    )
    timed = [(label, seconds, r) for (label, _, seconds), r in zip(rows, ratios, strict=True)]
    _report(args, "cpu", profile, timed)


if __name__ == "__main__":
    main()
