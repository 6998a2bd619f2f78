"""Gradient time of ``bppsa.grad``'s default against ``jax.grad``, one sequence at a time: the
whole gradient, its forward and its backward, each timed as its own program.

The paper's cells (input 1, hidden ``H``; the RNN by default) over ONE sequence (no batch
axis: a long recording, a language model's single stream), loss on the final state; for
``jax.grad`` through ``lax.scan`` (``bp``) and for the gradient through ``bppsa.scan`` with the
default method, ``Auto()`` (``bppsa``), three programs each
(:class:`experiments.timing.GradientPrograms`): the whole gradient (``jax.value_and_grad``), the
forward of ``jax.vjp`` (the forward as it runs inside the gradient) and the jitted pullback applied
to saved residuals (the backward), all interleaved round by round in one process
(:func:`experiments.timing.time_gradients`: each timed call right after an untimed call of itself),
median and minimum over the rounds. No time is a difference of two programs (``"backward":
"pullback"`` in the file). On a GPU, each backward's device kernel time from the profiler
(``*_backward_kernel_ms``) cross-checks the pullback timed alone. What ``Auto()`` ran is recorded
beside the times. ``--precisions default`` also times ``bppsa`` with its own products at that
precision (``bppsa.grad``'s ``precision=``; fields ``bppsa_default_*``) in the same rounds: what
full-precision products cost on a GPU, where JAX's default is TF32. The JSON is rewritten atomically
after every row.

Run: ``.venv/bin/python -m benchmarks.total --lengths 1000 10000 100000 1000000 --out FILE``.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import GRU, LSTM, RNN, gru_cell, lstm_cell, rnn_cell
from experiments import timing
from paper_figures.result_files import PULLBACK, write_json

CELLS = {"rnn": (RNN, rnn_cell), "gru": (GRU, gru_cell), "lstm": (LSTM, lstm_cell)}
SCANS = {"bp": jax.lax.scan, "bppsa": bppsa.scan}  # the default method: Auto()


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


def measure(
    length: int,
    hidden: int,
    repeats: int,
    cell: str = "rnn",
    *,
    clock=time.perf_counter,
    precisions: tuple[str, ...] = (),
) -> dict:
    """One row: for ``bp`` and ``bppsa``, ``{name}_total_ms``, ``{name}_forward_ms``,
    ``{name}_backward_ms`` (medians), their ``_min_ms`` and ``{name}_backward_kernel_ms``; the
    speedups of BP over BPPSA (``overall_*`` of the totals, ``backward_*`` of the backwards);
    and what ``Auto()`` ran. ``clock``: of the timed rounds (a test passes a fake one).
    ``precisions``: the library's precisions to time ``bppsa`` at besides ``"highest"``."""
    params, loss = problem(length, hidden, cell)
    scans = dict(SCANS)
    for precision in precisions:
        if precision != "highest":
            scans[f"bppsa_{precision}"] = functools.partial(bppsa.scan, precision=precision)
    with bppsa.trace_plans() as plans:
        programs = {
            name: timing.GradientPrograms.from_loss(lambda p, scan=scan: loss(scan, p), params)
            for name, scan in scans.items()
        }
    times = timing.time_gradients(programs, repeats, clock=clock)
    row = {"cell": cell, "length": length, "hidden": hidden, "batch": 1}
    ran = [plan.backward or plan.method for plan in plans]  # the method: plain lax.scan
    row["ran"] = repr(ran[-1]) if ran else None  # the precision does not change it
    row["rounds"] = len(times["bp"]["total"])
    for name, program in programs.items():
        row |= {f"{name}_{key}": value for key, value in timing.ms_fields(times[name]).items()}
        row[f"{name}_backward_kernel_ms"] = program.backward_kernel_ms()
        row[f"{name}_compile_s"] = dict(program.compile_seconds)
    for quantity, label in (("total", "overall"), ("backward", "backward")):
        for stat in ("", "_min"):
            row[f"{label}_speedup{stat}"] = (
                row[f"bp_{quantity}{stat}_ms"] / row[f"bppsa_{quantity}{stat}_ms"]
            )
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--cells", nargs="+", default=["rnn"], choices=list(CELLS))
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/total.json"))
    parser.add_argument(
        "--precisions",
        nargs="*",
        default=[],
        choices=["highest", "high", "default"],
        help="also time bppsa with its own products at these precisions (bppsa_<precision>_*)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.hidden < 1 or any(t < 1 for t in args.lengths):
        parser.error("--repeats, --hidden and --lengths take positive ints")
    data = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "argv": sys.argv,
        "backward": PULLBACK,
        "precisions": args.precisions,
        "rows": [],
    }
    for cell, length in [(c, t) for c in args.cells for t in args.lengths]:
        row = measure(length, args.hidden, args.repeats, cell, precisions=args.precisions)
        data["rows"].append(row)
        write_json(args.out, data)
        times = "  ".join(
            f"{name}: total {row[f'{name}_total_ms']:9.2f} fwd {row[f'{name}_forward_ms']:9.2f} "
            f"bwd {row[f'{name}_backward_ms']:9.2f} ms"
            for name in SCANS
        )
        for precision in args.precisions:
            if f"bppsa_{precision}_total_ms" in row:
                times += f"  bppsa at {precision}: total {row[f'bppsa_{precision}_total_ms']:9.2f}"
        speedups = f"x{row['overall_speedup']:.2f} total, x{row['backward_speedup']:.2f} backward"
        print(f"{cell} T={length:>8} {times}  {speedups}  {row['ran']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
