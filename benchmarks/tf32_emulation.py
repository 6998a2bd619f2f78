"""Where BPPSA's GPU gradients drift from BP's: TF32 emulated on the CPU, against float64.

On an NVIDIA H200 (JAX's default float32 matmul precision = TF32) the gradients of
``bppsa.scan`` with ``Blelloch()`` differed from BP's by 7.7e-5 / 7.1e-4 / 2.3e-3 (RNN, B = 16,
T = 1k / 10k / 30k), 4.0e-4 / 1.2e-3 (GRU, T = 10k / 30k), 1.1e-4 / 3.1e-5 (RNN / GRU, B = 1,
T = 10k), against 3e-7 on the CPU (``../shared/gpu-h200/gpu_backward.jsonl``); which side is
farther from the truth was not measured. XLA's CPU backend has no TF32, so this benchmark
emulates it (:mod:`benchmarks._tf32`: each emulated product ``round(a) @ round(b)`` at full
float32 precision, ``round`` to a 10-bit mantissa, to nearest; float64 never rounded).

Four settings, each a pair (user's code rounded, bppsa's own products rounded):

* ``none``: nothing rounded (the CPU).
* ``cell``: TF32 in the user's code only: the cell's products ``W_ih x``, ``W_hh h``, the
  analytic Jacobian builder's (it recomputes the pre-activations in the user's scope) and the
  classifier head's, each with both products of its VJP (the cotangent and the saved operands
  rounded BEFORE each product, as XLA's TF32 transposes do). So BP's whole backward is emulated
  (``W^T g`` per step, the per-step parameter-gradient products), and so are the cell VJPs that
  bppsa runs for the parameter gradients. What the library gives on a GPU now, at its default
  ``precision="highest"``.
* ``library``: TF32 in bppsa's own products only (``bppsa.scan._precision.matmul`` and
  ``einsum``, patched in this process by :func:`benchmarks._tf32.library_tf32`): the scan's
  combines, Jacobian applications, chunk aggregates, structured blocks.
* ``both``: what a GPU user got at JAX's defaults (the H200 run, commit 94107b3, before the
  library pinned its products); ``precision="default"`` today.

Not emulated: the accumulation order inside a GPU kernel (split-K, the tensor core's own
adder); which of the GPU's small products XLA really ran on tensor cores (a small dot may become
a full-float32 multiply-and-reduce): every product is taken as TF32, so the rounding here is an
upper bound of that kind. Elementwise work (the Structured elements' diagonal scalings,
``to_dense``, ``Structured.apply``'s fused multiply-and-sum for a few small rows) is full
float32 here as on a GPU, but which of these paths runs follows this machine's profile, not the
GPU's. Derivatives go straight through the rounding, as JAX's transpose of a
TF32 dot.

Measured per example (the B independent chains), normwise relative error (max over gradient
leaves of ``max|g - g_ref| / max|g_ref|``, :func:`benchmarks.accuracy.relative_errors`),
median and max over the examples, on the problem of :mod:`benchmarks.accuracy` (the paper's
classifiers, H = 20, input 1, 10 classes, ``W_hh`` blocks 0.9 x orthogonal: contractive):

* ``end_to_end``: each float32 gradient against ``jax.grad`` through ``lax.scan`` in float64;
* ``backward_only``: along one float32 trajectory (computed with the setting's cell, so the
  forward's TF32 error is shared and excluded), against float64 back-propagation along it;
* ``vs_bp_*``: BPPSA's gradient against BP's float32 gradient in the same setting (BP as the
  reference), the H200's comparison.

``h200``: the H200 run's own problem replayed (``direct_backward.py`` there: PyTorch's
default init from key 0, Gaussian inputs from key 1, loss ``mean_b(sum_t sum(h_{t-1}) / T +
|h_T|^2)``, ONE batch-mean gradient, Frobenius ``|g - g_ref|_F / |g_ref|_F``): BPPSA (Blelloch)
against BP and both against float64 in every setting, and one hypothesis for a drift that grows
with T: BP written out (:func:`accumulating_bp`) with its parameter-gradient accumulator
rounded toward zero once per step (:func:`benchmarks._tf32.add_toward_zero`; tensor cores'
float32 accumulation is reported to truncate), against float64 and against BPPSA.

Run: ``.venv/bin/python -m benchmarks.tf32_emulation [--lengths 1000 10000 30000] [--batch 16]
[--methods blelloch chunked] [--quick]``; writes ``results/tf32_emulation_cpu.json`` after every
row (atomically) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import pathlib
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import bppsa
from benchmarks._tf32 import EmulatedCell, add_toward_zero, library_tf32, user_matmul
from benchmarks.accuracy import (
    GAINS,
    HIDDEN,
    METHODS,
    pinned_cell,
    problem,
    relative_errors,
    summary,
    to64,
    trajectory,
)
from paper_figures.result_files import methods as method_names
from paper_figures.result_files.files import write_json

LENGTHS = (1000, 10_000, 30_000)
QUICK_LENGTHS = (100, 1000)
BATCH = 16
REGIME = "contractive"
# (user's code rounded, bppsa's own products rounded)
SETTINGS = {"none": (False, False), "cell": (True, False), "library": (False, True)}
SETTINGS["both"] = (True, True)
# The H200's BPPSA (Blelloch) vs BP differences by (cell, T, B), gpu_backward.jsonl.
H200 = {
    ("rnn", 1000, 16): 7.7e-5,
    ("rnn", 10_000, 16): 7.1e-4,
    ("rnn", 30_000, 16): 2.3e-3,
    ("gru", 10_000, 16): 4.0e-4,
    ("gru", 30_000, 16): 1.2e-3,
    ("rnn", 10_000, 1): 1.1e-4,
    ("gru", 10_000, 1): 3.1e-5,
}
OUT = pathlib.Path(__file__).parent / "results" / "tf32_emulation_cpu.json"


# Losses of one example (the classifier of benchmarks.accuracy, its head through user_matmul).


def _head(cell, params, state, label):
    logits = user_matmul(params["head"]["weight"], state, cell.rounded) + params["head"]["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, label)


def bp_loss(cell, params, x, label):
    state0 = cell.initial_state(HIDDEN, x.dtype)
    state, _ = lax.scan(lambda s, x_t: (cell(params["cell"], s, x_t), None), state0, x)
    return _head(cell, params, state, label)


def bppsa_loss(cell, method, params, x, label):
    state0 = cell.initial_state(HIDDEN, x.dtype)
    body = lambda s, x_t: (cell(params["cell"], s, x_t), None)  # noqa: E731
    state, _ = bppsa.scan(body, state0, x, method=method)
    return _head(cell, params, state, label)


def pinned_loss(cell, method, params, x, label, states):
    """Along the given float32 states; ``method=None``: ``lax.scan`` (BP)."""
    step = pinned_cell(cell, cell.jacobian_t)
    state0 = cell.initial_state(HIDDEN, x.dtype)
    body = lambda s, inp: (step(params["cell"], s, inp), None)  # noqa: E731
    scan = lax.scan if method is None else functools.partial(bppsa.scan, method=method)
    state, _ = scan(body, state0, (x, states))
    return _head(cell, params, state, label)


def per_example_grads(loss, *static):
    grad = jax.grad(functools.partial(loss, *static), argnums=0)
    axes = (None, 0, 0, 0) if loss is pinned_loss else (None, 0, 0)
    return jax.jit(jax.vmap(grad, in_axes=axes))


def measure(
    kind: str, length: int, batch: int, methods: dict, backward_only: bool = True, seed: int = 0
) -> dict:
    """Errors of BP and ``methods`` in every setting, for one cell and length."""
    start = time.perf_counter()
    _, params, xs, labels = problem(kind, GAINS[REGIME][kind], length, batch, seed)
    exact = EmulatedCell(kind)
    with jax.enable_x64(True):
        reference = per_example_grads(bp_loss, exact)(to64(params), to64(xs), labels)
    reference = jax.tree.map(np.asarray, reference)
    pinned_refs = {}  # by whether the trajectory is TF32's
    row = dict(cell=kind, length=length, batch=batch, seed=seed, settings={})
    for setting, (cell_tf32, library) in SETTINGS.items():
        cell = EmulatedCell(kind, cell_tf32)
        grads = {"end_to_end": {}, "backward_only": {}}
        states = None
        if backward_only:
            states = jax.jit(jax.vmap(trajectory, in_axes=(None, None, 0)), static_argnums=0)(
                cell, params, xs
            )
            if cell_tf32 not in pinned_refs:
                with jax.enable_x64(True):
                    pinned_refs[cell_tf32] = jax.tree.map(
                        np.asarray,
                        per_example_grads(pinned_loss, exact, None)(
                            to64(params), to64(xs), labels, to64(states)
                        ),
                    )
        with library_tf32(library):
            for name, method in {method_names.BP: None, **methods}.items():
                if method is None:
                    grads["end_to_end"][name] = per_example_grads(bp_loss, cell)(params, xs, labels)
                else:
                    loss = per_example_grads(bppsa_loss, cell, method)
                    grads["end_to_end"][name] = loss(params, xs, labels)
                if backward_only:
                    grads["backward_only"][name] = per_example_grads(pinned_loss, cell, method)(
                        params, xs, labels, states
                    )
        result = {}
        for key, ref in (("end_to_end", reference), ("backward_only", pinned_refs.get(cell_tf32))):
            if not grads[key]:
                continue
            result[key] = {n: summary(relative_errors(g, ref)) for n, g in grads[key].items()}
            bp = grads[key][method_names.BP]
            result[f"vs_bp_{key}"] = {
                n: summary(relative_errors(g, bp)) for n, g in grads[key].items() if n in methods
            }
        row["settings"][setting] = result
    row["seconds"] = time.perf_counter() - start
    return row


# The H200 run's own problem (../shared/gpu-h200/direct_backward.py), replayed.


def h200_problem(kind: str, length: int, batch: int):
    """PyTorch's default parameters from key 0, Gaussian inputs ``(B, T, 1)`` from key 1."""
    model = {"rnn": bppsa.models.RNN(), "gru": bppsa.models.GRU()}[kind]
    params = model.init(1, HIDDEN, key=jax.random.key(0))
    return params, jax.random.normal(jax.random.key(1), (batch, length, 1))


