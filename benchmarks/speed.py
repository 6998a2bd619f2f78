"""Speed of BPPSA's backward pass against back-propagation (jax.grad through lax.scan).

For the paper's classifiers (input 1, hidden H, linear head on the last state), over a T sweep at
B = 16, a B sweep at T = 1000 and, with ``--hiddens``, an H sweep, times in ONE process,
interleaved (every variant once per round, so that load on a shared machine hits all alike),
medians after a warm-up call:

* forward only (the loss through a batched ``lax.scan``);
* BP: ``jax.grad`` of that loss;
* BPPSA: ``bppsa.grad`` of the same loss written the intended way (a ``bppsa.scan`` over one
  example, ``jax.vmap``-ed over the batch) with each method.

Backward time = total - forward (as in the paper); speedups are BP over BPPSA. Also reported:
the scan's modelled work and achieved GFLOP/s next to a large matrix product's GFLOP/s measured
in the same run, what each method ran (``Auto()``'s pick, after the memory guard), XLA's
peak temporary memory of each compiled gradient, and the minor page faults per call (glibc
maps the temporary buffers of some calls anew, depending on the process's allocation history;
its ``MALLOC_*`` environment variables change that, and the times with it). For the cells
with structured Jacobians, the two parts of a parallel backward are timed alone in the same
rounds (:mod:`benchmarks._speed_model`): the chain (the sequential scan of ``T`` dependent steps)
and the steps' VJP w.r.t. the parameters over ``Auto()``'s blocks; against their sum, a
method's backward shows what it adds to its parts, and BP's backward over the sum is the
speedup such a backward reaches when its parts cost what they cost alone.

Each function is compiled once per configuration, ahead of time (names whose method runs the
same backward share one compilation). A method whose memory estimate exceeds the device's memory
(``bppsa.MemoryLimitError``, raised when it is traced) is recorded as skipped with the reason;
any other exception is recorded in its method or its row, and the run goes on. The JSON is
rewritten atomically around every row (the row being measured is there as ``"unfinished"``), so
a time-out or a crash keeps what was measured; ``--resume`` keeps an earlier run's rows and
measures the rest. ``--dry-run`` runs the same grids with tiny sizes, in seconds, anywhere.

Run: ``.venv/bin/python -m benchmarks.speed --quick`` (a few minutes on 2 cores) or without
``--quick`` for the full grids; ``benchmarks/gpu.sh`` on a GPU. Results: JSON (``--out``) and a
printed table.
"""

from __future__ import annotations

import argparse
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
from bppsa.models import GRU, RNN
from bppsa.scan import default_chunks
from results_io import methods as method_names

CELLS = {"rnn": RNN(), "gru": GRU()}
BP = method_names.BP  # the baseline, jax.grad through a batched lax.scan: always measured
CHAIN = "chain"  # the sequential scan over the cell's Jacobians (see benchmarks._speed_model)
PARTS = "parts"  # the steps' VJP w.r.t. the parameters, over blocks (see benchmarks._speed_model)


def problem(cell, length, batch, hidden, seed=0):
    k_params, k_head, k_bits = jax.random.split(jax.random.key(seed), 3)
    params = cell.init(1, hidden, key=k_params)
    head = jax.random.normal(k_head, (hidden,)) / math.sqrt(hidden)
    xs = (jax.random.uniform(k_bits, (batch, length, 1)) < 0.3).astype(jnp.float32)
    return params, head, xs


def losses(cell, hidden):
    def batched(params, head, xs):  # the baseline: one lax.scan over a batched state
        state = jax.vmap(lambda _: cell.initial_state(hidden))(xs)
        state, _ = jax.lax.scan(
            lambda s, x: (cell(params, s, x), None), state, jnp.swapaxes(xs, 0, 1)
        )
        return jnp.sum(cell.output(state) @ head)

    def per_example(params, head, xs):  # the intended BPPSA usage: vmap a one-example scan
        def one(x):
            state, _ = bppsa.scan(
                lambda s, x_t: (cell(params, s, x_t), None), cell.initial_state(hidden), x
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


def gemm_rate(size: int, repeats: int = 5) -> float | None:
    """GFLOP/s of a ``size x size`` float32 matrix product (``None`` if it fails)."""
    try:
        return _gemm_rate(size, repeats)
    except Exception:  # a reference figure: no reason to lose the run
        return None


def _gemm_rate(size: int, repeats: int) -> float:
    a = jnp.ones((size, size), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(a))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(a))
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


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


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:MESSAGE_CHARS]


