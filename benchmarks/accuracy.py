"""Float32 accuracy of BPPSA's gradients against a float64 reference, next to float32 BP's.

The paper's classifiers (input 1, hidden 20, 10 classes, linear head on the last state,
cross-entropy, Bernoulli bitstream inputs, B = 16), RNN and GRU, with the recurrent weight
``W_hh`` (each gate block of it for the GRU) set to ``gain`` times a random orthogonal matrix:
contractive (gain 0.9: every RNN Jacobian has norm <= 0.9) and expansive (gain 1.25 for the RNN,
3 for the GRU, whose gates damp more: the gradient norm then grows with T, by up to 10^23 for the
RNN and 10^183 for the GRU at T = 30k, past float32's range for the GRU from T = 10k on).
For each T, two errors of every float32 method (BP = ``jax.grad`` through ``lax.scan``, and
``bppsa.grad`` with ``Blelloch()``, ``Chunked()`` and ``Auto()``):

* ``end_to_end``: against ``jax.grad`` through ``lax.scan`` in float64 (x64 enabled) from the
  same (float32-representable) parameters and inputs. This includes the float32 rounding of the
  forward pass, which BP and BPPSA share in kind but not bit for bit (XLA compiles their forward
  loops separately). Where the recurrence is chaotic (expansive weights, long T), a one-ulp
  difference in a state grows until the float32 trajectory has nothing to do with the float64
  one: every float32 gradient is then wrong by 100% or more, and its error says nothing about
  the backward method.
* ``backward_only``: every method back-propagates along ONE float32 forward trajectory (the
  states of a float32 ``lax.scan``, pinned by ``h_t = f(h_{t-1}, x_t) + stop_gradient(h*_t -
  f(h_{t-1}, x_t))``, with the cell's analytic Jacobian for BPPSA), against float64
  back-propagation along the same trajectory. This isolates what BPPSA changes: the order in
  which the Jacobian products and the parameter-gradient sums are evaluated.

Error: of each example's gradient (the B = 16 sequences are independent chains), normwise
relative per gradient leaf, ``max|g - g_ref| / max|g_ref|``, the maximum over the leaves (the
measure of ``tests/helpers.py``): scale-free, so exploding gradients do not inflate it, and
entries near zero do not make it meaningless. Reported: the median over the examples (and the
maximum). Rounding errors accumulate over the T steps like a random walk, so the error of ONE
gradient is one draw: two methods' single draws differ by up to ~4x either way (measured at
T = 30k), and only a statistic over independent chains compares methods. A non-finite float32
gradient (an overflow) counts as infinite; ``nonfinite`` says for how many examples.

Precision (what a GPU changes): ``--cell-precision`` is JAX's default matmul precision for
everything the user writes, BP's whole gradient included: ``highest`` (the default here, as on a
CPU) or ``default`` (JAX's own default, TF32 on recent NVIDIA GPUs). ``--precisions`` lists the
precisions of the products ``bppsa`` forms itself (``bppsa.grad(..., precision=...)``) besides
``highest`` (the library's default, always measured, in ``end_to_end`` / ``backward_only``):
each other one's errors are in the row's ``by_precision[precision]``, keyed alike. The float64
references are unaffected (TF32 applies to float32).

Run: ``.venv/bin/python -m benchmarks.accuracy [--quick] [--out PATH]``; writes JSON (after every
configuration, atomically) and prints a table. On a GPU (``benchmarks/gpu.sh``): ``--cells rnn
gru --regimes contractive --lengths 1000 10000 30000 --cell-precision default --precisions
highest default``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bppsa
from bppsa.jacobians import gru_jacobian_t, rnn_jacobian_t, transposed_jacobian
from bppsa.models import GRU, RNN, SequenceClassifier
from experiments.methods import parse_method
from paper_figures.result_files import methods as method_names

LENGTHS = (10, 30, 100, 300, 1000, 3000, 10_000, 30_000)
QUICK_LENGTHS = (10, 100, 1000)
BATCH, HIDDEN, CLASSES = 16, 20, 10
CELLS = {"rnn": (RNN(), rnn_jacobian_t), "gru": (GRU(), gru_jacobian_t)}
GAINS = {"contractive": {"rnn": 0.9, "gru": 0.9}, "expansive": {"rnn": 1.25, "gru": 3.0}}
METHODS = {
    name: parse_method(name, method_names.FORMS)
    for name in (method_names.BLELLOCH, method_names.CHUNKED, method_names.AUTO)
}
RESULTS = pathlib.Path(__file__).parent / "results"


def orthogonal(key, n: int) -> jax.Array:
    q, r = jnp.linalg.qr(jax.random.normal(key, (n, n)))
    return q * jnp.sign(jnp.diag(r))


def problem(cell_name: str, gain: float, length: int, batch: int, seed: int = 0):
    """Model, float32 parameters (``W_hh`` blocks = gain x orthogonal), bitstreams, labels."""
    cell, _ = CELLS[cell_name]
    model = SequenceClassifier(1, HIDDEN, CLASSES, cell=cell)
    k_params, k_w, k_labels, k_bits = jax.random.split(jax.random.key(seed), 4)
    params = model.init(key=k_params)
    blocks = [gain * orthogonal(k, HIDDEN) for k in jax.random.split(k_w, cell.gates)]
    params["cell"]["weight_hh"] = jnp.concatenate(blocks).astype(jnp.float32)
    labels = jax.random.randint(k_labels, (batch,), 0, CLASSES)
    probs = 0.05 + 0.1 * labels  # the paper's bitstreams: class k is Bernoulli(0.05 + 0.1 k)
    bits = jax.random.uniform(k_bits, (batch, length)) < probs[:, None]
    return model, params, bits.astype(jnp.float32)[..., None], labels


def cross_entropy(params, state, label):
    logits = params["head"]["weight"] @ state + params["head"]["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, label)


def bp_loss(cell, params, x, label):
    """The loss of one example through ``jax.lax.scan`` (the reference's and BP's)."""
    state0 = cell.initial_state(HIDDEN, x.dtype)
    state, _ = jax.lax.scan(lambda s, x_t: (cell(params["cell"], s, x_t), None), state0, x)
    return cross_entropy(params, state, label)


def bppsa_loss(cell, method, params, x, label, precision="highest"):
    state0 = cell.initial_state(HIDDEN, x.dtype)
    body = lambda s, x_t: (cell(params["cell"], s, x_t), None)  # noqa: E731
    state, _ = bppsa.scan(body, state0, x, method=method, precision=precision)
    return cross_entropy(params, state, label)


def trajectory(cell, params, x):
    """``(T, H)`` the float32 states after every step of one example."""
    state0 = cell.initial_state(HIDDEN, x.dtype)
    body = lambda s, x_t: (cell(params["cell"], s, x_t),) * 2  # noqa: E731
    return jax.lax.scan(body, state0, x)[1]


def pinned_cell(cell, builder):
    """The cell with its output pinned to a given state: ``f(h, (x, h*)) = h*`` in value, with
    the derivatives of ``f(h, x)``, and the cell's analytic Jacobian for ``bppsa.scan``."""

    @transposed_jacobian(lambda params, h, inp: builder(params, h, inp[0]))
    def step(params, h, inp):
        x, target = inp
        new = cell(params, h, x)
        return new + jax.lax.stop_gradient(target - new)

    return step


