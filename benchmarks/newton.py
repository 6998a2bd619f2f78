"""The Newton forward (``bppsa.Newton``): iterations, fallbacks, wall-clock, critical path.

For the paper's RNN (input 1, hidden 20, on synthetic bitstreams; initial weights, weights
after a short training, and its recurrent weights scaled to be contractive (x0.5) or expansive
(x4, chaotic)) and its GRU on IRMAS shapes (24 features, hidden 20, standard-normal inputs), over
T from 100 to 100k, in float32 and float64, every example of a batch separately:

* Newton iterations (mean, max), the fallback rate (examples whose residual did not converge
  and whose rest was computed sequentially), the largest certified residual, and the relative
  difference of the final state from ``lax.scan``'s (past the Lyapunov time of a chaotic cell no
  two methods agree; the residual is then the measure);
* the dependent steps on the critical path of forward + backward, which decide the speed on a
  parallel device: BP ``2T``; sequential forward + BPPSA backward ``T + L + 2``; Newton + BPPSA
  ``k (L + 1) + 1 + F + L + 2``, with ``L = 2 ceil(log2(T + 1))`` the scan's levels, ``k`` the
  iterations (the batch's largest: the examples run together) and ``F`` the fallback's
  sequential steps;
* with ``--timing``: the forward's wall-clock on this machine against ``lax.scan`` (each
  standalone forward its own program), and for the gradients (BP; the Blelloch backward after
  the sequential and after the Newton forward; ``bppsa.scan`` with its defaults, ``auto``: Auto()
  and the forward's policy, whose choice and reason the row records, with the Newton run's
  iterations) their three quantities, each its own program
  (:class:`experiments.timing.GradientPrograms`): ``total`` (``jax.value_and_grad``), ``forward``
  (the forward of ``jax.vjp``, as it runs inside the gradient) and ``backward`` (its pullback on
  saved residuals), float32, every program timed round by round right after an untimed call of
  itself (:func:`experiments.timing.time_gradients`), median (``*_ms``) and minimum (``*_min_ms``);
  the row says ``"backward": "pullback"``;
* with ``--dense-quasi H T B``: quasi-Newton's forward on a dense autodiff GRU (its gates'
  weights stacked, no analytic Jacobian: the diagonals from its element-aligned paths) against
  ``lax.scan``, interleaved, with its iterations.

Rows are appended to a JSON-lines file as they finish (``--out``; a rerun skips the rows it
finds). Run: ``.venv/bin/python -m benchmarks.newton [--quick] [--timing]``; on a GPU,
``benchmarks/gpu.sh`` runs it; ``--dry-run`` checks the code path with tiny sizes.
"""

from __future__ import annotations

import argparse
import functools
import math
import pathlib
import platform
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bppsa
from bppsa.data.synthetic import Bitstreams
from bppsa.models import GRU, SequenceClassifier, gru_cell, rnn_cell
from experiments.timing import GradientPrograms, interleaved, ms_fields, time_gradients, timed
from paper_figures.result_files import PULLBACK, JsonLines

FULL_T = (100, 1_000, 10_000, 30_000, 100_000)
QUICK_T = (100, 1_000)
CASES = ("rnn-init", "rnn-trained", "rnn-contractive", "rnn-expansive", "gru-irmas")
DTYPES = ("float32", "float64")
TIMING_T = (1_000, 10_000)
TRAIN_STEPS, TRAIN_T = 300, 1_000  # a short training: Adam, lr 3e-4, batch 16
DRY_RUN = dict(lengths=(8,), timing_lengths=(8,), rounds=1, train_steps=2, dtypes=("float32",))


def batch_for(length: int) -> int:
    """Examples per configuration: 16 (the paper's batch) up to 10k steps, fewer above."""
    return 16 if length <= 10_000 else (4 if length <= 30_000 else 1)


def levels(length: int) -> int:
    return 2 * max(1, math.ceil(math.log2(length + 1)))