def h200_loss(cell, scan, params, xs):
    """``mean_b(sum_t sum(h_{t-1}) / T + |h_T|^2)``."""

    def one(x):
        body = lambda h, x_t: (cell(params, h, x_t), jnp.sum(h))  # noqa: E731
        h, ys = scan(body, jnp.zeros(HIDDEN, xs.dtype), x)
        return jnp.sum(ys) / xs.shape[1] + jnp.sum(h**2)

    return jnp.mean(jax.vmap(one)(xs))


def accumulating_bp(cell, params, xs, add=jnp.add):
    """The gradient of :func:`h200_loss` by back-propagation written out: the batch's parameter
    gradient of each step (the batch contracted, as BP's vmapped program does) is added to the
    accumulator with ``add``, one step after the other. ``add=jnp.add`` is ``jax.grad``'s BP."""
    length = xs.shape[1]
    batched = jax.vmap(cell, in_axes=(None, 0, 0))
    steps = xs.swapaxes(0, 1)
    last, earlier = lax.scan(
        lambda h, x: (batched(params, h, x), h), jnp.zeros((len(xs), HIDDEN), xs.dtype), steps
    )

    def back(carry, inp):
        g, acc = carry
        h, x = inp
        d_params, d_h = jax.vjp(lambda p, h: batched(p, h, x), params, h)[1](g)
        return (d_h + 1 / (length * len(xs)), jax.tree.map(add, acc, d_params)), None

    start = (2 * last / len(xs), jax.tree.map(jnp.zeros_like, params))
    (_, grads), _ = lax.scan(back, start, (earlier, steps), reverse=True)
    return grads


