"""Part ``lab`` of :mod:`benchmarks.fused`: the fused loops' measured step beside the kernel
lab's estimate of the same kernel (:mod:`benchmarks.kernel_lab`).

A row is one loop of one library cell at one hidden size, over the lab's problem (``T = 1000``,
``B = 16`` under ``jax.vmap``, 8 inputs: :mod:`benchmarks.kernel_lab.capture`): the forward
(``bppsa.Fused(num_warps=...)``, the final states) or the sequential backward
(``bppsa.FusedSequential(num_warps=...)``, the pullback of ``jax.vjp`` applied to residuals
saved once, its own program). Each loop runs in four variants (:data:`VARIANTS`): the warps the
profile picks (``"auto"``) or 4 (the old default), with the step-ahead loads
(``Kernels.fused_prefetch``) on or off, set on the default backend's profile
(:func:`benchmarks._fused_envelope.prefetching`). Every variant is checked against the
reference (``lax.scan``, or BP's gradient) and the four are timed together, round by round.

A variant's measured step (``<variant>_measured_us_per_step``) is the device's time of the fused
kernel alone over ``T`` (the profiler's events of the kernel, ``<variant>_kernel_us_per_step``)
where the profiler has them, else the program's fastest time over ``T``
(``<variant>_min_us_per_step``; ``<variant>_measured_from`` says which). Beside it,
``<variant>_estimate_us`` is the lab's ``step_us`` of the kernel it launched: the row of
``benchmarks/results/kernel_lab/kernels.jsonl`` named ``<cell>-h<H>-<loop>-b`` at sm_90
(:data:`ARCH`) and the warps launched (``None`` where the file or the row is missing, or the
lab did not compile that variant: its rows are at the profile's own step-ahead loads unless
they say ``prefetch``). ``python -m benchmarks.tools.fit_profile --kernel-lab`` fits the lab's
model to these pairs.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import bppsa
from benchmarks import _fused_envelope as envelope
from benchmarks._fused_rows import Case, Program, final_states, machine, relative_difference
from benchmarks.kernel_lab import capture
from benchmarks.kernel_lab.lab import read_rows
from experiments.timing import interleaved, ms_fields

LAB_ROWS = pathlib.Path(__file__).resolve().parent / "results" / "kernel_lab" / "kernels.jsonl"
ARCH = 90
# The lab's problem (benchmarks.kernel_lab.capture): its rows estimate these kernels.
LENGTH, BATCH, INPUTS = capture.LENGTH, capture.BATCH, capture.INPUTS
HIDDENS = (20, 64, 128)
# The dense cells first: the lab's targets (benchmarks.kernel_lab.report.TARGETS) are theirs.
CELLS = tuple(capture.CELLS)
LOOPS = ("forward", "backward")
# name -> (num_warps, prefetch)
VARIANTS: dict[str, tuple[int | str, bool]] = {
    "auto": ("auto", True),
    "w4": (4, True),
    "auto_no_prefetch": ("auto", False),
    "w4_no_prefetch": (4, False),
}
KERNELS = {"forward": "bppsa_fused_forward", "backward": "bppsa_fused_backward"}


@dataclasses.dataclass(frozen=True)
class LoopCase(Case):
    """A :class:`~benchmarks._fused_rows.Case` and one of its loops (``"forward"`` or
    ``"backward"``)."""

    loop: str = "forward"


def plan(dry_run: bool = False) -> list[LoopCase]:
    """The rows in the order they run: by hidden size, then cell, then loop."""
    if dry_run:
        return [LoopCase("rnn", 8, 8, 2, 4, loop) for loop in LOOPS]
    return [
        LoopCase(cell, hidden, LENGTH, BATCH, INPUTS, loop)
        for hidden in HIDDENS
        for cell in CELLS
        for loop in LOOPS
    ]


def kernel_name(cell: str, hidden: int, loop: str) -> str:
    """The lab's name of the batched kernel (:attr:`benchmarks.kernel_lab.capture.Spec.name`)."""
    return capture.Spec(cell, hidden, loop, batched=True).name


@functools.cache
def _read(path: pathlib.Path, modified: int | None) -> tuple[dict[str, Any], ...]:
    return tuple(read_rows(str(path)))