def empty_row(config: Config, methods, status: str = "ok", error: str | None = None) -> dict:
    """A row with every key (``None`` where nothing was measured)."""
    blank = dict(total_ms=None, backward_ms=None, backward_speedup=None, overall_speedup=None)
    blank.update(runs=None, scan_gflop=None, achieved_gflops=None, peak_bytes=None)
    blank.update(total_min_ms=None, backward_min_ms=None, floor_ms=None, model_ms=None)
    blank.update(hlo_backward=None, page_faults=None)
    return dict(
        cell=config.cell,
        length=config.length,
        batch=config.batch,
        hidden=config.hidden,
        status=status,
        error=error,
        seconds=None,
        rounds=0,
        forward_ms=None,
        forward_min_ms=None,
        bp_total_ms=None,
        bp_total_min_ms=None,
        bp_backward_ms=None,
        bp_backward_min_ms=None,
        bp_floor_ms=None,
        bp_model_ms=None,
        bp_hlo_backward=None,
        chain_ms=None,
        chain_min_ms=None,
        parts_ms=None,
        parts_min_ms=None,
        parts_block=None,
        parts_sum_ms=None,
        parts_sum_min_ms=None,
        bp_over_parts=None,
        bp_peak_bytes=None,
        bp_page_faults=None,
        compile_s={},
        methods={name: dict(status=status, error=error, **blank) for name in methods},
    )


def measure(
    config: Config, methods, repeats, *, seconds=None, memory_limit=None, gemm_gflops=None
) -> dict:
    """Times one configuration; failures are recorded in the row, never raised.

    Args:
        config: what to measure.
        methods: ``{name: bppsa.Method}``.
        repeats: timed rounds at most.
        seconds: stop the rounds when the next would end past this many seconds (after
            ``MIN_ROUNDS``); ``None``: no budget.
        memory_limit: ``bppsa.grad``'s (``None``: the device's available memory).
        gemm_gflops: the large matrix product's rate measured in this run (for the floors).
    """
    row, start = empty_row(config, methods), time.perf_counter()
    try:
        _measure(row, config, methods, repeats, seconds, memory_limit, gemm_gflops)
    except Exception as error:  # the baseline itself failed: nothing of this row is usable
        row.update(status="error", error=describe(error))
    row["seconds"] = time.perf_counter() - start
    return row


def _measure(row, config, methods, repeats, seconds, memory_limit, gemm_gflops):
    cell = CELLS[config.cell]
    args = problem(cell, config.length, config.batch, config.hidden)
    args_of = {}
    batched, per_example = losses(cell, config.hidden)

    def compile_(fn, name):
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        row["compile_s"][name] = time.perf_counter() - start
        return compiled

    fns = {"forward": compile_(batched, "forward"), BP: compile_(jax.grad(batched), BP)}
    chain = _speed_model.chain(config.cell, config.length, config.batch, config.hidden)
    fp = _speed_model.footprint(config.cell, config.length, config.batch, config.hidden)
    if chain is not None:  # the sequential part no T-step method avoids: the floors' step time
        fns[CHAIN], args_of[CHAIN] = chain
        parallel = bppsa.Auto().for_footprint(fp, parallel=True)
        row["parts_block"] = getattr(parallel, "block", config.length)
        fns[PARTS], args_of[PARTS] = _speed_model.parts(
            cell, config.length, config.batch, config.hidden, row["parts_block"]
        )
    by_runs, runs_of = {}, {}  # compilations by the method that runs; what each name runs
    for name, method in methods.items():
        entry = row["methods"][name]
        try:
            start = time.perf_counter()
            with bppsa.trace_plans() as plans:
                fn = bppsa.grad(per_example, method=method, memory_limit=memory_limit)
                lowered = jax.jit(fn).lower(*args)
            runs = (plans[-1].backward or plans[-1].method) if plans else method
            if runs not in by_runs:
                by_runs[runs] = lowered.compile()
            fns[name], runs_of[name] = by_runs[runs], runs
            row["compile_s"][name] = time.perf_counter() - start
            entry.update(runs=repr(runs), peak_bytes=peak_bytes(fns[name]))
        except bppsa.MemoryLimitError as error:
            entry.update(status="skipped", error=describe(error))
        except Exception as error:
            entry.update(status="error", error=describe(error))

    faults = {name: [] for name in fns}

    def call(name):  # seconds of one call; a method that fails is recorded and dropped
        faults_before, start = minor_faults(), time.perf_counter()
        try:
            jax.block_until_ready(fns[name](*args_of.get(name, args)))
        except Exception as error:
            if name in ("forward", BP, CHAIN, PARTS):
                raise
            row["methods"][name].update(status="error", error=describe(error))
            del fns[name]
            return None
        elapsed = time.perf_counter() - start
        faults[name].append(minor_faults() - faults_before)
        return elapsed

    for name in list(fns):  # warm-up
        call(name)
    for counts in faults.values():
        counts.clear()
    times = {name: [] for name in fns}
    started = time.perf_counter()
    for rounds in range(1, repeats + 1):
        for name in list(fns):
            if (elapsed := call(name)) is not None:
                times[name].append(elapsed)
        row["rounds"] = rounds
        spent = time.perf_counter() - started
        if seconds is not None and rounds >= MIN_ROUNDS and spent * (rounds + 1) / rounds > seconds:
            break
    forward, bp = (statistics.median(times[name]) for name in ("forward", BP))
    forward_min, bp_min = (min(times[name]) for name in ("forward", BP))
    row.update(forward_ms=1e3 * forward, bp_total_ms=1e3 * bp, bp_backward_ms=1e3 * (bp - forward))
    row.update(forward_min_ms=1e3 * forward_min, bp_total_min_ms=1e3 * bp_min)
    row["bp_backward_min_ms"] = 1e3 * (bp_min - forward_min)
    row["bp_peak_bytes"] = peak_bytes(fns[BP])
    row["bp_page_faults"] = statistics.median(faults[BP])
    step_s = None
    if CHAIN in times:
        for name in (CHAIN, PARTS):
            row[f"{name}_ms"] = 1e3 * statistics.median(times[name])
            row[f"{name}_min_ms"] = 1e3 * min(times[name])
        row["parts_sum_ms"] = row["chain_ms"] + row["parts_ms"]
        row["parts_sum_min_ms"] = row["chain_min_ms"] + row["parts_min_ms"]
        row["bp_over_parts"] = row["bp_backward_ms"] / row["parts_sum_ms"]
        step_s = statistics.median(times[CHAIN]) / max(config.length, 1)
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
    row["bp_hlo_backward"] = _speed_model.backward_count(fns[BP], fns["forward"])
    row["bp_model_ms"] = model_ms(row["bp_hlo_backward"])
    for name in methods:
        if name not in fns:
            continue
        total, total_min = statistics.median(times[name]), min(times[name])
        backward = total - forward  # as measured: may sit inside the spread, even below 0
        clear = resolved(times[name], times["forward"])
        both = clear and resolved(times[BP], times["forward"])
        work = scan_work(runs_of[name], config.length, config.batch, config.hidden)
        count = _speed_model.backward_count(fns[name], fns["forward"])
        row["methods"][name].update(
            total_ms=1e3 * total,
            total_min_ms=1e3 * total_min,
            backward_ms=1e3 * backward,
            backward_min_ms=1e3 * (total_min - forward_min),
            backward_resolved=clear,
            backward_speedup=(bp - forward) / backward if both else None,
            overall_speedup=bp / total,
            scan_gflop=work / 1e9,
            achieved_gflops=work / backward / 1e9 if clear else None,
            floor_ms=floor_ms(runs_of[name]),
            hlo_backward=count,
            model_ms=model_ms(count),
            page_faults=statistics.median(faults[name]),
        )