def critical_path(length: int, iterations: int, fallback: int) -> dict:
    """Dependent steps of one forward + backward (see the module docstring)."""
    scan = levels(length)
    return {
        "bp": 2 * length,
        "bppsa": length + scan + 2,
        "newton_bppsa": iterations * (scan + 1) + 1 + fallback + scan + 2,
    }


def trained_rnn(seed: int = 0, steps: int = TRAIN_STEPS) -> dict:
    """The paper's RNN classifier after a short training (Adam, lr 3e-4)."""
    model = SequenceClassifier(1, 20, 10)
    params = model.init(key=jax.random.key(seed))
    data = Bitstreams(length=TRAIN_T if steps == TRAIN_STEPS else 16, seed=seed)
    optimizer = optax.adam(3e-4)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, xs, labels):
        grads = bppsa.grad(model.loss)(params, xs, labels)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state

    for i in range(steps):
        xs, labels = data.batch("train", iteration=i, batch_size=16)
        params, state = step(params, state, xs, labels)
    return params["cell"]


def case(name: str, trained: dict | None):
    """``(cell, params, input_size)`` of a named case."""
    if name == "gru-irmas":
        return gru_cell, GRU().init(24, 20, key=jax.random.key(0)), 24
    params = SequenceClassifier(1, 20, 10).init(key=jax.random.key(0))["cell"]
    if name == "rnn-trained":
        params = trained
    elif name in ("rnn-contractive", "rnn-expansive"):
        scale = 0.5 if name == "rnn-contractive" else 4.0
        params = {**params, "weight_hh": scale * params["weight_hh"]}
    return rnn_cell, params, 1


def inputs(name: str, length: int, batch: int, size: int, dtype) -> jax.Array:
    if name == "gru-irmas":
        return jax.random.normal(jax.random.key(1), (batch, length, size), dtype)
    xs, _ = Bitstreams(length=length, seed=1).batch("test", iteration=0, batch_size=batch)
    return jnp.asarray(xs, dtype)


def scans(cell, params, dtype, forward):
    """Jitted batched forwards: bppsa.scan with ``forward`` and lax.scan."""
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), params)
    body = lambda h, x: (cell(params, h, x), None)  # noqa: E731
    h0 = jnp.zeros(20, dtype)
    newton = jax.jit(jax.vmap(lambda xs: bppsa.scan(body, h0, xs, forward=forward)[0]))
    reference = jax.jit(jax.vmap(lambda xs: jax.lax.scan(body, h0, xs)[0]))
    return newton, reference


def count_row(name, length, dtype_name, quasi, trained, batch=None) -> dict:
    dtype = jnp.dtype(dtype_name)
    cell, params, size = case(name, trained)
    batch = batch or batch_for(length)
    infos: list[dict] = []

    def record(info):
        infos.append({k: np.asarray(v).tolist() for k, v in info._asdict().items()})

    newton, reference = scans(cell, params, dtype, bppsa.Newton(quasi=quasi, callback=record))
    xs = inputs(name, length, batch, size, dtype)
    h, seconds = timed(newton, xs)  # compilation included
    h_ref = reference(xs)
    per_example = _per_example(infos, batch)
    iterations = [i["iterations"] for i in per_example]
    fallbacks = [i["fallback_steps"] for i in per_example]
    scale = float(jnp.max(jnp.abs(h_ref)))
    return {
        "case": name,
        "T": length,
        "B": batch,
        "dtype": dtype_name,
        "quasi": quasi,
        "iterations_mean": statistics.fmean(iterations),
        "iterations_max": max(iterations),
        "fallback_rate": sum(not i["converged"] for i in per_example) / batch,
        "fallback_steps_max": max(fallbacks),
        "residual_max": max(i["residual"] for i in per_example),
        "tolerance": bppsa.Newton().tolerance(dtype),
        "difference_from_lax_scan": float(jnp.max(jnp.abs(h - h_ref))) / max(scale, 1e-30),
        "critical_path": critical_path(length, max(iterations), max(fallbacks)),
        "first_call_s": seconds,
    }