def _lab_rows(path: pathlib.Path) -> tuple[dict[str, Any], ...]:
    """The lab's rows in ``path`` (none where it is missing), read once while it is unchanged."""
    return _read(path, path.stat().st_mtime_ns if path.exists() else None)


def estimate(
    kernel: str,
    num_warps: int | None,
    prefetch: bool,
    path: pathlib.Path = LAB_ROWS,
    arch: int = ARCH,
) -> dict[str, Any] | None:
    """The lab's row of ``kernel`` at ``arch`` and ``num_warps`` for the step-ahead loads
    ``prefetch`` (a row without a ``prefetch`` field is at the built-in profile's), or ``None``
    where the file, the row or its estimate is missing."""
    if num_warps is None:
        return None
    default = bppsa.Kernels().fused_prefetch
    for row in _lab_rows(path):
        if (row.get("kernel"), row.get("arch"), row.get("num_warps")) != (kernel, arch, num_warps):
            continue
        if row.get("prefetch", default) == prefetch and row.get("step_us") is not None:
            return row
    return None


def _problem(case: Case) -> tuple[Any, jax.Array]:
    """``(params, xs)`` of ``case``: the cell's parameters and standard-normal inputs."""
    kind, _ = capture.CELLS[case.cell]
    k_params, k_xs = jax.random.split(jax.random.key(0))
    params = kind.init(case.inputs, case.hidden, key=k_params)
    xs = jax.random.normal(k_xs, (case.batch, case.length, case.inputs), jnp.float32)
    return params, xs


def _loss(scan: Callable, case: Case, params: Any, xs: jax.Array) -> jax.Array:
    return jnp.sum(final_states(scan, case, params, xs))


def _pullback(pullback, cotangent):
    (grads,) = pullback(cotangent)
    return grads


def launched_warps(case: Case, loop: str, num_warps: int | str) -> tuple[int | None, str | None]:
    """``(warps, None)`` the default backend's profile launches ``loop`` of ``case`` with, or
    ``(None, why not)`` where it refuses it."""
    if num_warps != "auto":
        return int(num_warps), None
    try:
        planned, why = capture.planned(
            capture.Spec(case.cell, case.hidden, loop, batched=False), bppsa.get_profile()
        )
    except Exception as error:  # internals moved: the row goes on without the warps
        return None, f"{type(error).__name__}: {str(error)[:200]}"
    return (None, why) if planned is None else (int(planned.launch.num_warps), None)


def kernel_seconds(fn: Callable, args: tuple, name: str, repeats: int = 3) -> float | None:
    """The device's seconds per call of ``fn(*args)`` in the kernels whose name holds ``name``
    (the profiler's events), or ``None`` where it has none (a CPU, no profiler)."""
    profile_data = getattr(jax.profiler, "ProfileData", None)
    if jax.default_backend() == "cpu" or profile_data is None:
        return None
    from experiments.timing.kernels import profile_events

    try:
        jax.block_until_ready(fn(*args))
        with tempfile.TemporaryDirectory(prefix="fused-lab-") as log_dir:
            with jax.profiler.trace(log_dir):
                for _ in range(repeats):
                    jax.block_until_ready(fn(*args))
            total = sum(
                duration
                for path in sorted(pathlib.Path(log_dir).glob("**/*.xplane.pb"))
                for plane, _, event, duration in profile_events(profile_data.from_file(str(path)))
                if plane.startswith("/device:GPU") and name in event
            )
    except Exception:  # a cross-check must not lose the row
        return None
    return 1e-9 * total / repeats if total else None


def _programs(case: Case, loop: str, num_warps: int | str) -> tuple[Program, tuple, Any]:
    """``(program timed, its arguments, its values)`` of one variant, traced under the profile
    in force."""
    params, xs = _problem(case)
    if loop == "forward":
        scan = functools.partial(bppsa.scan, forward=bppsa.Fused(num_warps=num_warps))
        program = Program.of(functools.partial(final_states, scan, case), params, xs)
        return program, (params, xs), program.compiled(params, xs)
    scan = functools.partial(
        bppsa.scan, method=bppsa.FusedSequential(num_warps=num_warps), forward="sequential"
    )
    loss = functools.partial(_loss, scan, case)
    with bppsa.trace_plans() as plans:
        forward = jax.jit(lambda p, x: jax.vjp(lambda q: loss(q, x), p)).lower(params, xs)
    value, pullback = forward.compile()(params, xs)
    cotangent = jnp.ones_like(value)
    program = Program.of(_pullback, pullback, cotangent)
    program = Program(program.compiled, program.text, [*plans, *program.plans], program.compile_s)
    return program, (pullback, cotangent), program.compiled(pullback, cotangent)


