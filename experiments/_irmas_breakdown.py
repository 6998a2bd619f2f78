"""Runtime breakdown of one training iteration of the GRU classifier (the paper's Fig. 9).

The paper splits an iteration into the forward pass (FP), the BPPSA backward, the forward
overhead of building the transposed Jacobians (FO; its PyTorch artifact built them in the
forward), and, for the baseline, the BP backward. Here every part is its own compiled program
(:mod:`experiments.timing`), never a difference of two:

* ``bp_s`` and ``bppsa_s``: the whole gradient, ``jax.value_and_grad`` of the loss with the
  baseline (``bp``: ``jax.grad`` through ``lax.scan``) and with the BPPSA method bound inside it
  (:func:`experiments.methods.bind`);
* ``bp_forward_s`` and ``bppsa_forward_s``: the forward as it runs inside each gradient, the
  forward of ``jax.vjp`` (the loss and the residuals the backward needs);
* ``bp_backward_s`` and ``bppsa_backward_s``: each backward as its own program, the pullback of
  that ``jax.vjp`` applied to saved residuals. ``bppsa`` builds the transposed Jacobians at the
  start of its backward (inside ``bppsa.scan``'s custom VJP; its residuals are the states), so
  FO is INSIDE ``bppsa_backward_s``;
* ``jacobians_s``: FO timed on its own: every step's transposed Jacobian from the analytic
  builder :func:`bppsa.jacobians.gru_jacobian_t`, on all steps at once from the saved states
  (the gates recomputed from them), as the library's backward does. It is a part of
  ``bppsa_backward_s`` measured apart, not subtracted from anything: with ``Auto()`` on a CPU
  the library builds the Jacobians per time block, and then it is a model of that part.

The optimizer update is not included (it is the same for both methods).

Protocol: the programs are compiled ahead of time; then in each of ``repeats`` rounds, on that
round's batch, each is timed once right after an untimed call of itself
(:func:`experiments.timing.interleaved`; each backward on the residuals of an untimed forward call
on the batch). Each time is the median over the rounds (quartiles are kept too). Rows say
``"backward": "pullback"``.
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

import bppsa
from bppsa.jacobians import gru_jacobian_t
from bppsa.models import SequenceClassifier
from experiments._records import resume_points
from experiments.methods import bind
from experiments.timing import QUANTITIES, GradientPrograms, interleaved, quartiles
from paper_figures.result_files import PULLBACK, JsonLines

BREAKDOWN_LOG = "breakdown.jsonl"
GRADIENTS = ("bp", "bppsa")
_DIGITS = 7


def step_states(model: SequenceClassifier, params: dict, xs) -> jax.Array:
    """The state that enters every step of ``xs: (B, T, I)``: ``(B, T, H)``, ``h_{t-1}``."""
    cell_params = params["cell"]

    def one(x):  # x: (T, I)
        def body(h, x_t):
            return model.cell(cell_params, h, x_t), h  # keeps h_{t-1}

        state0 = model.cell.initial_state(model.hidden_size, x.dtype)
        return jax.lax.scan(body, state0, x)[1]

    return jax.vmap(one)(xs)


def jacobians(model: SequenceClassifier, params: dict, xs, before):
    """Every step's transposed Jacobian from the states ``before: (B, T, H)`` that entered the
    steps of ``xs: (B, T, I)``, all steps at once (as the library's backward builds them).

    Returns:
        ``(d, e)``: the diagonal factors of ``J_t^T = W_hh^T diag(d_t) R + diag(e_t)``,
        ``d: (B, T, 3H)``, ``e: (B, T, H)`` (the shared ``W_hh^T`` is not copied).
    """
    jac_t = jax.vmap(lambda h, x: gru_jacobian_t(params["cell"], h, x))(before, xs)
    return jac_t.d, jac_t.e


def gradient_losses(model: SequenceClassifier, method: bppsa.Method) -> dict[str, Callable]:
    """The losses whose gradients are timed, each with its backward method bound inside it."""
    return {
        "bp": bind(model.loss, method=bppsa.Sequential()),
        "bppsa": bind(model.loss, method=method),
    }


def measure(
    model: SequenceClassifier,
    params: dict,
    batches: Sequence[tuple[Any, Any]],
    method: bppsa.Method,
    repeats: int,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Times the parts on ``batches`` (round ``r`` uses ``batches[r % len(batches)]``).

    Returns:
        Medians in seconds: ``bp_s``, ``bppsa_s``, ``bp_forward_s``, ``bppsa_forward_s``,
        ``bp_backward_s``, ``bppsa_backward_s`` and ``jacobians_s``; their ``quartiles``,
        ``compile_s``, ``repeats`` and ``"backward": "pullback"``.
    """
    if repeats < 1 or not batches:
        raise ValueError(f"need repeats >= 1 and a batch; got {repeats} and {len(batches)}.")
    first = batches[0]
    programs = {
        name: GradientPrograms.from_loss(loss, params, *first)
        for name, loss in gradient_losses(model, method).items()
    }
    compile_s = {
        name: {q: round(s, 3) for q, s in p.compile_seconds.items()} for name, p in programs.items()
    }
    states = jax.jit(functools.partial(step_states, model))
    start = time.perf_counter()
    build = jax.jit(functools.partial(jacobians, model))
    build = build.lower(params, first[0], states(params, first[0])).compile()
    compile_s["jacobians"] = round(time.perf_counter() - start, 3)
    times: dict[str, list[float]] = {}
    for r in range(repeats):
        batch = batches[r % len(batches)]
        xs = batch[0]
        calls = {
            (name, quantity): call
            for name, program in programs.items()
            for quantity, call in _calls(program, params, batch).items()
        }
        calls["jacobians", None] = functools.partial(build, params, xs, states(params, xs))
        for key, ts in interleaved(calls, rounds=1).items():
            times.setdefault(_field(*key), []).extend(ts)
        if progress is not None:
            progress()
    medians = {field: round(statistics.median(ts), _DIGITS) for field, ts in times.items()}
    return medians | {
        "quartiles": {field: quartiles(ts, _DIGITS) for field, ts in times.items()},
        "compile_s": compile_s,
        "repeats": repeats,
        "backward": PULLBACK,
    }


def _calls(programs: GradientPrograms, params, batch) -> dict[str, Callable[[], Any]]:
    """The three programs bound to ``batch``; the backward to the residuals of an untimed
    forward call on it."""
    _, pullback = programs.forward(params, *batch)
    return {
        "total": functools.partial(programs.total, params, *batch),
        "forward": functools.partial(programs.forward, params, *batch),
        "backward": functools.partial(programs.backward, pullback, programs.cotangent),
    }


def _field(name: str, quantity: str | None) -> str:
    """``bp_s``, ``bppsa_forward_s``, ``jacobians_s``, ...: a quantity's field in a row."""
    if quantity is None:
        return f"{name}_s"
    return f"{name}_s" if quantity == QUANTITIES[0] else f"{name}_{quantity}_s"


def run_breakdown(
    points: Iterable[dict[str, Any]],
    measure_point: Callable[[dict[str, Any]], dict[str, Any]],
    out_dir: str | pathlib.Path,
    config: dict[str, Any],
    *,
    overwrite: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measures every point not yet in ``out_dir/breakdown.jsonl``; returns all point rows.

    The log holds a ``sweep`` row (run metadata with ``config``) per session and a ``point`` row
    per measured point, so a restarted run measures only the missing points.

    Raises:
        ResultsFolderError: when ``out_dir`` holds a breakdown with another configuration.
    """
    log = JsonLines(pathlib.Path(out_dir) / BREAKDOWN_LOG)
    if overwrite:
        log.path.unlink(missing_ok=True)
    return resume_points(log, config, points, measure_point, what="breakdown", on_point=on_point)


def table(rows: Iterable[dict[str, Any]]) -> str:
    """One line per point: the parts (ms; each its own program, the Jacobians a part of BPPSA's
    backward timed apart) and BPPSA's speedups over BP, of the backward and of the whole
    gradient."""
    lines = [
        f"{'var':<3} {'B':>3} {'T':>5} {'F':>3} {'BP fwd':>9} {'BPPSA fwd':>9} {'BP bwd':>9} "
        f"{'BPPSA bwd':>9} {'Jacobians':>9} {'bwd x':>6} {'total x':>7}   (ms)"
    ]
    for row in rows:
        point = row["point"]
        lines.append(
            f"{point['variant']:<3} {point['batch']:>3} {row.get('frames', '-'):>5} "
            f"{row.get('features', '-'):>3} {_ms(row['bp_forward_s'])} "
            f"{_ms(row['bppsa_forward_s'])} {_ms(row['bp_backward_s'])} "
            f"{_ms(row['bppsa_backward_s'])} {_ms(row['jacobians_s'])} "
            f"{_x(row['bp_backward_s'], row['bppsa_backward_s']):>6} "
            f"{_x(row['bp_s'], row['bppsa_s']):>7}"
        )
    lines.append(
        "each its own program: forward of jax.vjp, its pullback (BPPSA's builds the Jacobians), "
        "the Jacobians alone"
    )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:>9.2f}"


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"
