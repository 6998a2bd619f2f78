"""Fits the kernel lab's latency model (:mod:`benchmarks.kernel_lab.model`) to the fused loops'
steps measured on a device: ``python -m benchmarks.tools.fit_profile --kernel-lab
fused_lab_gpu.jsonl`` (the rows of ``benchmarks/fused.py --parts lab``,
:mod:`benchmarks._fused_lab`).

Each device row pairs, per variant, a kernel's measured microseconds a step with the lab's
estimate of the same kernel (by name, sm_90, warps, step-ahead loads); where the row has no
estimate, the lab's rows (``--lab``, default ``benchmarks/results/kernel_lab/kernels.jsonl``)
give it. Two fits, printed with measured/estimate per kernel before and after:

* **scale** (always): one factor ``s`` with ``measured = s * estimate``, least squares in log
  time (the geometric mean of measured/estimate): a clock-like correction that keeps the
  model's ranking of kernels;
* **constants** (``--refit``, where the pairs are many enough): the model's
  :class:`~benchmarks.kernel_lab.model.Constants` (latency per class: global, local, shared
  loads, shuffles, special functions, the rest; the barrier's cycles) that minimise the
  squared log error over the kernels. The lab's rows keep no SASS, so each kernel is captured
  and compiled again (:mod:`benchmarks.kernel_lab.capture`, ``compile``: needs the ``triton``
  wheel) to get its time loop. The estimate is piecewise linear in the constants (a maximum
  over scoreboards), so the fit is a deterministic coordinate search over a multiplicative
  grid, constant by constant, until no move lowers the error; only constants that some
  kernel's loop uses move, and only where there are at least :data:`PAIRS_PER_CONSTANT`
  kernels per constant moved (else the scale fit alone is reported).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.kernel_lab import model
from benchmarks.kernel_lab.sass import Instruction
from paper_figures.result_files import read_rows

LAB_ROWS = pathlib.Path(__file__).resolve().parents[1] / "results" / "kernel_lab" / "kernels.jsonl"
ARCH = 90
# Variants of a device row (benchmarks._fused_lab.VARIANTS), read by their fields' prefixes.
VARIANTS = ("auto", "w4", "auto_no_prefetch", "w4_no_prefetch")
# The constants the fit may move: a latency class (its mnemonics) or a field of Constants.
CLASSES: Mapping[str, tuple[str, ...]] = {
    "global": ("LDG",),
    "local": ("LDL",),
    "shared": ("LDS", "LDSM"),
    "shuffle": ("SHFL",),
    "special": ("MUFU",),
}
FIELDS = ("other", "barrier")
PAIRS_PER_CONSTANT = 2
# The search's moves: factors 2^(k/4) for k = -8..8, repeated until none helps.
FACTORS = tuple(2 ** (k / 4) for k in range(-8, 9) if k)
ROUNDS = 20

Key = tuple[str, int, bool]  # (kernel, num_warps, prefetch)


@dataclasses.dataclass(frozen=True)
class Pair:
    """One kernel's measured step and the lab's estimate (microseconds)."""

    kernel: str
    num_warps: int
    prefetch: bool
    measured_us: float
    estimate_us: float | None

    @property
    def key(self) -> Key:
        return (self.kernel, self.num_warps, self.prefetch)

    @property
    def label(self) -> str:
        return f"{self.kernel} w{self.num_warps}" + ("" if self.prefetch else " no prefetch")


def pairs(device_rows: Sequence[dict[str, Any]], lab_rows: Sequence[dict[str, Any]]) -> list[Pair]:
    """Every variant of ``device_rows`` (part ``lab``) measured on a device, with the lab's
    estimate from the row or, where it has none, from ``lab_rows``; a kernel measured twice
    (two rows, or auto warps equal to 4) counts once, at the median."""
    lab = {}
    for row in lab_rows:
        if row.get("arch") == ARCH and row.get("step_us") is not None:
            lab[(row["kernel"], row["num_warps"], row.get("prefetch", True))] = row["step_us"]
    measured: dict[Key, list[float]] = {}
    estimates: dict[Key, float | None] = {}
    for row in device_rows:
        if row.get("part") != "lab" or row.get("status", "ok") != "ok":
            continue
        for name in VARIANTS:
            us, warps = row.get(f"{name}_measured_us_per_step"), row.get(f"{name}_num_warps")
            if not us or warps is None or row.get(f"{name}_why_not") is not None:
                continue
            key = (row["kernel"], int(warps), bool(row.get(f"{name}_prefetch", True)))
            measured.setdefault(key, []).append(float(us))
            estimates[key] = row.get(f"{name}_estimate_us") or estimates.get(key) or lab.get(key)
    return [
        Pair(*key, statistics.median(values), estimates[key])
        for key, values in sorted(measured.items())
    ]


def fit_scale(found: Sequence[Pair]) -> float:
    """``s`` minimising ``sum (log measured - log(s * estimate))^2`` over the pairs with an
    estimate: the geometric mean of measured/estimate.

    Raises:
        ValueError: no pair has an estimate.
    """
    logs = [math.log(p.measured_us / p.estimate_us) for p in found if p.estimate_us]
    if not logs:
        raise ValueError("no kernel has both a measured step and the lab's estimate")
    return math.exp(statistics.fmean(logs))


def _with(constants: model.Constants, name: str, value: float) -> model.Constants:
    value = max(1, round(value))
    if name in CLASSES:
        latency = dict(constants.latency) | dict.fromkeys(CLASSES[name], value)
        return dataclasses.replace(constants, latency=latency)
    return dataclasses.replace(constants, **{name: value})


def _value(constants: model.Constants, name: str) -> float:
    if name in CLASSES:
        return constants.latency.get(CLASSES[name][0], constants.other)
    return getattr(constants, name)


@dataclasses.dataclass(frozen=True)
class TimeLoop:
    """A kernel's time loop: its instructions and the steps an iteration of it runs."""

    instructions: tuple[Instruction, ...]
    steps: int = 1


