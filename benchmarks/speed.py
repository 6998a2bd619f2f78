"""Speed of BPPSA's backward pass against back-propagation (jax.grad through lax.scan).

For the paper's classifiers (input 1, hidden H, linear head on the last state), over a T sweep at
B = 16 and a B sweep at T = 1000, times in ONE process, interleaved (every variant once per
round, so that load on a shared machine hits all alike), medians after warm-up:

* forward only (the loss through a batched ``lax.scan``);
* BP: ``jax.grad`` of that loss;
* BPPSA: ``bppsa.grad`` of the same loss written the intended way (a ``bppsa.scan`` over one
  example, ``jax.vmap``-ed over the batch) with each method.

Backward time = total - forward (as in the paper); speedups are BP over BPPSA. Also reported:
the scan's modelled work and achieved GFLOP/s next to a large matrix product's GFLOP/s measured
in the same run, and XLA's peak temporary memory of each compiled gradient.

Run: ``.venv/bin/python -m benchmarks.speed --quick`` (a few minutes on 2 cores) or without
``--quick`` for the full grids. Results: JSON (``--out``) and a printed table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, RNN
from bppsa.scan import Auto, default_chunks, resolve

CELLS = {"rnn": RNN(), "gru": GRU()}
# Floats of one step's transposed Jacobian as the library stores it (what Auto() weighs): the
# RNN's W^T diag(d) keeps d, the GRU's keeps three gate scales and diag(z).
JACOBIAN_FLOATS = {"rnn": 1, "gru": 4}


def auto_choice(cell_name: str, length: int, batch: int, hidden: int) -> bppsa.Method:
    """The method ``bppsa.Auto()`` runs for this configuration on the default backend."""
    element = JACOBIAN_FLOATS[cell_name] * hidden
    return Auto().choose(length, hidden, batch=batch, element=element)


FULL_T = [10, 30, 100, 300, 1000, 3000, 10000, 30000]
FULL_B = [1, 2, 4, 8, 16, 32, 64, 128, 256]
QUICK_T = [100, 1000, 10000]
QUICK_B = [1, 16, 128]


def parse_method(name: str) -> bppsa.Method:
    """``blelloch``, ``auto``, ``sequential-jacobians``, ``chunked``, ``chunked-C`` or
    ``chunked-C-bK`` (C chunks in time blocks of K steps)."""
    if name.startswith("chunked-"):
        parts = name.split("-")[1:]
        method = bppsa.Chunked(int(parts[0]))
        return bppsa.Blocked(method, int(parts[1][1:])) if len(parts) > 1 else method
    if name == "sequential-jacobians":
        return bppsa.Sequential(jacobians=True)
    return resolve(name)


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
    """Modelled floating-point operations of the scan alone (2 per multiply-add); for
    ``Auto()``, pass the method it chooses."""
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


def gemm_rate(size=2048, repeats=5) -> float:
    a = jnp.ones((size, size), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(a))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(a))
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def peak_bytes(fn, *args) -> int | None:
    try:
        analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
    except Exception:  # memory analysis is not available on every backend
        return None


def measure(cell_name, length, batch, hidden, methods, repeats):
    cell = CELLS[cell_name]
    params, head, xs = problem(cell, length, batch, hidden)
    batched, per_example = losses(cell, hidden)
    fns = {"forward": jax.jit(batched), "bp": jax.jit(jax.grad(batched))}
    for name, method in methods.items():
        fns[name] = jax.jit(bppsa.grad(per_example, method=method))
    for fn in fns.values():  # compile and warm up
        jax.block_until_ready(fn(params, head, xs))
        jax.block_until_ready(fn(params, head, xs))
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, head, xs))
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    forward, bp = median["forward"], median["bp"]
    row = dict(
        cell=cell_name,
        length=length,
        batch=batch,
        hidden=hidden,
        forward_ms=1e3 * forward,
        bp_total_ms=1e3 * bp,
        bp_backward_ms=1e3 * (bp - forward),
        bp_peak_bytes=peak_bytes(jax.grad(batched), params, head, xs),
        methods={},
    )
    for name, method in methods.items():
        total = median[name]
        runs = auto_choice(cell_name, length, batch, hidden) if isinstance(method, Auto) else method
        backward = max(total - forward, 1e-9)
        row["methods"][name] = dict(
            total_ms=1e3 * total,
            backward_ms=1e3 * backward,
            backward_speedup=(bp - forward) / backward,
            overall_speedup=bp / total,
            runs=repr(runs),
            scan_gflop=scan_work(runs, length, batch, hidden) / 1e9,
            achieved_gflops=scan_work(runs, length, batch, hidden) / backward / 1e9,
            peak_bytes=peak_bytes(bppsa.grad(per_example, method=method), params, head, xs),
        )
    return row


def print_row(row):
    head = (
        f"{row['cell']:<4} T={row['length']:<6} B={row['batch']:<4} "
        f"fwd {row['forward_ms']:8.2f}  BP bwd {row['bp_backward_ms']:8.2f} ms"
    )
    parts = [
        f"{name}: bwd {m['backward_ms']:7.2f} ms x{m['backward_speedup']:5.2f} "
        f"(overall x{m['overall_speedup']:4.2f})" + (f" [{m['runs']}]" if name == "auto" else "")
        for name, m in row["methods"].items()
    ]
    print(head + "  |  " + "  |  ".join(parts), flush=True)


def write_atomically(path: pathlib.Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small grids (a few minutes)")
    parser.add_argument("--cells", nargs="+", default=["rnn", "gru"], choices=list(CELLS))
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--methods", nargs="+", default=["auto", "blelloch", "chunked"])
    parser.add_argument(
        "--lengths", type=int, nargs="*", help="T sweep (at --t-batch); empty: no T sweep"
    )
    parser.add_argument(
        "--batches", type=int, nargs="*", help="B sweep (at --b-length); empty: no B sweep"
    )
    parser.add_argument("--t-batch", type=int, default=16, help="B of the T sweep (16)")
    parser.add_argument("--b-length", type=int, default=1000, help="T of the B sweep (1000)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/speed.json"))
    args = parser.parse_args(argv)
    methods = {name: parse_method(name) for name in args.methods}
    for name in ("hidden", "repeats", "t_batch", "b_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    lengths = args.lengths if args.lengths is not None else (QUICK_T if args.quick else FULL_T)
    batches = args.batches if args.batches is not None else (QUICK_B if args.quick else FULL_B)
    if any(n < 1 for n in [*lengths, *batches]):
        parser.error("--lengths and --batches take positive ints")
    device = jax.devices()[0]
    payload = dict(
        device=getattr(device, "device_kind", device.platform),
        platform=device.platform,
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        jax=jax.__version__,
        bppsa=bppsa.__version__,
        repeats=args.repeats,
        gemm_gflops=gemm_rate(),
        t_sweep=[],
        b_sweep=[],
    )
    print(
        f"{payload['device']} ({payload['cpus']} cpus), "
        f"large GEMM {payload['gemm_gflops']:.1f} GFLOP/s"
    )
    for cell in args.cells:
        for length in lengths:
            row = measure(cell, length, args.t_batch, args.hidden, methods, args.repeats)
            payload["t_sweep"].append(row)
            print_row(row)
            write_atomically(args.out, payload)
        for batch in batches:
            row = measure(cell, args.b_length, batch, args.hidden, methods, args.repeats)
            payload["b_sweep"].append(row)
            print_row(row)
            write_atomically(args.out, payload)


if __name__ == "__main__":
    main()
