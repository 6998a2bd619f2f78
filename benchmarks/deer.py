"""The Newton forward against DEER's on DEER's demo configuration, side by side in one process.

DEER (Lim et al., ICLR 2024; its JAX code is not a dependency of this project) solves the same
forward pass by Newton iterations on the whole trajectory. Its demo: a GRU of hidden size 2 over
``T = 10k`` steps, ``B = 16`` sequences, float32. This benchmark imports DEER from a folder the
user gives (``--deer-path``: a checkout whose ``deer`` package imports ``seq1d`` and ``DEER``
from ``deer.fseq1d``; its pinned JAX is old, so patch that scratch copy, never this project) and
times, interleaved round by round, each timed call right after an untimed call of itself
(:func:`experiments.timing.interleaved`): ``lax.scan``; ``bppsa.scan(..., forward=bppsa.Newton())`` with the
GRU's analytic Jacobians under ``Auto()`` (the default: on CPUs each iteration's linear
recurrence is then the sequential scan) and under ``Blelloch()`` (the parallel scan); and DEER's
``seq1d``.

Iterations: this library's from :class:`bppsa.NewtonInfo` (linear recurrences solved; the
iterations also evaluate every step once more to certify the last iterate), DEER's as the
smallest ``max_iter`` with which it reports success, minus one (its loop runs while the change
is above tolerance and fewer than ``max_iter`` iterations ran). Per iteration = median time /
iterations. Every solution is compared with ``lax.scan``'s.

Run: ``.venv/bin/python -m benchmarks.deer --deer-path /tmp/deer_scratch --out
benchmarks/results/deer_cpu.json``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pathlib
import platform
import sys

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, gru_cell
from experiments.timing import interleaved, min_median
from paper_figures.result_files import write_json

METHODS = {"auto": bppsa.Auto(), "blelloch": bppsa.Blelloch()}


def load_deer(path: pathlib.Path):
    """DEER's ``(seq1d, DEER)`` from the checkout at ``path``.

    Raises:
        FileNotFoundError, ImportError: naming ``--deer-path`` and what was expected there.
    """
    if not (path / "deer").is_dir():
        raise FileNotFoundError(
            f"argument --deer-path: no folder 'deer' in {path} (expected a checkout of DEER's "
            "code whose package 'deer' has the module 'fseq1d')."
        )
    sys.path.insert(0, str(path))
    try:
        module = importlib.import_module("deer.fseq1d")
    except ImportError as error:
        message = f"argument --deer-path: importing deer.fseq1d from {path}: {error}"
        raise ImportError(message) from error
    return module.seq1d, module.DEER


def deer_iterations(seq1d, deer_method, params, xs, h0, limit: int = 64) -> int:
    """DEER's iteration count on ``xs``: the smallest ``max_iter`` it succeeds with, minus one."""
    for k in range(1, limit + 1):

        def one(x, k=k):
            step = lambda h, x, p: gru_cell(p, h, x)  # noqa: E731 (DEER's argument order)
            return seq1d(step, h0, x, params, method=deer_method(max_iter=k)).success

        if bool(jnp.all(jax.jit(jax.vmap(one))(xs))):
            return k - 1
    raise RuntimeError(f"DEER did not converge within {limit} iterations.")


def measure(seq1d, deer_method, hidden, inputs, length, batch, rounds) -> dict:
    params = GRU().init(inputs, hidden, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (batch, length, inputs), jnp.float32)
    h0 = jnp.zeros(hidden, jnp.float32)
    body = lambda h, x: (gru_cell(params, h, x),) * 2  # noqa: E731
    infos = {name: [] for name in METHODS}

    def ours(name, x, record=False):
        newton = bppsa.Newton(callback=infos[name].append if record else None)
        return bppsa.scan(body, h0, x, forward=newton, method=METHODS[name])[1]

    def deer(x):
        step = lambda h, x, p: gru_cell(p, h, x)  # noqa: E731
        return seq1d(step, h0, x, params, method=deer_method()).value

    calls = {"lax_scan": jax.jit(jax.vmap(lambda x: jax.lax.scan(body, h0, x)[1]))}
    for name in METHODS:
        calls[f"newton_{name}"] = jax.jit(jax.vmap(functools.partial(ours, name)))
    calls["deer"] = jax.jit(jax.vmap(deer))
    reference = calls["lax_scan"](xs)
    row = dict(hidden=hidden, inputs=inputs, length=length, batch=batch, rounds=rounds)
    for name, call in calls.items():
        row[f"{name}_max_abs_difference"] = float(jnp.max(jnp.abs(call(xs) - reference)))
    for name in METHODS:
        jax.vmap(functools.partial(ours, name, record=True))(xs)
        jax.effects_barrier()
        row[f"newton_{name}_iterations"] = max(int(i.iterations) for i in infos[name])
        row[f"newton_{name}_converged"] = all(bool(i.converged) for i in infos[name])
    row["deer_iterations"] = deer_iterations(seq1d, deer_method, params, xs, h0)
    times = interleaved({n: functools.partial(c, xs) for n, c in calls.items()}, rounds)
    row |= min_median(times)
    for name in [*(f"newton_{m}" for m in METHODS), "deer"]:
        row[f"{name}_per_iteration_s"] = row[f"{name}_median_s"] / row[f"{name}_iterations"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deer-path", type=pathlib.Path, required=True)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[2])
    parser.add_argument("--inputs", type=int, default=2)
    parser.add_argument("--length", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/deer.json"))
    args = parser.parse_args(argv)
    try:
        seq1d, deer_method = load_deer(args.deer_path)
    except (FileNotFoundError, ImportError) as error:
        parser.error(str(error))
    data = dict(
        argv=sys.argv[1:] if argv is None else list(argv),
        backend=jax.default_backend(),
        jax=jax.__version__,
        machine=platform.machine(),
        cpus=os.cpu_count(),
        rows=[],
    )
    for hidden in args.hiddens:
        row = measure(seq1d, deer_method, hidden, args.inputs, args.length, args.batch, args.rounds)
        data["rows"].append(row)
        write_json(args.out, data)
        print(
            f"GRU H={hidden} T={args.length} B={args.batch}: lax.scan "
            f"{1e3 * row['lax_scan_median_s']:.1f} ms | "
            + " | ".join(
                f"{name} {1e3 * row[f'{name}_median_s']:.1f} ms, {row[f'{name}_iterations']} it, "
                f"{1e3 * row[f'{name}_per_iteration_s']:.1f} ms/it"
                for name in ("newton_auto", "newton_blelloch", "deer")
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