def _per_example(infos: list[dict], batch: int) -> list[dict]:
    """One info per example: ``jax.debug.callback`` under ``jax.vmap`` calls once per example
    (or once with batched values, on some versions)."""
    if len(infos) == batch:
        return infos
    (info,) = infos
    return [{k: np.ravel(v)[b].item() for k, v in info.items()} for b in range(batch)]


def gradient_loss(cell, scan, params, xs):
    """A loss on the batch's final states, its scan ``scan``."""
    body = lambda h, x: (cell(params, h, x), None)  # noqa: E731
    h0 = jnp.zeros(20, jnp.float32)
    return jnp.sum(jax.vmap(lambda xs: scan(body, h0, xs)[0])(xs) ** 2)


def gradient_programs(cell, params, xs) -> dict[str, GradientPrograms]:
    """The gradients of :func:`gradient_loss`, each as its three programs: BP (``jax.grad``
    through ``lax.scan``), ``bppsa.scan``'s Blelloch backward after the sequential forward and
    after the Newton forward (bound in the loss), and ``bppsa.scan`` with its defaults."""
    blelloch = functools.partial(bppsa.scan, method=bppsa.Blelloch())
    scans = {
        "bp": jax.lax.scan,
        "blelloch": functools.partial(blelloch, forward="sequential"),
        "newton_blelloch": functools.partial(blelloch, forward=bppsa.Newton()),
        "auto": bppsa.scan,
    }
    return {
        name: GradientPrograms.from_loss(functools.partial(gradient_loss, cell, scan), params, xs)
        for name, scan in scans.items()
    }


def default_choice(cell, params, xs) -> dict:
    """What ``bppsa.scan``'s defaults choose for the gradient (traced once, nothing run), and
    the iterations of the Newton forward on these inputs (the batch's largest)."""
    with bppsa.trace_plans() as plans:
        jax.eval_shape(jax.grad(functools.partial(gradient_loss, cell, bppsa.scan)), params, xs)
    (plan,) = plans
    infos: list[dict] = []

    def record(info):
        infos.append({k: np.asarray(v).tolist() for k, v in info._asdict().items()})

    newton = functools.partial(bppsa.scan, forward=bppsa.Newton(callback=record))
    jax.block_until_ready(jax.jit(functools.partial(gradient_loss, cell, newton))(params, xs))
    per_example = _per_example(infos, xs.shape[0])
    return {
        "auto_method": repr(plan.method),
        "auto_forward": repr(plan.forward),
        "auto_forward_because": plan.forward_because,
        "newton_iterations_max": max(i["iterations"] for i in per_example),
        "newton_fallback_rate": sum(not i["converged"] for i in per_example) / len(per_example),
    }


def timing_row(length: int, rounds: int, name: str = "rnn-init", batch: int | None = None) -> dict:
    """Wall-clock of the forward (Newton, full and quasi, against lax.scan) and the three
    quantities of a whole gradient (BP; Blelloch backward after the sequential and after the
    Newton forward; the defaults), each its own program, interleaved; case ``name``."""
    cell, params, size = case(name, None)
    batch = batch or batch_for(length)
    xs = inputs(name, length, batch, size, jnp.float32)
    full, reference = scans(cell, params, jnp.float32, bppsa.Newton())
    quasi, _ = scans(cell, params, jnp.float32, bppsa.Newton(quasi=True))
    forwards = {"lax_scan": reference, "newton": full, "newton_quasi": quasi}
    programs = gradient_programs(cell, params, xs)
    others = {name: functools.partial(fn, xs) for name, fn in forwards.items()}
    times = time_gradients(programs, rounds, others=others)
    row = {"case": "timing", "cell": name, "T": length, "B": batch, "dtype": "float32"}
    row |= {"rounds": rounds, "backward": PULLBACK} | default_choice(cell, params, xs)
    for name in forwards:
        row |= ms_fields(times[name])
    for name, program in programs.items():
        row |= {f"{name}_{field}": ms for field, ms in ms_fields(times[name]).items()}
        row[f"{name}_backward_kernel_ms"] = program.backward_kernel_ms()  # on a GPU only
    for key in ("newton", "newton_quasi"):
        row[f"{key}_over_lax_scan_median"] = row[f"{key}_ms"] / row["lax_scan_ms"]
    for key in ("blelloch", "newton_blelloch", "auto"):
        for quantity in ("total", "backward"):
            ratio = row[f"{key}_{quantity}_ms"] / row[f"bp_{quantity}_ms"]
            row[f"{key}_{quantity}_over_bp_median"] = ratio
    return row


