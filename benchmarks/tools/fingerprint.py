"""Gradient fingerprints: a fixed set of cases whose gradients a refactor must not change.

Every case computes, in float32 on the CPU, the gradient of a fixed loss with one backward
method (scans over time with the library's cells and a user's cell, with losses on every step
and on the final carry; a small pruned convolutional chain; the Newton forward; a forward-mode
JVP) and stores the leaves. ``--check FILE`` recomputes them and compares bit by bit: a
refactor that only moves code must give the same bits, where a changed order of operations
would show as a difference of a few ulps.

Run: ``.venv/bin/python -m benchmarks.tools.fingerprint --record OUT.npz`` on the old tree, then
``--check OUT.npz`` on the new one. Cases are named, so the check lists any that differ.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import bppsa
from bppsa.models import (
    GRU,
    LSTM,
    RNN,
    Chain,
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    gru_cell,
    lstm_cell,
    magnitude_prune,
    rnn_cell,
)


def _sequential_scan():
    """The sequential scan over the Jacobians (spelled per release)."""
    if hasattr(bppsa, "SequentialScan"):
        return bppsa.SequentialScan()
    return bppsa.Sequential(jacobians=True)


def time_methods() -> dict:
    seq = _sequential_scan()
    return {
        "bp": bppsa.Sequential(),
        "seqscan": seq,
        "blelloch": bppsa.Blelloch(),
        "chunked": bppsa.Chunked(),
        "chunked3": bppsa.Chunked(3),
        "blocked": bppsa.Blocked(seq, 4),
        "blocked_blelloch": bppsa.Blocked(bppsa.Blelloch(), 5),
        "auto": bppsa.Auto(),
    }


def chain_methods() -> dict:
    return {
        "bp": bppsa.Sequential(),
        "seqscan": _sequential_scan(),
        "blelloch": bppsa.Blelloch(),
        "blelloch_l1": bppsa.Blelloch(levels=1),
        "blelloch_l2": bppsa.Blelloch(levels=2),
        "auto": bppsa.Auto(),
    }


def _cells():
    key = jax.random.key(0)
    return {
        "rnn": (RNN().init(2, 5, key=key), rnn_cell, 5),
        "gru": (GRU().init(2, 4, key=key), gru_cell, 4),
        "lstm": (LSTM().init(2, 3, key=key), lstm_cell, (3, 3)),
    }


def _init(size):
    if isinstance(size, tuple):
        return tuple(jnp.full(s, 0.1 * (i + 1), jnp.float32) for i, s in enumerate(size))
    return jnp.linspace(-0.5, 0.5, size, dtype=jnp.float32)


def time_cases() -> dict:
    """name -> a function of no arguments returning a pytree of arrays."""
    cases = {}
    for cell_name, (params, cell, size) in _cells().items():
        for length in (1, 5, 17, 100):
            xs = jax.random.normal(jax.random.key(length), (length, 2), jnp.float32)
            for method_name, method in time_methods().items():

                def final(params, cell=cell, size=size, xs=xs):
                    carry, _ = bppsa.scan(lambda h, x: (cell(params, h, x), None), _init(size), xs)
                    return sum(jnp.sum(jnp.sin(c)) for c in jax.tree.leaves(carry))

                def every(params, cell=cell, size=size, xs=xs):
                    def body(h, x):
                        h = cell(params, h, x)
                        return h, jax.tree.leaves(h)[-1]

                    _, ys = bppsa.scan(body, _init(size), xs)
                    return jnp.sum(ys**2)

                for loss_name, loss in (("final", final), ("every", every)):
                    grad = bppsa.grad(loss, method=method)
                    name = f"{cell_name}/T{length}/{loss_name}/{method_name}"
                    cases[name] = functools.partial(grad, params)
    # A user's cell (autodiff Jacobians), batched by vmap, over every method.
    w = 0.4 * jax.random.normal(jax.random.key(3), (4, 4), jnp.float32)
    xs = jax.random.normal(jax.random.key(4), (3, 23, 4), jnp.float32)
    for method_name, method in time_methods().items():

        def user(w, method=method):
            def one(x):
                carry, ys = bppsa.scan(lambda h, x: (jnp.tanh(w @ h + x), h.sum()), jnp.ones(4), x)
                return carry.sum() + ys.sum()

            return jax.vmap(one)(xs).sum()

        cases[f"user/vmap/{method_name}"] = functools.partial(bppsa.grad(user, method=method), w)
    # Newton's forward, and forward mode through the scan.
    params, cell, size = _cells()["gru"]
    xs = jax.random.normal(jax.random.key(5), (40, 2), jnp.float32)

    def newton_loss(params):
        carry, ys = bppsa.scan(
            lambda h, x: (cell(params, h, x), h), _init(size), xs, forward=bppsa.Newton()
        )
        return carry.sum() + jnp.sum(ys**2)

    for method_name in ("blelloch", "auto"):
        method = time_methods()[method_name]
        grad = bppsa.grad(newton_loss, method=method)
        cases[f"newton/gru/{method_name}"] = functools.partial(grad, params)
    for method_name in ("seqscan", "blelloch", "chunked"):
        method = time_methods()[method_name]

        def tangent(method=method):
            def run(h0):
                return bppsa.scan(lambda h, x: (cell(params, h, x), h), h0, xs, method=method)

            return jax.jvp(run, (_init(size),), (jnp.ones(size, jnp.float32),))

        cases[f"jvp/gru/{method_name}"] = tangent
    return cases


def chain_cases() -> dict:
    chain = Chain(
        [
            Conv2d(2, 4, 3, padding=1),
            ReLU(),
            MaxPool2d(2),
            Conv2d(4, 5, 3, stride=2),
            ReLU(),
            Flatten(),
            Linear(5 * 2 * 2, 3),
        ]
    )
    params = chain.init(jax.random.key(7))
    x = jax.random.normal(jax.random.key(8), (3, 2, 10, 10), jnp.float32)
    cases = {}
    for pruned in (None, 0.8):
        masks = None if pruned is None else magnitude_prune(params, pruned)

        def loss(params, masks=masks):
            return jnp.sum(jnp.tanh(chain.apply(params, x, masks=masks)))

        for method_name, method in chain_methods().items():
            name = f"chain/{'dense' if pruned is None else 'pruned'}/{method_name}"
            cases[name] = functools.partial(bppsa.grad(loss, method=method), params)
    return cases


def compute() -> dict[str, np.ndarray]:
    jax.config.update("jax_default_matmul_precision", "highest")
    out = {}
    for name, case in {**time_cases(), **chain_cases()}.items():
        for i, leaf in enumerate(jax.tree.leaves(case())):
            out[f"{name}#{i}"] = np.asarray(leaf)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="FILE")
    group.add_argument("--check", metavar="FILE")
    args = parser.parse_args(argv)
    values = compute()
    if args.record:
        folder = os.path.dirname(os.path.abspath(args.record))
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as f:
            np.savez_compressed(f, **values)
        os.replace(f.name, args.record)
        print(f"recorded {len(values)} arrays of {len({k.split('#')[0] for k in values})} cases")
        return 0
    recorded = dict(np.load(args.check))
    missing = sorted(set(recorded) ^ set(values))
    differ = []
    for key in sorted(set(recorded) & set(values)):
        a, b = recorded[key], values[key]
        if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            error = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("nan")
            differ.append((key, error, scale))
    same = len(recorded) - len(differ) - len(missing)
    print(f"{same} of {len(recorded)} arrays bit-identical; {len(differ)} differ")
    for key, error, scale in differ:
        print(f"  differs: {key}: max |diff| {error:.3g} (max |value| {scale:.3g})")
    for key in missing:
        print(f"  only in one of the two: {key}")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