def used(loops: Mapping[Key, TimeLoop]) -> list[str]:
    """The constants some loop of ``loops`` depends on (:data:`CLASSES`, :data:`FIELDS`)."""
    bases = {ins.base for loop in loops.values() for ins in loop.instructions}
    names = [name for name, mnemonics in CLASSES.items() if bases & set(mnemonics)]
    known = {m for mnemonics in CLASSES.values() for m in mnemonics}
    if any(base not in known and base != "BAR" for base in bases):
        names.append("other")
    if "BAR" in bases:
        names.append("barrier")
    return names


def estimates_us(
    found: Sequence[Pair],
    loops: Mapping[Key, TimeLoop],
    constants: model.Constants,
    arch: int = ARCH,
) -> list[float]:
    """The model's microseconds a step of each pair's loop with ``constants`` (a loop shared by
    several pairs walked once)."""
    walked: dict[int, float] = {}
    out = []
    for p in found:
        loop = loops[p.key]
        if id(loop) not in walked:
            seconds = model.step_seconds(loop.instructions, arch, loop.steps, constants)
            walked[id(loop)] = 1e6 * seconds
        out.append(walked[id(loop)])
    return out


def log_error(found: Sequence[Pair], estimated: Sequence[float]) -> float:
    """``sum (log measured - log estimate)^2``."""
    return sum(
        math.log(p.measured_us / e) ** 2 for p, e in zip(found, estimated, strict=True) if e > 0
    )


def fit_constants(
    found: Sequence[Pair],
    loops: Mapping[Key, TimeLoop],
    start: model.Constants | None = None,
    arch: int = ARCH,
) -> model.Constants:
    """The :class:`~benchmarks.kernel_lab.model.Constants` that minimise the squared log error
    of the model over ``found`` (each pair's loop in ``loops``), from ``start`` (default: the
    model's), by coordinate search (the module docstring)."""
    found = [p for p in found if p.key in loops]
    best = start or model.Constants()

    def error(constants: model.Constants) -> float:
        return log_error(found, estimates_us(found, loops, constants, arch))

    current = error(best)
    names = used({p.key: loops[p.key] for p in found})
    for _ in range(ROUNDS):
        moved = False
        for name in names:
            base = _value(best, name)
            for factor in FACTORS:
                trial = _with(best, name, base * factor)
                if _value(trial, name) == _value(best, name):
                    continue
                if (trial_error := error(trial)) < current - 1e-12:
                    best, current, moved = trial, trial_error, True
        if not moved:
            break
    return best


