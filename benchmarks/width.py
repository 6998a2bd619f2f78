"""Width: the backward of cells whose Jacobians stay structured, against back-propagation.

Cells (``--cells``): ParaRNN's diagonal GRU and CIFG LSTM and IndRNN with their analytic
Jacobians (``diagonal-gru``, ``cifg-lstm``, ``indrnn``); IndRNN written by a user in plain
``jnp`` without a decorator, whose diagonal Jacobian ``bppsa.scan`` finds in its jaxpr
(``indrnn-user``); and the same user cell made opaque to that analysis by a term that mixes the
units with weight zero (``indrnn-dense``: today's dense autodiff path, ``n`` VJPs and ``n^2``
floats per step; same values). Each is scanned over ``T`` steps for ``B`` sequences (vmapped),
a loss on every step's output (a language model's shape), ``--inputs`` input features.

Per point, in one process, every program timed round by round, each timed call right after an
untimed call of itself (:func:`experiments.timing.time_gradients`): for back-propagation (``bp``:
``jax.grad`` through ``lax.scan``) and for ``bppsa.scan`` with each method (``--methods``: ``auto``,
``blelloch``, ...) bound in the loss, the gradient's three quantities, each its own program
(:class:`experiments.timing.GradientPrograms`): ``total`` (``jax.value_and_grad``), ``forward`` (the
forward of ``jax.vjp``: the forward as it runs inside the gradient) and ``backward`` (its pullback
on saved residuals: the backward as its own program, never total - forward); and the standalone
forwards of interest, each its own program: ``lax_scan`` (the jitted loss through
``lax.scan``) and, with ``--newton``, ``newton`` (the loss through the Newton forward). Medians
(``*_ms``) and minima (``*_min_ms``) are recorded, and on a GPU each backward's device kernel
time from the profiler (``backward_kernel_ms``), the cross-check of the pullback timed alone;
what Auto ran and how the Jacobians were built are recorded beside them. The JSON
(``"backward": "pullback"``) is rewritten atomically after every point.

With ``--structure-check``, every method also runs with ``check_structure=False`` as a program
of its own (the row's ``unchecked``, by method), and each row records what the default
structure check costs a structure found in the cell (``indrnn-user``):
``check_cost_backward_{median,min}``, the checked backward's time over the unchecked one's, and
the same for the total.

Run: ``.venv/bin/python -m benchmarks.width --cells diagonal-gru --hiddens 64 256 1024 4096
--length 4096 --batch 4 --out benchmarks/results/width/cpu.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
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
from experiments.methods import parse_method
from experiments.timing import GradientPrograms, ms_fields, time_gradients
from paper_figures.result_files import PULLBACK, write_json
from paper_figures.result_files import methods as method_names


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


def method_of(name: str) -> bppsa.Method:
    """A method by name: any of the project's method names or their aliases
    (:data:`paper_figures.result_files.methods.NAMES`, e.g. ``auto``, ``sequential-scan``,
    ``blelloch-b16``: ``Blelloch()`` in time blocks of 16 steps)."""
    return parse_method(method_names.canonical(name), method_names.FORMS)


def problem(cell: str, length: int, batch: int, hidden: int, inputs: int):
    """``(params, xs, loss)``: ``loss(scan, params, xs)`` runs the cell through ``scan``."""
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


UNCHECKED = "-unchecked"  # a method's program with check_structure=False


def measure(
    cell, length, batch, hidden, inputs, methods, repeats, newton=False, structure_check=False
) -> dict:
    params, xs, loss = problem(cell, length, batch, hidden, inputs)
    scans = {"bp": jax.lax.scan}
    scans |= {name: functools.partial(bppsa.scan, method=method_of(name)) for name in methods}
    if structure_check:
        scans |= {
            name + UNCHECKED: functools.partial(
                bppsa.scan, method=method_of(name), check_structure=False
            )
            for name in methods
        }
    row = dict(cell=cell, length=length, batch=batch, hidden=hidden, inputs=inputs, methods={})
    programs = {}
    for name, scan in scans.items():
        with bppsa.trace_plans() as plans:
            programs[name] = GradientPrograms.from_loss(functools.partial(loss, scan), params, xs)
        entry = row["methods"][name] = {}
        if name in methods:
            ran = next((p.backward for p in plans if p.backward), plans[0].method)
            entry.update(ran=repr(ran), jacobians=plans[0].jacobians)
        entry["compile_s"] = dict(programs[name].compile_seconds)
    forwards = {"lax_scan": jax.lax.scan}
    if newton:  # the forward alone, solved parallel in time (certified; see bppsa.Newton)
        forwards["newton"] = functools.partial(bppsa.scan, forward=bppsa.Newton())
    others = {
        name: functools.partial(jax.jit(functools.partial(loss, scan)), params, xs)
        for name, scan in forwards.items()
    }
    times = time_gradients(programs, repeats, others=others)
    for name in forwards:
        row |= ms_fields(times[name])
    if newton:
        row["newton_speedup_median"] = row["lax_scan_ms"] / row["newton_ms"]
    bp = row["methods"]["bp"]
    for name, entry in row["methods"].items():
        entry |= ms_fields(times[name])
        entry["per_step_backward_us"] = 1e3 * entry["backward_ms"] / length
        entry["backward_kernel_ms"] = programs[name].backward_kernel_ms()  # on a GPU only
    if structure_check:  # not methods of their own: beside them, by the method's name
        row["unchecked"] = {name: row["methods"].pop(name + UNCHECKED) for name in methods}
    for name in methods:
        entry = row["methods"][name]
        for stat, suffix in (("median", ""), ("min", "_min")):
            entry[f"backward_speedup_{stat}"] = (
                bp[f"backward{suffix}_ms"] / entry[f"backward{suffix}_ms"]
            )
            entry[f"total_speedup_{stat}"] = bp[f"total{suffix}_ms"] / entry[f"total{suffix}_ms"]
            if structure_check:
                unchecked = row["unchecked"][name]
                for part in ("backward", "total"):
                    entry[f"check_cost_{part}_{stat}"] = (
                        entry[f"{part}{suffix}_ms"] / unchecked[f"{part}{suffix}_ms"]
                    )
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
    parser.add_argument(
        "--structure-check",
        action="store_true",
        help="also time every method with check_structure=False (the default check's cost)",
    )
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
    data["backward"] = PULLBACK
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
                cell,
                length,
                batch,
                hidden,
                args.inputs,
                args.methods,
                args.repeats,
                args.newton,
                args.structure_check,
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
        line += f" BP bwd {bp['backward_ms']:9.1f} ms"
        for name in args.methods:
            m = row["methods"][name]
            line += (
                f" | {name} bwd {m['backward_ms']:8.1f} ms "
                f"x{_x(m['backward_speedup_median'])} ({m['jacobians']}; {m['ran']})"
            )
            if args.structure_check:
                line += f" check x{m['check_cost_backward_median']:.3f}"
        if args.newton:
            line += f" | Newton fwd x{row['newton_speedup_median']:.2f}"
        print(line, flush=True)
    data["complete"] = len(data["rows"]) == len(grid)
    write_json(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