def _reference(case: Case, loop: str) -> Any:
    params, xs = _problem(case)
    if loop == "forward":
        return jax.jit(functools.partial(final_states, jax.lax.scan, case))(params, xs)
    return jax.jit(jax.grad(functools.partial(_loss, jax.lax.scan, case)))(params, xs)


def _ran_fused(program: Program, loop: str) -> str | None:
    """Why the first scan of ``program`` did not run ``loop`` in its kernel (``None``: it did)."""
    if not program.plans:
        return "no bppsa.scan was traced"
    plan = program.plans[0]
    if loop == "forward":
        return None if isinstance(plan.forward, bppsa.Fused) else plan.forward_because
    return plan.backward_because


def lab_row(case: LoopCase, rounds: int) -> dict[str, Any]:
    """The loop of ``case`` in every variant (see the module docstring)."""
    loop = case.loop
    kernel = kernel_name(case.cell, case.hidden, loop)
    row: dict[str, Any] = {"part": "lab", **case.fields(), "kernel": kernel, "arch": ARCH,
                           **machine(), "rounds": rounds}  # fmt: skip
    reference = _reference(case, loop)
    programs, calls = {}, {}
    for name, (num_warps, prefetch) in VARIANTS.items():
        with envelope.prefetching(prefetch) as swapped:
            warps, why = launched_warps(case, loop, num_warps)
            program, args, values = _programs(case, loop, num_warps)
        row[f"{name}_prefetch"] = prefetch if swapped else None
        row[f"{name}_num_warps"] = warps
        row[f"{name}_why_not"] = why = why or _ran_fused(program, loop)
        row[f"{name}_difference"] = relative_difference(values, reference)
        row[f"{name}_compile_s"] = program.compile_s
        programs[name] = (program, args)
        if why is None:
            calls[name] = functools.partial(program.compiled, *args)
    row |= ms_fields(interleaved(calls, rounds))
    for name, (_, prefetch) in VARIANTS.items():
        ms = row.get(f"{name}_min_ms")
        row[f"{name}_min_us_per_step"] = None if ms is None else 1e3 * ms / case.length
        program, args = programs[name]
        seconds = (
            None if name not in calls else kernel_seconds(program.compiled, args, KERNELS[loop])
        )
        row[f"{name}_kernel_us_per_step"] = None if seconds is None else 1e6 * seconds / case.length
        measured = row[f"{name}_kernel_us_per_step"] or row[f"{name}_min_us_per_step"]
        row[f"{name}_measured_us_per_step"] = measured
        row[f"{name}_measured_from"] = (
            None
            if measured is None
            else ("kernel" if row[f"{name}_kernel_us_per_step"] else "program")
        )
        # the lab's kernels are T = LENGTH, B = BATCH: another problem has no estimate
        same = (case.length, case.batch) == (LENGTH, BATCH)
        lab = estimate(kernel, row[f"{name}_num_warps"], prefetch) if same else None
        row[f"{name}_estimate_us"] = None if lab is None else lab["step_us"]
        row[f"{name}_measured_over_estimate"] = (
            None if lab is None or measured is None else measured / lab["step_us"]
        )
    return row


def describe(row: dict[str, Any]) -> str:
    """One line of a row: each variant's measured step against the lab's estimate."""
    parts = []
    for name in VARIANTS:
        measured, estimated = (
            row.get(f"{name}_measured_us_per_step"),
            row.get(f"{name}_estimate_us"),
        )
        text = "-" if measured is None else f"{measured:.3f}"
        text += " / " + ("-" if estimated is None else f"{estimated:.3f}")
        parts.append(f"{name} (w{row.get(f'{name}_num_warps')}) {text}")
    return f"{row['loop']:<8} " + " | ".join(parts) + " us/step measured / lab"