def frobenius(actual, reference) -> float:
    """``|g - g_ref|_F / |g_ref|_F`` over all leaves."""
    num = den = 0.0
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(reference), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        num, den = num + float(np.sum((a - b) ** 2)), den + float(np.sum(b**2))
    return (num / max(den, 1e-300)) ** 0.5


def h200_replica(kind: str, length: int, batch: int) -> dict:
    """BPPSA (Blelloch) against BP, both against float64, and BP with a truncating
    accumulator, on the H200 run's problem, in every setting."""
    start = time.perf_counter()
    params, xs = h200_problem(kind, length, batch)
    blelloch = functools.partial(bppsa.scan, method=bppsa.Blelloch())
    with jax.enable_x64(True):
        loss = functools.partial(h200_loss, EmulatedCell(kind), lax.scan)
        reference = jax.jit(jax.grad(loss))(to64(params), to64(xs))
    row = dict(cell=kind, length=length, batch=batch, settings={})
    for setting, (cell_tf32, library) in SETTINGS.items():
        cell = EmulatedCell(kind, cell_tf32)
        with library_tf32(library):
            bp = jax.jit(jax.grad(functools.partial(h200_loss, cell, lax.scan)))(params, xs)
            scan = jax.jit(jax.grad(functools.partial(h200_loss, cell, blelloch)))(params, xs)
        truncated = functools.partial(accumulating_bp, cell, add=add_toward_zero)
        bp_rz = jax.jit(truncated)(params, xs)
        row["settings"][setting] = dict(
            vs_bp=frobenius(scan, bp),
            bp_vs_float64=frobenius(bp, reference),
            bppsa_vs_float64=frobenius(scan, reference),
            bp_rz_vs_float64=frobenius(bp_rz, reference),
            vs_bp_rz=frobenius(scan, bp_rz),
        )
    row["h200_vs_bp"] = H200.get((kind, length, batch))
    row["seconds"] = time.perf_counter() - start
    return row