def pinned_loss(cell, builder, method, params, x, label, states, precision="highest"):
    """The loss of one example along the given states (each step pinned); ``method=None``:
    through ``jax.lax.scan`` (BP), else through ``bppsa.scan``."""
    step = pinned_cell(cell, builder)
    state0 = cell.initial_state(HIDDEN, x.dtype)
    body = lambda s, inp: (step(params["cell"], s, inp), None)  # noqa: E731
    if method is None:
        state, _ = jax.lax.scan(body, state0, (x, states))
    else:
        state, _ = bppsa.scan(body, state0, (x, states), method=method, precision=precision)
    return cross_entropy(params, state, label)


def per_example_grads(loss, *static, **options):
    """Jitted ``(params, xs, labels[, states]) -> grads`` with a leading example axis."""
    grad = jax.grad(functools.partial(loss, *static, **options), argnums=0)
    return jax.jit(jax.vmap(grad, in_axes=(None, 0, 0, 0) if loss is pinned_loss else (None, 0, 0)))


def relative_errors(actual, reference) -> np.ndarray:
    """Per example: the normwise relative error, max over leaves (``inf`` if not finite)."""
    errors = []
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(reference), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
        scale = np.maximum(np.max(np.abs(b), axis=1), np.finfo(np.float64).tiny)
        error = np.max(np.abs(a - b), axis=1) / scale
        errors.append(np.where(np.isfinite(a).all(axis=1), error, np.inf))
    return np.max(errors, axis=0)


