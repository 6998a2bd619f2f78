"""Width: the backward of cells whose Jacobians stay structured, against back-propagation.

Cells (``--cells``): ParaRNN's diagonal GRU and CIFG LSTM and IndRNN with their analytic
Jacobians (``diagonal-gru``, ``cifg-lstm``, ``indrnn``); IndRNN written by a user in plain
``jnp`` without a decorator, whose diagonal Jacobian ``bppsa.scan`` finds in its jaxpr
(``indrnn-user``); and the same user cell made opaque to that analysis by a term that mixes the
units with weight zero (``indrnn-dense``: today's dense autodiff path, ``n`` VJPs and ``n^2``
floats per step; same values). Each is scanned over ``T`` steps for ``B`` sequences (vmapped),
a loss on every step's output (a language model's shape), ``--inputs`` input features.

Per point, in one process, interleaved round by round after a warm-up call, each timed call
right after an untimed call of itself (:func:`experiments._timing.interleaved`): the forward (the
jitted loss), back-propagation's gradient (``jax.grad`` through ``lax.scan``) and
``bppsa.grad``'s with each method (``--methods``: ``auto``, ``blelloch``, ...). Backward =
gradient - forward (marked unresolved inside the rounds' spread). Minimum and median are
recorded; what Auto ran and how the Jacobians were built are recorded beside them. The JSON is
rewritten atomically after every point.

Run: ``.venv/bin/python -m benchmarks.width --cells diagonal-gru --hiddens 64 256 1024 4096
--length 4096 --batch 4 --out benchmarks/results/width/cpu.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import (
    CIFGLSTM,
    DiagonalGRU,
    IndRNN,
    cifg_lstm_cell,
    diagonal_gru_cell,
    indrnn_cell,
)
from experiments import _methods, _timing
from results_io import methods as method_names
from results_io import write_json


def indrnn_user(params, h, x):
    """IndRNN as a user writes it: plain ``jnp``, no declared Jacobian."""
    return jax.nn.relu(params["weight_ih"] @ x + params["recurrent"] * h + params["bias"])


def indrnn_opaque(params, h, x):
    """The same values; the zero-weight sum couples every unit for the jaxpr analysis."""
    return indrnn_user(params, h + 0.0 * jnp.sum(h), x)


CELLS = {
    "diagonal-gru": (DiagonalGRU(), diagonal_gru_cell),
    "cifg-lstm": (CIFGLSTM(), cifg_lstm_cell),
    "indrnn": (IndRNN(), indrnn_cell),
    "indrnn-user": (IndRNN(), indrnn_user),
    "indrnn-dense": (IndRNN(), indrnn_opaque),
}
METHODS = {
    "auto": bppsa.Auto(),
    "blelloch": bppsa.Blelloch(),
    "sequential-scan": bppsa.SequentialScan(),
    "chunked": bppsa.Chunked(),
}


def method_of(name: str) -> bppsa.Method:
    """A method by name: those of ``METHODS``, or any of the project's method names
    (:data:`results_io.methods.FORMS`, e.g. ``blelloch-b16``: ``Blelloch()`` in time blocks of
    16 steps)."""
    if name in METHODS:
        return METHODS[name]
    return _methods.parse_method(name, method_names.FORMS)


def problem(cell: str, length: int, batch: int, hidden: int, inputs: int):
    kind, step = CELLS[cell]
    params = kind.init(inputs, hidden, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (batch, length, inputs), jnp.float32)
    head = jax.random.normal(jax.random.key(2), (hidden,)) / hidden
    init = kind.initial_state(hidden)

    def loss(scan, params, xs):
        def one(x):
            _, hs = scan(lambda s, x: (step(params, s, x), kind.output(s)), init, x)
            return jnp.mean(jnp.tanh(hs @ head))

        return jnp.mean(jax.vmap(one)(xs))

    return params, xs, loss


def resolved(totals: list[float], forwards: list[float]) -> bool:
    """Whether ``total - forward`` stands clear of the rounds' spread (lower quartile of the
    totals above the upper quartile of the forwards)."""
    if len(totals) < 2:
        return min(totals) > max(forwards)
    q1 = statistics.quantiles(totals, n=4, method="inclusive")[0]
    return q1 > statistics.quantiles(forwards, n=4, method="inclusive")[2]


def newton_scan(*args, **kwargs):
    return bppsa.scan(*args, forward=bppsa.Newton(), **kwargs)


def measure(cell, length, batch, hidden, inputs, methods, repeats, newton=False) -> dict:
    params, xs, loss = problem(cell, length, batch, hidden, inputs)
    calls = {
        "forward": jax.jit(lambda p, xs: loss(jax.lax.scan, p, xs)),
        "bp": jax.jit(jax.grad(lambda p, xs: loss(jax.lax.scan, p, xs))),
    }
    if newton:  # the forward alone, solved parallel in time (certified; see bppsa.Newton)
        calls["forward_newton"] = jax.jit(lambda p, xs: loss(newton_scan, p, xs))
    for name in methods:
        method = method_of(name)
        calls[name] = jax.jit(bppsa.grad(lambda p, xs: loss(bppsa.scan, p, xs), method=method))
    row = dict(cell=cell, length=length, batch=batch, hidden=hidden, inputs=inputs, methods={})
    for name, call in calls.items():  # compile and warm up
        with bppsa.trace_plans() as plans:
            jax.block_until_ready(call(params, xs))
        if name in methods:
            ran = plans[0].backward or plans[0].method
            row["methods"][name] = dict(ran=repr(ran), jacobians=plans[0].jacobians)
    times = _timing.interleaved(
        {name: functools.partial(call, params, xs) for name, call in calls.items()}, repeats
    )
    forward = times["forward"]
    row["forward_min_s"], row["forward_median_s"] = min(forward), statistics.median(forward)
    if newton:
        ts = times["forward_newton"]
        row["newton_min_s"], row["newton_median_s"] = min(ts), statistics.median(ts)
        row["newton_speedup_median"] = row["forward_median_s"] / row["newton_median_s"]
    for name in ["bp", *methods]:
        entry = row["methods"].setdefault(name, {})
        ts = times[name]
        entry["grad_min_s"], entry["grad_median_s"] = min(ts), statistics.median(ts)
        entry["backward_min_s"] = min(ts) - min(forward)
        entry["backward_median_s"] = statistics.median(ts) - statistics.median(forward)
        entry["backward_resolved"] = resolved(ts, forward)
        entry["per_step_backward_us"] = 1e6 * entry["backward_median_s"] / length
    bp = row["methods"]["bp"]
    for name in methods:
        entry = row["methods"][name]
        clear = entry["backward_resolved"] and bp["backward_resolved"]
        for stat in ("min", "median"):
            b = entry[f"backward_{stat}_s"]
            entry[f"backward_speedup_{stat}"] = bp[f"backward_{stat}_s"] / b if clear else None
            entry[f"grad_speedup_{stat}"] = bp[f"grad_{stat}_s"] / entry[f"grad_{stat}_s"]
    return row


def _x(value) -> str:
    return "  n/r" if value is None else f"{value:5.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["diagonal-gru"], choices=list(CELLS))
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["auto", "blelloch"],
        help="e.g. auto blelloch blelloch-b16 sequential-jacobians-b128",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", help="several T (overrides --length)")
    parser.add_argument("--batches", type=int, nargs="+", help="several B (overrides --batch)")
    parser.add_argument("--newton", action="store_true", help="also time the Newton forward")
    parser.add_argument("--seconds", type=float, help="stop starting points after this long")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/width.json"))
    parser.add_argument("--require-backend", help="stop unless JAX's default backend is this")
    args = parser.parse_args(argv)
    backend = jax.default_backend()
    if args.require_backend and backend != args.require_backend:
        print(
            f"benchmarks.width: this run needs JAX's {args.require_backend!r} backend, but the "
            f"default backend is {backend!r}; nothing was measured.",
            file=sys.stderr,
        )
        return 2
    data = {"jax": jax.__version__, "backend": jax.default_backend(), "argv": sys.argv, "rows": []}
    data["cpus"] = os.cpu_count()
    started = time.perf_counter()
    grid = [
        (cell, hidden, length, batch)
        for cell in args.cells
        for hidden in args.hiddens
        for length in args.lengths or [args.length]
        for batch in args.batches or [args.batch]
    ]
    data["complete"] = False
    for cell, hidden, length, batch in grid:
        if args.seconds is not None and time.perf_counter() - started > args.seconds:
            break
        try:
            row = measure(
                cell, length, batch, hidden, args.inputs, args.methods, args.repeats, args.newton
            )
        except Exception as error:  # e.g. out of device memory: recorded, the grid goes on
            row = dict(cell=cell, length=length, batch=batch, hidden=hidden, status="error")
            row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            data["rows"].append(row)
            write_json(args.out, data)
            print(f"{cell} H={hidden} T={length} B={batch}: {row['error']}", flush=True)
            continue
        data["rows"].append(row)
        write_json(args.out, data)
        bp = row["methods"]["bp"]
        line = f"{cell:<13} H={hidden:<5} T={length:<6} B={batch:<3}"
        line += f" BP bwd {1e3 * bp['backward_median_s']:9.1f} ms"
        for name in args.methods:
            m = row["methods"][name]
            line += (
                f" | {name} bwd {1e3 * m['backward_median_s']:8.1f} ms "
                f"x{_x(m['backward_speedup_median'])} ({m['jacobians']}; {m['ran']})"
            )
        if args.newton:
            line += f" | Newton fwd x{row['newton_speedup_median']:.2f}"
        print(line, flush=True)
    data["complete"] = len(data["rows"]) == len(grid)
    write_json(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