def _fmt(s: dict | None) -> str:
    if s is None or s["median"] is None:
        return "        -         "
    return f"{s['median']:8.2e} ({s['max']:8.2e})"


def print_row(row: dict) -> None:
    for setting, result in row["settings"].items():
        for key in ("end_to_end", "backward_only"):
            if key not in result:
                continue
            errors = "  ".join(f"{n} {_fmt(s)}" for n, s in result[key].items())
            vs_bp = "  ".join(f"{n} {_fmt(s)}" for n, s in result[f"vs_bp_{key}"].items())
            print(
                f"{row['cell']:<3} T={row['length']:<6} {setting:<8} {key:<13} vs float64: "
                f"{errors} | vs BP: {vs_bp}",
                flush=True,
            )
    print(f"    ({row['seconds']:.0f} s)", flush=True)


def print_h200(row: dict) -> None:
    h200 = row["h200_vs_bp"]
    print(
        f"H200 problem {row['cell']} T={row['length']} B={row['batch']} (H200: BPPSA vs BP "
        f"{'-' if h200 is None else f'{h200:.1e}'}; {row['seconds']:.0f} s)",
        flush=True,
    )
    for setting, r in row["settings"].items():
        print(
            f"    {setting:<8} BPPSA vs BP {r['vs_bp']:.1e} | vs float64: BP "
            f"{r['bp_vs_float64']:.1e}  BPPSA {r['bppsa_vs_float64']:.1e}  BP with a truncating "
            f"accumulator {r['bp_rz_vs_float64']:.1e} (BPPSA vs it {r['vs_bp_rz']:.1e})",
            flush=True,
        )


def main(argv: list[str] | None = None, out: pathlib.Path | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", help=f"default {LENGTHS}")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--cells", nargs="+", choices=["rnn", "gru"], default=["rnn", "gru"])
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=[method_names.BLELLOCH, method_names.CHUNKED],
        default=[method_names.BLELLOCH],
    )
    parser.add_argument("--no-backward-only", action="store_true", help="end to end only")
    parser.add_argument("--no-rows", action="store_true", help="the H200 problem's replay only")
    parser.add_argument("--no-h200", action="store_true", help="skip the H200 problem's replay")
    parser.add_argument("--quick", action="store_true", help=f"T in {QUICK_LENGTHS}, B = 4")
    parser.add_argument("--out", type=pathlib.Path, default=out or OUT)
    args = parser.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    batch = 4 if args.quick else args.batch
    methods = {name: METHODS[name] for name in args.methods}
    replays = [(kind, length, batch) for kind in args.cells for length in lengths]
    replays += [key for key in H200 if key[2] == 1 and key[:2] in {r[:2] for r in replays}]
    payload = dict(
        benchmark="tf32_emulation",
        backend=jax.default_backend(),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        jax=jax.__version__,
        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=" ".join(["python", "-m", "benchmarks.tf32_emulation", *(argv or [])]),
        batch=batch,
        hidden=HIDDEN,
        regime=REGIME,
        gains=GAINS[REGIME],
        methods={name: repr(method) for name, method in methods.items()},
        settings={
            name: dict(cell_tf32=cell, library_tf32=library)
            for name, (cell, library) in SETTINGS.items()
        },
        emulation=(
            "TF32 = float32 operands rounded to nearest by lax.reduce_precision(exponent_bits=8, "
            "mantissa_bits=10) before a full-precision float32 product. cell: the user's products "
            "(cell, Jacobian builder, head) and both products of their VJPs (cotangent rounded "
            "before); library: bppsa.scan._precision.matmul/einsum patched"
        ),
        error=(
            "rows: per example, max over gradient leaves of max|g - g_ref| / max|g_ref|; median "
            "and max over the examples. h200: Frobenius |g - g_ref| / |g_ref| of the batch-mean "
            "gradient"
        ),
        h200_vs_bp=[dict(cell=c, length=t, batch=b, vs_bp=v) for (c, t, b), v in H200.items()],
        rows=[],
        h200=[],
    )
    print(f"errors: median (max) over {batch} examples; writing {args.out}", flush=True)
    with jax.default_matmul_precision("highest"):
        for kind in [] if args.no_rows else args.cells:
            for length in lengths:
                row = measure(kind, length, batch, methods, not args.no_backward_only)
                payload["rows"].append(row)
                print_row(row)
                write_json(args.out, payload)
        for kind, length, b in [] if args.no_h200 else replays:
            payload["h200"].append(h200_replica(kind, length, b))
            print_h200(payload["h200"][-1])
            write_json(args.out, payload)
    payload["seconds"] = sum(r["seconds"] for r in payload["rows"] + payload["h200"])
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