def summary(errors: np.ndarray) -> dict:
    """Median and maximum over the examples (``None`` where not finite), and how many
    examples' gradients were not finite."""

    def value(x):
        return float(x) if np.isfinite(x) else None

    return dict(
        median=value(np.median(errors)),
        max=value(np.max(errors)),
        nonfinite=int(np.sum(~np.isfinite(errors))),
    )


def example_norms(grads) -> np.ndarray:
    """Per example: the largest gradient entry over all leaves."""
    leaves = [np.abs(np.asarray(leaf)).reshape(len(leaf), -1) for leaf in jax.tree.leaves(grads)]
    return np.max([leaf.max(axis=1) for leaf in leaves], axis=0)


def to64(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)


def measure(
    cell_name: str,
    regime: str,
    length: int,
    batch: int,
    seed: int = 0,
    precisions: tuple[str, ...] = (),
    methods: tuple[str, ...] = tuple(METHODS),
) -> dict:
    start = time.perf_counter()
    cell, builder = CELLS[cell_name]
    gain = GAINS[regime][cell_name]
    _, params, xs, labels = problem(cell_name, gain, length, batch, seed)
    states = jax.jit(jax.vmap(trajectory, in_axes=(None, None, 0)), static_argnums=0)(
        cell, params, xs
    )
    end_to_end, backward_only = {}, {}
    with jax.enable_x64(True):
        reference = per_example_grads(bp_loss, cell)(to64(params), to64(xs), labels)
        pinned = per_example_grads(pinned_loss, cell, builder, None)(
            to64(params), to64(xs), labels, to64(states)
        )
        reference, pinned = jax.tree.map(np.asarray, (reference, pinned))
    if not all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(reference)):
        raise FloatingPointError(f"the float64 reference overflowed ({cell_name}, T={length})")
    end_to_end[method_names.BP] = per_example_grads(bp_loss, cell)(params, xs, labels)
    backward_only[method_names.BP] = per_example_grads(pinned_loss, cell, builder, None)(
        params, xs, labels, states
    )
    others = {p: ({}, {}) for p in precisions if p != "highest"}
    for name, method in ((n, METHODS[n]) for n in methods):
        for precision, (e2e, bwd) in [("highest", (end_to_end, backward_only)), *others.items()]:
            options = dict(precision=precision)
            e2e[name] = per_example_grads(bppsa_loss, cell, method, **options)(params, xs, labels)
            bwd[name] = per_example_grads(pinned_loss, cell, builder, method, **options)(
                params, xs, labels, states
            )

    row = dict(
        cell=cell_name,
        regime=regime,
        gain=gain,
        length=length,
        batch=batch,
        hidden=HIDDEN,
        seed=seed,
        # What Auto() runs here: its choice depends on the vmap batch and the Jacobian's floats
        # per step (the RNN's keeps H, the GRU's 4 H).
        auto_choice=repr(
            bppsa.Auto().choose(
                length, HIDDEN, batch=batch, element=HIDDEN * (4 if cell_name == "gru" else 1)
            )
        ),
        grad_norm=float(np.median(example_norms(reference))),
        end_to_end={},
        backward_only={},
    )
    for key, results, ref in (
        ("end_to_end", end_to_end, reference),
        ("backward_only", backward_only, pinned),
    ):
        for name, grads in results.items():
            row[key][name] = summary(relative_errors(grads, ref))
    if others:
        row["by_precision"] = {
            precision: {
                "end_to_end": {n: summary(relative_errors(g, reference)) for n, g in e2e.items()},
                "backward_only": {n: summary(relative_errors(g, pinned)) for n, g in bwd.items()},
            }
            for precision, (e2e, bwd) in others.items()
        }
    row["seconds"] = time.perf_counter() - start
    return row


