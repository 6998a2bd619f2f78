"""``bppsa.Sharded`` on P emulated CPU devices: critical path, exchange volume, memory, time.

For the paper's RNN (input 1, hidden H, linear head on the last state), B sequences vmapped,
T steps, and P in ``--devices`` emulated CPU devices (one subprocess per P, with
``JAX_NUM_CPU_DEVICES=P``), per device:

* the dependent steps on the critical path of the backward (a model from the algorithm:
  back-propagation ``T``; ``Sharded`` with all_gather ``2 L + P`` with ``L = ceil(T / P)``: the
  slice aggregate, the fold over the gathered aggregates, the local sequential scan; with
  ppermute ``2 L + ceil(log2 P) + 1``; on one device ``T``, the local scan alone), plus the
  forward's ``T`` for every method;
* the bytes each device receives in the exchange (from the shapes: an aggregate is
  ``B (n^2 + n)`` floats), and the collectives found in the compiled program;
* the peak memory per device (XLA's compiled memory analysis: temporaries + outputs);
* wall-clock medians and minima over interleaved rounds (:func:`experiments.timing.time_gradients`)
  of the three programs of each gradient (:class:`experiments.timing.GradientPrograms`): the whole
  gradient (``total_ms``, ``jax.value_and_grad``), the forward inside it (``forward_ms``, the
  forward of ``jax.vjp``; ``pipelined``: ``forward=bppsa.Pipelined(mesh)``, device after device)
  and the backward (``backward_ms``, the jitted pullback applied to saved residuals), each its own
  program, never a difference of two (``"backward": "pullback"`` on every row); on a GPU the
  backward's device kernel time too (``backward_kernel_ms``). The P emulated devices share
  this machine's cores (2 here), so wall-clock does NOT show the speedup of P real devices; the
  step counts and volumes do.

Run: ``.venv/bin/python -m benchmarks.sharded`` (P = 1, 2, 4, 8; T = 1k, 10k, 100k; B = 16,
H = 20; a few minutes) or with ``--devices``, ``--lengths``, ... Results: JSON (``--out``),
rows written as they finish, and a printed table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import platform
import subprocess
import sys

from paper_figures.result_files import PULLBACK
from paper_figures.result_files import methods as method_names

ROOT = pathlib.Path(__file__).resolve().parent.parent


def critical_path(method: str, length: int, devices: int) -> int:
    """Dependent steps of the backward (the forward adds ``T`` to every method)."""
    if method == method_names.BP:
        return length
    if devices == 1:  # no aggregate, no exchange: the local scan alone
        return length
    per_device = math.ceil(length / devices)
    if method == "all_gather":
        return 2 * per_device + devices
    return 2 * per_device + math.ceil(math.log2(devices)) + 1


def exchange_bytes(method: str, devices: int, batch: int, hidden: int, itemsize: int = 4) -> int:
    """Bytes one device receives in the exchange of the slice aggregates."""
    aggregate = batch * (hidden * hidden + hidden) * itemsize
    if method == method_names.BP or devices == 1:
        return 0
    if method == "all_gather":
        return (devices - 1) * aggregate
    return math.ceil(math.log2(devices)) * aggregate + batch * hidden * itemsize


def worker(args) -> None:
    """Measures every length on this process's devices; prints one JSON row per length."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    import bppsa
    from bppsa.models import RNN
    from experiments import timing

    devices = len(jax.devices())
    mesh = Mesh(np.array(jax.devices()), ("t",))
    cell, hidden = RNN(), args.hidden
    params = cell.init(1, hidden, key=jax.random.key(0))
    head = jax.random.normal(jax.random.key(1), (hidden,)) / math.sqrt(hidden)

    def batched(params, xs):
        state = jnp.zeros((xs.shape[0], hidden))
        state, _ = jax.lax.scan(
            lambda s, x: (cell(params, s, x), None), state, jnp.swapaxes(xs, 0, 1)
        )
        return jnp.sum(state @ head)

    def per_example(params, xs, scan_options=None):
        def one(x):
            body = lambda s, x_t: (cell(params, s, x_t), None)  # noqa: E731
            state, _ = bppsa.scan(body, jnp.zeros(hidden), x, **(scan_options or {}))
            return state @ head

        return jnp.sum(jax.vmap(one)(xs))

    methods = {
        "all_gather": dict(method=bppsa.Sharded(mesh, "t")),
        "ppermute": dict(method=bppsa.Sharded(mesh, "t", exchange="ppermute")),
        "pipelined": dict(method=bppsa.Sharded(mesh, "t"), forward=bppsa.Pipelined(mesh, "t")),
    }
    for length in args.lengths:
        xs = (jax.random.uniform(jax.random.key(2), (args.batch, length, 1)) < 0.3).astype(
            jnp.float32
        )
        losses = {method_names.BP: batched}
        for name, options in methods.items():
            losses[name] = functools.partial(per_example, scan_options=options)
        programs = {
            name: timing.GradientPrograms.from_loss(loss, params, xs)
            for name, loss in losses.items()
        }
        times = timing.time_gradients(programs, args.repeats)
        row = dict(devices=devices, length=length, batch=args.batch, hidden=hidden, methods={})
        row["backward"] = PULLBACK
        exchange = {
            method_names.BP: method_names.BP,
            "all_gather": "all_gather",
            "ppermute": "ppermute",
        }
        exchange["pipelined"] = "all_gather"
        for name, program in programs.items():
            memory = program.total.memory_analysis()
            hlo = program.total.as_text()
            row["methods"][name] = dict(
                **timing.ms_fields(times[name]),
                backward_kernel_ms=program.backward_kernel_ms(),
                critical_path_backward=critical_path(exchange[name], length, devices),
                critical_path_total=critical_path(exchange[name], length, devices) + length,
                exchange_bytes_received=exchange_bytes(exchange[name], devices, args.batch, hidden),
                peak_bytes_per_device=int(memory.temp_size_in_bytes + memory.output_size_in_bytes),
                collectives={
                    op: hlo.count(f" {op}(") for op in ("all-gather", "collective-permute")
                },
            )
        print(json.dumps(row), flush=True)