def dense_gru(hidden: int, inputs: int, key=None):
    """A GRU written as a user writes one (gates' weights stacked, no analytic Jacobian): its
    Jacobians are dense autodiff ones, whose diagonals quasi-Newton gets from the cell's
    element-aligned paths (``bppsa/scan/_core/diagonal_paths.py``)."""
    params = GRU().init(inputs, hidden, key=key if key is not None else jax.random.key(0))

    def cell(params, h, x):
        gi = params["weight_ih"] @ x + params["bias_ih"]
        gh = params["weight_hh"] @ h + params["bias_hh"]
        r = jax.nn.sigmoid(gi[:hidden] + gh[:hidden])
        z = jax.nn.sigmoid(gi[hidden : 2 * hidden] + gh[hidden : 2 * hidden])
        n = jnp.tanh(gi[2 * hidden :] + r * gh[2 * hidden :])
        return (1 - z) * n + z * h

    return cell, params


def dense_quasi_row(hidden: int, length: int, batch: int, rounds: int) -> dict:
    """Wall-clock of the forward of a dense autodiff GRU: ``lax.scan`` against quasi-Newton
    (each iteration ``O(H)`` per step beyond the cell), interleaved, with its iterations."""
    cell, params = dense_gru(hidden, 24)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    xs = jax.random.normal(jax.random.key(1), (batch, length, 24), jnp.float32)
    infos = []
    newton = bppsa.Newton(quasi=True, callback=infos.append)
    body = lambda h, x: (cell(params, h, x), None)  # noqa: E731
    h0 = jnp.zeros(hidden, jnp.float32)
    quasi = jax.jit(jax.vmap(lambda xs: bppsa.scan(body, h0, xs, forward=newton)[0]))
    reference = jax.jit(jax.vmap(lambda xs: jax.lax.scan(body, h0, xs)[0]))
    difference = float(jnp.max(jnp.abs(quasi(xs) - reference(xs))))
    calls = {
        "lax_scan": functools.partial(reference, xs),
        "newton_quasi": functools.partial(quasi, xs),
    }
    times = interleaved(calls, rounds)
    iterations = [int(np.max(info.iterations)) for info in infos]
    row = {"case": "dense-quasi", "cell": "gru-autodiff", "H": hidden, "T": length, "B": batch}
    row |= {"dtype": "float32", "rounds": rounds, "iterations_max": max(iterations)}
    row |= {"converged": bool(np.all(infos[-1].converged)), "difference": difference}
    row |= ms_fields(times)
    row["newton_quasi_over_lax_scan_median"] = row["newton_quasi_ms"] / row["lax_scan_ms"]
    return row


