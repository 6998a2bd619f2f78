"""Speed of BPPSA's gradient against back-propagation (jax.grad through lax.scan), every part of
the gradient timed as its own program.

For the paper's classifiers (input 1, hidden H, linear head on the last state), over a T sweep at
B = 16, a B sweep at T = 1000 and, with ``--hiddens``, an H sweep, in ONE process, with the
timing harness (:mod:`experiments.timing`: every program once per round, each timed call right after
an untimed call of itself, so that load on a shared machine hits all alike; medians and minima over
the rounds), for

* BP: the loss through a batched ``lax.scan``, differentiated by JAX;
* BPPSA: the same loss written the intended way (a ``bppsa.scan`` over one example,
  ``jax.vmap``-ed over the batch), with each method bound in the scan;

three programs each (:class:`experiments.timing.GradientPrograms`): the whole gradient (``total``,
``jax.value_and_grad``), the forward as it runs inside it (``forward``, the forward of
``jax.vjp``: the loss and the residuals) and the backward (``backward``, the jitted pullback
applied to saved residuals). No time is a difference of two programs: the file and every row say
so with ``"backward": "pullback"``. Speedups are BP's over the method's: of the backward,
``bp_backward_ms / backward_ms``; overall, ``bp_total_ms / total_ms``. On a GPU, every backward's
device kernel time from the profiler (``backward_kernel_ms``) cross-checks the pullback timed
alone (on an H200, BP's pullback alone took longer than its whole gradient).

Also reported: the standalone forward (``standalone_forward_ms``: the jitted loss through the
batched ``lax.scan``, no residuals kept; NOT the forward inside any gradient: on an H200 it ran
about twice as long per step, a finding of the retired benchmarks/forward_programs.py),
the scan's modelled work and the rate it achieved in the backward next to a large matrix
product's GFLOP/s measured in the same run, what each method ran (``Auto()``'s pick, after the
memory guard), XLA's peak temporary memory of each compiled gradient, and the minor page faults per
gradient call (counted over a few calls after the timed rounds: glibc maps the temporary buffers of
some calls anew, depending on the process's allocation history; its ``MALLOC_*`` environment
variables change that, and the times with it). For the cells with structured Jacobians, the two
parts of a parallel backward are timed alone in the same rounds (:mod:`benchmarks._speed_model`):
the chain (the sequential scan of ``T`` dependent steps) and the steps' VJP w.r.t. the parameters
over ``Auto()``'s blocks; against their sum, a method's backward shows what it adds to its parts,
and BP's backward over the sum is the speedup such a backward reaches when its parts cost what they
cost alone. The HLO count of every backward program (kernels in sequence, flops, bytes) and its
time on the CPU profile stand beside its measured time.

The programs are compiled once per configuration, ahead of time (names whose method runs the
same backward share one compilation and one measurement). A method whose memory estimate exceeds
the device's memory (``bppsa.MemoryLimitError``, raised when it is traced) is recorded as skipped
with the reason; any other exception is recorded in its method or its row, and the run goes on.
The JSON is rewritten atomically around every row (the row being measured is there as
``"unfinished"``), so a time-out or a crash keeps what was measured; ``--resume`` keeps an
earlier run's rows (those with ``"backward": "pullback"``) and measures the rest. ``--dry-run``
runs the same grids with tiny sizes, in seconds, anywhere.

Run: ``.venv/bin/python -m benchmarks.speed --quick`` (a few minutes on 2 cores) or without
``--quick`` for the full grids; ``benchmarks/gpu.sh`` on a GPU. Results: JSON (``--out``) and a
printed table.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import bppsa
from benchmarks import _speed_model
from benchmarks._speed_cli import (  # noqa: F401 (re-exported: the benchmark's interface)
    DRY_RUN,
    FULL_B,
    FULL_T,
    MESSAGE_CHARS,
    MIN_ROUNDS,
    QUICK_B,
    QUICK_T,
    SWEEPS,
    UNFINISHED,
    Config,
    parse_method,
    plan,
    previous_run,
    write_atomically,
)
from benchmarks._speed_cli import parse_args as _parse_args
from benchmarks._speed_rows import empty_row, print_row
from bppsa.models import GRU, RNN
from bppsa.scan import default_chunks
from experiments import timing
from paper_figures.result_files import PULLBACK
from paper_figures.result_files import methods as method_names

CELLS = {"rnn": RNN(), "gru": GRU()}
BP = method_names.BP  # the baseline, jax.grad through a batched lax.scan: always measured
STANDALONE = "standalone_forward"  # BP's loss alone, jitted: not the forward of a gradient
CHAIN = "chain"  # the sequential scan over the cell's Jacobians (see benchmarks._speed_model)
PARTS = "parts"  # the steps' VJP w.r.t. the parameters, over blocks (see benchmarks._speed_model)
FAULT_CALLS = 3  # gradient calls whose minor page faults are counted, after the timed rounds


def problem(cell, length, batch, hidden, seed=0):
    k_params, k_head, k_bits = jax.random.split(jax.random.key(seed), 3)
    params = cell.init(1, hidden, key=k_params)
    head = jax.random.normal(k_head, (hidden,)) / math.sqrt(hidden)
    xs = (jax.random.uniform(k_bits, (batch, length, 1)) < 0.3).astype(jnp.float32)
    return params, head, xs


def losses(cell, hidden, method=None, memory_limit=None):
    """``(batched, per_example)``, two losses ``(params, head, xs) -> scalar`` of the same value:
    the baseline's one ``lax.scan`` over a batched state, and the intended BPPSA usage, a
    ``bppsa.scan`` over one example ``jax.vmap``-ed over the batch, whose backward runs
    ``method`` within ``memory_limit`` (bound here: a gradient's programs are traced apart)."""

    def batched(params, head, xs):
        state = jax.vmap(lambda _: cell.initial_state(hidden))(xs)
        state, _ = jax.lax.scan(
            lambda s, x: (cell(params, s, x), None), state, jnp.swapaxes(xs, 0, 1)
        )
        return jnp.sum(cell.output(state) @ head)

    def per_example(params, head, xs):
        def one(x):
            state, _ = bppsa.scan(
                lambda s, x_t: (cell(params, s, x_t), None),
                cell.initial_state(hidden),
                x,
                method=method,
                memory_limit=memory_limit,
            )
            return cell.output(state) @ head

        return jnp.sum(jax.vmap(one)(xs))

    return batched, per_example


def scan_work(method: bppsa.Method, length: int, batch: int, hidden: int) -> float:
    """Modelled floating-point operations of the scan alone (2 per multiply-add) of the
    concrete method that runs."""
    matvec = 2 * length * batch * hidden**2
    if isinstance(method, bppsa.Blocked):  # the inner method over blocks of ``block`` steps
        block = min(method.block, length)
        return scan_work(method.method, block, batch, hidden) * length / block
    if isinstance(method, bppsa.Blelloch):
        return 2 * length * batch * hidden**3 + 2 * matvec
    if isinstance(method, bppsa.Chunked):
        chunks = method.chunks or default_chunks(length)
        if chunks <= 1:
            return matvec
        per_chunk = math.ceil(length / chunks)
        return 2 * (length - per_chunk) * batch * hidden**2 * (hidden + 1) + 2 * matvec
    return matvec


def gemm_rate(size: int, repeats: int = 5, precision: str | None = "highest") -> float | None:
    """GFLOP/s of a ``size x size`` float32 matrix product (``None`` if it fails), at
    ``precision``: ``"highest"``, the library's own products' (on recent NVIDIA GPUs the float32
    units), or ``None``, JAX's default (TF32 there)."""
    try:
        a = jnp.ones((size, size), jnp.float32)
        product = functools.partial(jax.jit(lambda a: jnp.matmul(a, a, precision=precision)), a)
        seconds = timing.interleaved({"gemm": product}, repeats)["gemm"]
        return 2 * size**3 / statistics.median(seconds) / 1e9
    except Exception:  # a reference figure: no reason to lose the run
        return None


def peak_bytes(compiled) -> int | None:
    try:
        analysis = compiled.memory_analysis()
        return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
    except Exception:  # memory analysis is not available on every backend
        return None


def minor_faults() -> int:
    """This process's minor page faults so far. A call whose temporary buffer the allocator
    maps anew (glibc does for blocks above its mmap threshold, 128 KB rising to at most 32 MB)
    faults in every page of it, which costs a few milliseconds per 10 MB: the rows record the
    median per call, since it moves times between processes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_per_call(call, calls: int = FAULT_CALLS) -> float:
    """The median of the minor page faults of ``calls`` calls of ``call``, each waited for."""
    counts = []
    for _ in range(calls):
        before = minor_faults()
        jax.block_until_ready(call())
        counts.append(minor_faults() - before)
    return statistics.median(counts)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:MESSAGE_CHARS]


def measure(
    config: Config,
    methods,
    repeats,
    *,
    seconds=None,
    memory_limit=None,
    gemm_gflops=None,
    clock=time.perf_counter,
) -> dict:
    """Times one configuration; failures are recorded in the row, never raised.

    Args:
        config: what to measure.
        methods: ``{name: bppsa.Method}``.
        repeats: timed rounds at most.
        seconds: stop the rounds when the next would end past this many seconds (after
            ``MIN_ROUNDS``); ``None``: no budget.
        memory_limit: the scans' (``None``: the device's available memory).
        gemm_gflops: the large matrix product's rate measured in this run (for the floors).
        clock: the clock of the timed rounds (:func:`experiments.timing.interleaved`); a test passes
            a fake one.
    """
    row, start = empty_row(config, methods), time.perf_counter()
    try:
        _measure(row, config, methods, repeats, seconds, memory_limit, gemm_gflops, clock)
    except Exception as error:  # the baseline itself failed: nothing of this row is usable
        row.update(status="error", error=describe(error))
    row["seconds"] = time.perf_counter() - start
    return row


def _compiled(fn, args, compile_s, name):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s[name] = time.perf_counter() - start
    return compiled


def _ran(loss, args) -> bppsa.Method | None:
    """The concrete method the backward of ``loss`` runs (traced, not compiled)."""
    with bppsa.trace_plans() as plans:
        jax.eval_shape(jax.value_and_grad(loss), *args)
    backwards = [plan.backward or plan.method for plan in plans]
    return backwards[-1] if backwards else None


def _checked(programs: timing.GradientPrograms) -> timing.GradientPrograms:
    """``programs``, after one call of each (the forward ran when they were built): a program
    that fails to run is a method's error, not the row's."""
    for call in programs.calls().values():
        jax.block_until_ready(call())
    return programs


def _measure(row, config, methods, repeats, seconds, memory_limit, gemm_gflops, clock):
    cell = CELLS[config.cell]
    args = problem(cell, config.length, config.batch, config.hidden)
    batched, _ = losses(cell, config.hidden)
    compile_s = row["compile_s"]
    programs = {BP: _checked(timing.GradientPrograms.from_loss(batched, *args))}
    compile_s[BP] = dict(programs[BP].compile_seconds)
    standalone = _compiled(batched, args, compile_s, STANDALONE)
    others = {STANDALONE: functools.partial(standalone, *args)}
    chain = _speed_model.chain(config.cell, config.length, config.batch, config.hidden)
    fp = _speed_model.footprint(config.cell, config.length, config.batch, config.hidden)
    if chain is not None:  # the sequential part no T-step method avoids: the floors' step time
        others[CHAIN] = functools.partial(chain[0], *chain[1])
        parallel = bppsa.Auto().scan_method(fp, profile=bppsa.get_profile(), jacobians=True)
        row["parts_block"] = getattr(parallel, "block", config.length)
        parts, parts_args = _speed_model.parts(
            cell, config.length, config.batch, config.hidden, row["parts_block"]
        )
        others[PARTS] = functools.partial(parts, *parts_args)
    by_runs, runs_of, timed_as = {}, {}, {}  # by the method that runs; what each name runs
    for name, method in methods.items():
        entry = row["methods"][name]
        try:
            _, loss = losses(cell, config.hidden, method, memory_limit)
            runs = _ran(loss, args) or method
            if runs not in by_runs:
                programs[name] = _checked(timing.GradientPrograms.from_loss(loss, *args))
                by_runs[runs] = name
            timed_as[name], runs_of[name] = by_runs[runs], runs
            compile_s[name] = dict(programs[timed_as[name]].compile_seconds)
            entry.update(runs=repr(runs), peak_bytes=peak_bytes(programs[timed_as[name]].total))
        except bppsa.MemoryLimitError as error:
            entry.update(status="skipped", error=describe(error))
        except Exception as error:
            entry.update(status="error", error=describe(error))

    times = timing.time_gradients(
        programs, repeats, others=others, seconds=seconds, min_rounds=MIN_ROUNDS, clock=clock
    )
    row["rounds"] = len(times[BP]["total"])
    row.update({f"bp_{key}": value for key, value in timing.ms_fields(times[BP]).items()})
    row.update(timing.ms_fields(times[STANDALONE]))
    row["bp_backward_kernel_ms"] = programs[BP].backward_kernel_ms()
    row["bp_peak_bytes"] = peak_bytes(programs[BP].total)
    row["bp_page_faults"] = faults_per_call(programs[BP].calls()["total"])
    step_s = None
    if CHAIN in times:
        for name in (CHAIN, PARTS):
            row.update(timing.ms_fields(times[name]))
        row["parts_sum_ms"] = row["chain_ms"] + row["parts_ms"]
        row["parts_sum_min_ms"] = row["chain_min_ms"] + row["parts_min_ms"]
        row["bp_over_parts"] = row["bp_backward_ms"] / row["parts_sum_ms"]
        step_s = statistics.median(times[CHAIN][CHAIN]) / max(config.length, 1)
    gemm = None if gemm_gflops is None else 1e9 * gemm_gflops

    def floor_ms(method):
        if step_s is None:
            return None
        seconds = _speed_model.floor_seconds(method.cost(fp), step_s, gemm)
        return None if seconds is None else 1e3 * seconds

    def model_ms(count):
        seconds = _speed_model.model_seconds(count, bppsa.get_profile("cpu"))
        return None if seconds is None else 1e3 * seconds

    row["bp_floor_ms"] = floor_ms(bppsa.Sequential())
    row["bp_hlo_backward"] = _speed_model.backward_count(programs[BP].backward)
    row["bp_model_ms"] = model_ms(row["bp_hlo_backward"])
    measured = {}  # the cross-checks and counts of each program measured, shared by its names
    for name in methods:
        if name not in timed_as:
            continue
        timed = timed_as[name]
        if timed not in measured:
            measured[timed] = dict(
                **timing.ms_fields(times[timed]),
                backward_kernel_ms=programs[timed].backward_kernel_ms(),
                hlo_backward=_speed_model.backward_count(programs[timed].backward),
                page_faults=faults_per_call(programs[timed].calls()["total"]),
            )
        fields = measured[timed]
        work = scan_work(runs_of[name], config.length, config.batch, config.hidden)
        backward_s = fields["backward_ms"] / 1e3
        row["methods"][name].update(
            **fields,
            backward_speedup=_ratio(row["bp_backward_ms"], fields["backward_ms"]),
            overall_speedup=_ratio(row["bp_total_ms"], fields["total_ms"]),
            scan_gflop=work / 1e9,
            achieved_gflops=work / backward_s / 1e9 if backward_s > 0 else None,
            floor_ms=floor_ms(runs_of[name]),
            model_ms=model_ms(fields["hlo_backward"]),
        )


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _versions(device) -> dict:
    def get(fn):
        try:
            return fn()
        except Exception:  # what is not available here is left out, never fatal
            return None

    plugins = get(
        lambda: sorted(
            f"{d.metadata['Name']} {d.version}"
            for d in importlib.metadata.distributions()
            if (d.metadata["Name"] or "").lower().replace("_", "-").startswith("jax-cuda")
        )
    )
    return dict(
        jax=jax.__version__,
        jaxlib=get(lambda: importlib.metadata.version("jaxlib")),
        jax_plugins=plugins,
        platform_version=get(lambda: device.client.platform_version),
        python=platform.python_version(),
        matmul_precision=get(lambda: jax.config.jax_default_matmul_precision),
    )


def parse_args(argv) -> argparse.Namespace:
    """The options, checked, with the grids filled in (see :mod:`benchmarks._speed_cli`)."""
    return _parse_args(argv, __doc__.split("\n\n")[0])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    backend = jax.default_backend()
    if args.require_backend and not args.dry_run and backend != args.require_backend:
        sys.exit(
            f"benchmarks.speed: this run needs JAX's {args.require_backend!r} backend, but the "
            f"default backend is {backend!r} (devices: {jax.devices()}). It needs a JAX build "
            "for that backend and a visible device; --dry-run checks the command without one."
        )
    started = time.perf_counter()
    methods = {name: parse_method(name) for name in args.methods}
    configs = plan(args)
    done, attempts = previous_run(args.out) if args.resume else ({}, 0)
    device = jax.devices()[0]
    gemm = 256 if args.dry_run else 2048 if backend == "cpu" else 8192
    payload = dict(
        device=getattr(device, "device_kind", device.platform),
        platform=device.platform,
        backend=backend,
        device_count=jax.device_count(),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        **_versions(device),
        bppsa=bppsa.__version__,
        command=shlex.join(["python3", "-m", "benchmarks.speed", *argv]),
        argv=argv,
        dry_run=args.dry_run,
        attempts=attempts + 1,
        backward=PULLBACK,
        repeats=args.repeats,
        row_seconds=args.row_seconds,
        memory_limit=args.memory_limit,
        methods=list(methods),
        gemm_size=gemm,
        gemm_gflops=gemm_rate(gemm),  # at the library's precision: the floors' and the fit's
        gemm_default_gflops=gemm_rate(gemm, precision=None),
        complete=False,
        elapsed_s=None,
        **{sweep: [] for sweep in SWEEPS},
    )
    print(
        f"{payload['device']} ({backend}, {payload['cpus']} cpus, JAX {payload['jax']}), "
        f"large GEMM {payload['gemm_gflops'] or 0:.1f} GFLOP/s, {len(configs)} rows",
        flush=True,
    )
    rows = dict(done)
    for config in configs:
        rows_of_sweep = payload[config.sweep]
        if config.key not in rows:
            rows_of_sweep.append(empty_row(config, methods, "unfinished", UNFINISHED))
            write_atomically(args.out, payload)
            budget = dict(seconds=args.row_seconds, memory_limit=args.memory_limit)
            rows[config.key] = measure(
                config, methods, args.repeats, gemm_gflops=payload["gemm_gflops"], **budget
            )
            rows_of_sweep.pop()
            print_row(rows[config.key])
        rows_of_sweep.append(rows[config.key])
        payload["elapsed_s"] = time.perf_counter() - started
        write_atomically(args.out, payload)
    payload["complete"] = True
    write_atomically(args.out, payload)


if __name__ == "__main__":
    main()
