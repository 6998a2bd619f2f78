"""Total gradient time of ``bppsa.grad``'s default against ``jax.grad``, one sequence at a time.

The paper's cells (input 1, hidden ``H``; the RNN by default) over ONE sequence (no batch
axis: a long recording, a language model's single stream), loss on the final state; the whole
jitted gradient call is timed, for ``jax.grad`` through ``lax.scan`` and for ``bppsa.grad``
through ``bppsa.scan`` with the default method (``Auto()``), interleaved round by round in one
process, minimum and median over the rounds after a warm-up call. What ``Auto()`` ran is
recorded beside the times. The JSON is rewritten atomically after every row.

Run: ``.venv/bin/python -m benchmarks.total --lengths 1000 10000 100000 1000000 --out FILE``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, LSTM, RNN, gru_cell, lstm_cell, rnn_cell
from experiments import _timing
from results_io import write_json

CELLS = {"rnn": (RNN, rnn_cell), "gru": (GRU, gru_cell), "lstm": (LSTM, lstm_cell)}


def problem(length: int, hidden: int, cell: str = "rnn"):
    kind, step = CELLS[cell]
    params = kind().init(1, hidden, key=jax.random.key(0))
    xs = jax.random.bernoulli(jax.random.key(1), 0.3, (length, 1)).astype(jnp.float32)
    head = jax.random.normal(jax.random.key(2), (hidden,)) / hidden
    init = jnp.zeros(hidden) if cell != "lstm" else (jnp.zeros(hidden), jnp.zeros(hidden))

    def loss(scan, params):
        carry, _ = scan(lambda h, x: (step(params, h, x), None), init, xs)
        return jnp.dot(head, jax.tree.leaves(carry)[-1])

    return params, loss


def measure(length: int, hidden: int, repeats: int, cell: str = "rnn") -> dict:
    params, loss = problem(length, hidden, cell)
    calls = {
        "bp": jax.jit(jax.grad(lambda p: loss(jax.lax.scan, p))),
        "bppsa": jax.jit(bppsa.grad(lambda p: loss(bppsa.scan, p))),
    }
    with bppsa.trace_plans() as plans:
        for call in calls.values():
            jax.block_until_ready(call(params))  # compile and warm up
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call(params))
            times[name].append(time.perf_counter() - start)
    row = {"cell": cell, "length": length, "hidden": hidden, "batch": 1}
    row["ran"] = repr(plans[0].backward)
    row |= _timing.min_median(times)
    row["speedup_min"] = row["bp_min_s"] / row["bppsa_min_s"]
    row["speedup_median"] = row["bp_median_s"] / row["bppsa_median_s"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--cells", nargs="+", default=["rnn"], choices=list(CELLS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/total.json"))
    args = parser.parse_args(argv)
    data = {"jax": jax.__version__, "backend": jax.default_backend(), "argv": sys.argv, "rows": []}
    for cell, length in [(c, t) for c in args.cells for t in args.lengths]:
        row = measure(length, args.hidden, args.repeats, cell)
        data["rows"].append(row)
        write_json(args.out, data)
        bp, ours = row["bp_min_s"] * 1e3, row["bppsa_min_s"] * 1e3
        speedups = f"min {row['speedup_min']:.2f}x  median {row['speedup_median']:.2f}x"
        print(
            f"{cell} T={length:>8} BP {bp:9.2f} ms  bppsa {ours:9.2f} ms  {speedups}  {row['ran']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