def _done(log: JsonLines) -> set:
    """The configurations a log already has rows for."""
    return {
        (row["case"], row["T"], row["dtype"], row.get("quasi", False), row.get("B"))
        + ((row.get("cell", "rnn-init"),) if row["case"] == "timing" else ())
        + ((row["H"],) if row["case"] == "dense-quasi" else ())
        for row in log.read()
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"T in {QUICK_T} only")
    parser.add_argument("--timing", action="store_true", help="also time the forward")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--lengths", nargs="+", type=int, help="T grid (default: the full one)")
    parser.add_argument("--timing-lengths", nargs="+", type=int, default=list(TIMING_T))
    parser.add_argument(
        "--timing-cases", nargs="+", choices=("rnn-init", "gru-irmas"), default=["rnn-init"]
    )
    parser.add_argument(
        "--timing-batches", nargs="+", type=int, help="B of the timing rows (default: 16 to 10k)"
    )
    parser.add_argument("--batch", type=int, help="examples per row (default: 16 up to T = 10k)")
    parser.add_argument(
        "--dense-quasi",
        nargs=3,
        type=int,
        action="append",
        metavar=("H", "T", "B"),
        help="also time quasi-Newton's forward on a dense autodiff GRU (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes: checks the code path")
    parser.add_argument("--require-backend", help="stop at once unless JAX runs on this backend")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="JSON-lines results")
    args = parser.parse_args(argv)
    if args.require_backend and jax.default_backend() != args.require_backend:
        raise SystemExit(
            f"benchmarks.newton: JAX's backend is {jax.default_backend()!r}, not "
            f"{args.require_backend!r}."
        )
    if args.dry_run:
        args.lengths, args.timing_lengths = DRY_RUN["lengths"], DRY_RUN["timing_lengths"]
        args.rounds, args.dtypes = DRY_RUN["rounds"], DRY_RUN["dtypes"]
    out = args.out or pathlib.Path(
        f"benchmarks/results/newton_{'quick' if args.quick else 'cpu'}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    log = JsonLines(out)
    done = _done(log)
    if not done:
        log.append({"case": "machine", "T": 0, "dtype": "", "platform": platform.platform(),
                      "devices": str(jax.devices()), "jax": jax.__version__})  # fmt: skip
    lengths = args.lengths or (QUICK_T if args.quick else FULL_T)
    steps = DRY_RUN["train_steps"] if args.dry_run else TRAIN_STEPS
    trained = trained_rnn(steps=steps) if "rnn-trained" in args.cases else None
    plan = [
        (name, length, dtype, quasi)
        for length in lengths
        for name in args.cases
        for dtype in args.dtypes
        for quasi in ((False, True) if name in ("rnn-init", "gru-irmas") else (False,))
        if not (quasi and dtype == "float64")
    ]
    with jax.enable_x64(True):
        for name, length, dtype, quasi in plan:
            if (name, length, dtype, quasi, args.batch or batch_for(length)) in done:
                continue
            row = count_row(name, length, dtype, quasi, trained, args.batch)
            log.append(row)
            print(_summary(row), flush=True)
    if args.timing:
        for length in args.timing_lengths[:1] if args.quick else args.timing_lengths:
            for name in args.timing_cases:
                for batch in args.timing_batches or [batch_for(length)]:
                    if ("timing", length, "float32", False, batch, name) in done:
                        continue
                    row = timing_row(length, args.rounds, name, batch)
                    log.append(row)
                    print(row, flush=True)
    for hidden, length, batch in args.dense_quasi or []:
        if ("dense-quasi", length, "float32", False, batch, hidden) in done:
            continue
        row = dense_quasi_row(hidden, length, batch, args.rounds)
        log.append(row)
        print(row, flush=True)


def _summary(row: dict) -> str:
    path = row["critical_path"]
    return (
        f"{row['case']:16s} T={row['T']:>6} {row['dtype']} quasi={row['quasi']!s:5} "
        f"iterations {row['iterations_mean']:.1f} (max {row['iterations_max']}) "
        f"fallback {row['fallback_rate']:.2f} residual {row['residual_max']:.1e} "
        f"diff {row['difference_from_lax_scan']:.1e} | critical path BP {path['bp']} "
        f"BPPSA {path['bppsa']} Newton+BPPSA {path['newton_bppsa']}"
    )


if __name__ == "__main__":
    main()