def resolved(totals: list[float], forwards: list[float]) -> bool:
    """Whether ``total - forward`` stands clear of the timings' spread: the lower quartile of
    the totals above the upper quartile of the forwards (else it is recorded, not divided by)."""
    if len(totals) < 2 or len(forwards) < 2:
        return min(totals) > max(forwards)
    low = statistics.quantiles(totals, n=4, method="inclusive")[0]
    return low > statistics.quantiles(forwards, n=4, method="inclusive")[2]


def _speedup(ratio: float | None) -> str:
    return "x  n/r" if ratio is None else f"x{ratio:5.2f}"


def print_row(row):
    """One line: medians (minimum) of the backward, speedup over BP, and the model's floor."""
    head = f"{row['cell']:<4} T={row['length']:<7} B={row['batch']:<4} H={row['hidden']:<5}"
    if row["status"] != "ok":
        print(f"{head} {row['status']}: {row['error'][:300]}", flush=True)
        return
    head += (
        f"fwd {row['forward_ms']:8.2f}  BP bwd {row['bp_backward_ms']:8.2f} "
        f"({row['bp_backward_min_ms']:.2f}) ms{_floor(row['bp_floor_ms'])}"
    )
    if row["parts_sum_ms"] is not None:
        head += (
            f" chain {row['chain_ms']:.2f} + parts {row['parts_ms']:.2f} ="
            f" {row['parts_sum_ms']:.2f} ms (BP over it x{row['bp_over_parts']:.2f})"
        )
    parts = []
    for name, m in row["methods"].items():
        if m["status"] != "ok":
            parts.append(f"{name}: {m['status']} ({m['error'][:80]})")
            continue
        runs = f" [{m['runs']}]" if name == method_names.AUTO else ""
        parts.append(
            f"{name}: bwd {m['backward_ms']:7.2f} ({m['backward_min_ms']:.2f}) ms "
            f"{_speedup(m['backward_speedup'])}{_floor(m['floor_ms'])}{runs}"
        )
    print(head + "  |  " + "  |  ".join(parts), flush=True)


def _floor(floor_ms):
    return "" if floor_ms is None else f" floor {floor_ms:.2f}"


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
        repeats=args.repeats,
        row_seconds=args.row_seconds,
        memory_limit=args.memory_limit,
        methods=list(methods),
        gemm_size=gemm,
        gemm_gflops=gemm_rate(gemm),
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