def print_row(row) -> None:
    parts = [
        f"{name}: {m['total_ms']:8.1f} ms (fwd {m['forward_ms']:7.1f}, "
        f"bwd {m['backward_ms']:7.1f}), "
        f"path {m['critical_path_backward']:>6}, "
        f"recv {m['exchange_bytes_received'] / 1e3:6.1f} kB, "
        f"peak {m['peak_bytes_per_device'] / 1e6:7.1f} MB"
        for name, m in row["methods"].items()
    ]
    print(f"P={row['devices']} T={row['length']:<6} | " + " | ".join(parts), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/sharded.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("batch", "hidden", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if any(p < 1 for p in args.devices) or any(t < 1 for t in args.lengths):
        parser.error("--devices and --lengths take positive ints")
    if args.worker:
        return worker(args)
    payload = dict(
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        note="emulated CPU devices share the machine's cores: wall-clock is not a speedup",
        backward=PULLBACK,
        rows=[],
    )
    for devices in args.devices:
        command = [sys.executable, "-m", "benchmarks.sharded", "--worker"]
        command += ["--lengths", *map(str, args.lengths), "--batch", str(args.batch)]
        command += ["--hidden", str(args.hidden), "--repeats", str(args.repeats)]
        env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), PYTHONPATH=str(ROOT))
        with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as p:
            for line in p.stdout:
                row = json.loads(line)
                payload["rows"].append(row)
                print_row(row)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                tmp = args.out.with_suffix(".tmp")
                tmp.write_text(json.dumps(payload, indent=2))
                tmp.replace(args.out)
        if p.returncode:
            raise SystemExit(f"the worker for {devices} devices failed ({p.returncode})")


if __name__ == "__main__":
    main()