def write_json(path: pathlib.Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    tmp.replace(path)


def fmt(error: float | None) -> str:
    return "  overflow" if error is None else f"{error:10.2e}"


def print_row(row: dict) -> None:
    columns = [(n, row) for n in row["end_to_end"]]
    for precision, errors in row.get("by_precision", {}).items():
        columns += [(f"{n}@{precision}", errors) for n in errors["end_to_end"]]
    e2e = " ".join(fmt(r["end_to_end"][n.split("@")[0]]["median"]) for n, r in columns)
    bwd = " ".join(fmt(r["backward_only"][n.split("@")[0]]["median"]) for n, r in columns)
    print(
        f"{row['cell']:<3} {row['regime']:<11} T={row['length']:<6} |g|={row['grad_norm']:8.1e}"
        f"  end-to-end {e2e}  backward-only {bwd}  ({row['seconds']:.0f} s)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"T in {QUICK_LENGTHS}, B = 4")
    parser.add_argument("--lengths", type=int, nargs="+", help="override the T grid")
    parser.add_argument("--out", type=pathlib.Path, help="JSON path (default: results/...)")
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--regimes", nargs="+", choices=list(GAINS), default=list(GAINS))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument(
        "--cell-precision",
        choices=["highest", "default"],
        default="highest",
        help="JAX's default matmul precision for the user's code and BP (default: highest; "
        "'default' is JAX's own, TF32 on recent NVIDIA GPUs)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=["highest", "high", "default"],
        default=["highest"],
        help="precisions of bppsa's own products (bppsa.grad's precision=) to measure besides "
        "highest, the default (always measured); each method at each",
    )
    args = parser.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    batch = 4 if args.quick else BATCH
    backend = jax.default_backend()
    out = args.out or RESULTS / f"accuracy_{backend}{'_quick' if args.quick else ''}.json"
    payload = dict(
        benchmark="accuracy",
        backend=backend,
        device=str(jax.devices()[0].device_kind),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        jax=jax.__version__,
        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        batch=batch,
        hidden=HIDDEN,
        gains=GAINS,
        methods={name: repr(METHODS[name]) for name in args.methods},
        cell_precision=args.cell_precision,
        precisions=args.precisions,
        error=(
            "per example: max over gradient leaves of max|g - g_ref| / max|g_ref| (normwise "
            "relative); median and max over the examples"
        ),
        rows=[],
    )
    extra = [f"{n}@{p}" for p in args.precisions if p != "highest" for n in args.methods]
    print(f"errors of: {', '.join([method_names.BP, *args.methods, *extra])}; writing {out}")
    cell_precision = None if args.cell_precision == "default" else args.cell_precision
    with jax.default_matmul_precision(cell_precision):
        for cell_name in args.cells:
            for regime in args.regimes:
                for length in lengths:
                    row = measure(
                        cell_name,
                        regime,
                        length,
                        batch,
                        precisions=args.precisions,
                        methods=args.methods,
                    )
                    payload["rows"].append(row)
                    print_row(row)
                    write_json(out, payload)


if __name__ == "__main__":
    main()
