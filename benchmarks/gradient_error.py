"""Max relative gradient error of each backward method against back-propagation.

For the RNN, GRU and LSTM classifiers (T = 1000, B = 16, H = 20, the paper's bitstreams), in
float32 and float64: ``max over leaves of max|g - g_BP| / max|g_BP|`` with ``g_BP`` from
``jax.grad`` through ``jax.lax.scan`` in the same dtype. Writes ``results/gradient_error.json``.

Run with ``.venv/bin/python -m benchmarks.gradient_error``.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform

import jax
import jax.numpy as jnp

import bppsa
from bppsa.data.synthetic import Bitstreams
from bppsa.models import GRU, LSTM, RNN
from paper_figures.result_files import methods as names

LENGTH, BATCH, HIDDEN = 1000, 16, 20
METHODS = {
    names.AUTO: bppsa.Auto(),
    names.BLELLOCH: bppsa.Blelloch(),
    names.CHUNKED: bppsa.Chunked(),
    names.SEQUENTIAL_JACOBIANS: bppsa.SequentialScan(),
    names.SEQUENTIAL: bppsa.Sequential(),
}
OUT = pathlib.Path("results/gradient_error.json")


def reference_loss(cell, params, head, xs, labels):
    def one(x):
        state = cell.initial_state(HIDDEN, x.dtype)
        state, _ = jax.lax.scan(lambda s, x_t: (cell(params, s, x_t), None), state, x)
        return head["weight"] @ cell.output(state) + head["bias"]

    logits = jax.vmap(one)(xs)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


def max_relative_difference(actual, expected) -> float:
    """``max over leaves of max|a - b| / max|b|``."""
    errors = [
        float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))
        for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True)
    ]
    return max(errors)


def main() -> None:
    rows = []
    for dtype_name in ("float32", "float64"):
        with jax.enable_x64(dtype_name == "float64"), jax.default_matmul_precision("highest"):
            dtype = jnp.dtype(dtype_name)
            xs, labels = Bitstreams(length=LENGTH).batch("train", iteration=0, batch_size=BATCH)
            xs = jnp.asarray(xs, dtype)
            for name, cell in (("RNN", RNN()), ("GRU", GRU()), ("LSTM", LSTM())):
                model = bppsa.models.SequenceClassifier(1, HIDDEN, 10, cell=cell)
                params = model.init(key=jax.random.key(1), dtype=dtype)
                ref = jax.jit(jax.grad(reference_loss, argnums=(1, 2)), static_argnums=0)(
                    cell, params["cell"], params["head"], xs, labels
                )
                ref = {"cell": ref[0], "head": ref[1]}
                for method_name, method in METHODS.items():
                    grads = jax.jit(bppsa.grad(model.loss, method=method))(params, xs, labels)
                    error = max_relative_difference(grads, ref)
                    rows.append(dict(cell=name, dtype=dtype_name, method=method_name, error=error))
                    print(f"{name:<5} {dtype_name:<8} {method_name:<27} {error:.2e}")
    OUT.parent.mkdir(exist_ok=True)
    payload = dict(
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        jax=jax.__version__,
        length=LENGTH,
        batch=BATCH,
        hidden=HIDDEN,
        rows=rows,
    )
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(OUT)


if __name__ == "__main__":
    main()