def parse_kernel(name: str) -> tuple[str, int, str, bool]:
    """``(cell, hidden, loop, batched)`` of a lab kernel's name (``rnn-h20-forward-b``)."""
    match = re.fullmatch(r"(.+)-h(\d+)-(forward|backward)(-b)?", name)
    if match is None:
        raise ValueError(f"not a kernel lab name: {name!r}")
    return match.group(1), int(match.group(2)), match.group(3), bool(match.group(4))


def compiled_loops(keys: Sequence[Key], arch: int = ARCH) -> dict[Key, TimeLoop]:
    """The time loop of each ``(kernel, warps, prefetch)``, captured and compiled here (the
    ``triton`` wheel: :mod:`benchmarks.kernel_lab.compile`)."""
    from benchmarks.kernel_lab import capture, sass
    from benchmarks.kernel_lab.compile import compile_ttir

    out = {}
    for kernel, warps, prefetch in keys:
        spec = capture.Spec(*parse_kernel(kernel), prefetch=prefetch)
        captured = capture.capture(spec, num_warps=warps)
        code = sass.instructions(compile_ttir(captured.ttir, warps, arch).sass)
        loop = sass.time_loop(code)
        steps = sass.steps_per_iteration(loop, code, capture.LENGTH)
        out[(kernel, warps, prefetch)] = TimeLoop(tuple(loop), steps)
    return out


def report(
    args: Any,
    device: Sequence[dict[str, Any]],
    lab_rows: Sequence[dict[str, Any]],
    loops_of: Callable[[Sequence[Key]], Mapping[Key, TimeLoop]] = compiled_loops,
    print_: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the fits of ``args`` (``refit``) on ``device``'s rows and prints measured/estimate
    per kernel before and after; returns what ``--out`` writes."""
    found = pairs(device, lab_rows)
    if not found:
        raise ValueError("no fused loop measured on a device (benchmarks.fused's part 'lab')")
    scale = fit_scale(found) if any(p.estimate_us for p in found) else None
    out: dict[str, Any] = {"fit": "scale", "scale": scale, "kernels": []}
    after: dict[Key, float] = {}
    loops: Mapping[Key, TimeLoop] = {}
    if args.refit:
        try:
            loops = loops_of([p.key for p in found])
        except Exception as error:  # no triton wheel, or a kernel the lab cannot capture
            print_(f"--refit: no time loops ({type(error).__name__}: {error}): the scale alone")
    if loops:
        found = [p for p in found if p.key in loops]
        names = used(loops)
        if len(found) >= PAIRS_PER_CONSTANT * max(len(names), 1):
            fitted = fit_constants(found, loops)
            after = dict(
                zip([p.key for p in found], estimates_us(found, loops, fitted), strict=True)
            )
            out |= {"fit": "constants", "constants": dataclasses.asdict(fitted), "moved": names}
            before = dict(
                zip(
                    [p.key for p in found],
                    estimates_us(found, loops, model.Constants()),
                    strict=True,
                )
            )
            found = [dataclasses.replace(p, estimate_us=before[p.key]) for p in found]
        else:
            print_(f"{len(found)} kernel(s) for {len(names)} constants: too few, the scale alone")
    if scale is None and out["fit"] == "scale":
        raise ValueError(
            "no kernel has the lab's estimate (python -m benchmarks.kernel_lab writes them; "
            "--refit compiles the kernels here)"
        )
    print_(f"kernel lab fit: {out['fit']} over {len(found)} kernel(s); scale {scale or 0:.3f}")
    for p in found:
        scaled = None if p.estimate_us is None or scale is None else scale * p.estimate_us
        now = after.get(p.key) or scaled
        was = "-" if not p.estimate_us else f"{p.measured_us / p.estimate_us:6.2f}"
        then = "-" if not now else f"{p.measured_us / now:6.2f}"
        print_(
            f"  {p.label:<36} measured {p.measured_us:8.3f} us  measured/estimate {was} -> {then}"
        )
        out["kernels"].append(dataclasses.asdict(p) | {"estimate_after_us": now})
    if out["fit"] == "constants":
        print_(f"constants: {out['constants']}")
    return out


def load(paths: Sequence[pathlib.Path]) -> list[dict[str, Any]]:
    return [row for path in paths for row in read_rows(path)]
