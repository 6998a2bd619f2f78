"""A small built-in demo: gradients of the paper's RNN and GRU classifiers by back-propagation
and by BPPSA, with their agreement and their times.

Run with ``make demo`` (or ``python -m experiments.demo``). Uses only the public API.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, RNN, SequenceClassifier

LENGTH, BATCH, HIDDEN, CLASSES = 1000, 16, 20, 10
REPEATS = 5


def bitstreams(key, batch, length):
    """The paper's synthetic data: class k is a Bernoulli(0.05 + 0.1 k) bitstream."""
    k_label, k_bits = jax.random.split(key)
    labels = jax.random.randint(k_label, (batch,), 0, CLASSES)
    probs = 0.05 + 0.1 * labels
    bits = jax.random.uniform(k_bits, (batch, length)) < probs[:, None]
    return bits.astype(jnp.float32)[..., None], labels


def median_seconds(fn, *args):
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def max_relative_difference(a, b):
    return max(
        float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1e-30))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def main() -> None:
    xs, labels = bitstreams(jax.random.key(0), BATCH, LENGTH)
    platform = jax.devices()[0].platform
    print(f"bppsa {bppsa.__version__} on {platform}: T={LENGTH}, B={BATCH}, H={HIDDEN}")
    methods = {"auto": bppsa.Auto(), "blelloch": bppsa.Blelloch()}
    print(f"BPPSA's automatic choice here: {bppsa.Auto().choose(LENGTH, HIDDEN)}")
    header = " ".join(f"{m + ' (ms)':>14} {'rel. diff':>9}" for m in methods)
    print(f"{'cell':<5} {'BP (ms)':>9} {header}")
    for name, cell in (("RNN", RNN()), ("GRU", GRU())):
        model = SequenceClassifier(1, HIDDEN, CLASSES, cell=cell)
        params = model.init(key=jax.random.key(1))
        bp = jax.jit(bppsa.grad(model.loss, method="sequential"))
        reference = bp(params, xs, labels)
        row = f"{name:<5} {1e3 * median_seconds(bp, params, xs, labels):>9.1f}"
        for method in methods.values():
            grad = jax.jit(bppsa.grad(model.loss, method=method))
            difference = max_relative_difference(grad(params, xs, labels), reference)
            row += f" {1e3 * median_seconds(grad, params, xs, labels):>14.1f} {difference:>9.1e}"
        print(row)
    print("Times: medians of forward + backward after warm-up, on this machine.")
    print("rel. diff: max |g - g_BP| / max |g_BP| over the gradient leaves.")


if __name__ == "__main__":
    main()
