"""Runtime breakdown of one training iteration of the GRU classifier (the paper's Fig. 9).

The paper splits an iteration into the forward pass (FP), the BPPSA backward, the forward
overhead of building the transposed Jacobians (FO; its PyTorch artifact built them in the
forward), and, for the baseline, the BP backward. ``bppsa`` builds the Jacobians at the start of
its backward (inside ``bppsa.scan``'s custom VJP), so FO is measured on its own, with public API:

* ``forward_s``: the jitted loss (the scan keeps only its last state);
* ``forward_jacobians_s``: the same forward keeping every state, plus every step's transposed
  Jacobian from the analytic builder :func:`bppsa.jacobians.gru_jacobian_t`, evaluated on all
  steps at once as the library's backward does (the gates are recomputed from the states, as
  there). ``jacobians_s = forward_jacobians_s - forward_s`` is FO;
* ``bp_s`` and ``bppsa_s``: ``bppsa.value_and_grad`` of the loss with the baseline (``bp``:
  ``jax.grad`` through ``lax.scan``) and the BPPSA method (forward and backward).

Then ``bp_backward_s = bp_s - forward_s`` (the paper's definition) and
``bppsa_backward_s = bppsa_s - forward_s - jacobians_s``, so that FP + FO + BPPSA backward is the
BPPSA total. The optimizer update is not included (it is the same for both methods).

Protocol: the four functions are compiled ahead of time and called once untimed; then in each
of ``repeats`` rounds each is timed once (``jax.block_until_ready``) on that round's batch, the
order rotating from round to round so that load from elsewhere on a shared machine spreads over
all of them alike. Each time is the median over the rounds (quartiles are kept too). With
``Auto()`` on a CPU the library builds the Jacobians per time block inside the backward; the
split is then a model of where its time goes, not a trace of it.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import optax

import bppsa
from bppsa.jacobians import gru_jacobian_t
from bppsa.models import SequenceClassifier
from experiments import _timing
from experiments._records import resume_points
from experiments._timing import timed
from results_io import JsonLines

BREAKDOWN_LOG = "breakdown.jsonl"
PHASES = ("forward", "forward_jacobians", "bp", "bppsa")
_DIGITS = 7


def forward_with_jacobians(model: SequenceClassifier, params: dict, xs, labels):
    """The loss of ``xs: (B, T, I)``, and the stacked transposed Jacobians of every step.

    Returns:
        ``(loss, (d, e))``: the diagonal factors of ``J_t^T = W_hh^T diag(d_t) R + diag(e_t)``,
        ``d: (B, T, 3H)``, ``e: (B, T, H)`` (the shared ``W_hh^T`` is not copied).
    """
    cell_params = params["cell"]

    def one(x):  # x: (T, I)
        def body(h, x_t):
            return model.cell(cell_params, h, x_t), h  # keeps h_{t-1}

        state0 = model.cell.initial_state(model.hidden_size, x.dtype)
        last, before = jax.lax.scan(body, state0, x)
        jac_t = gru_jacobian_t(cell_params, before, x)  # all T steps at once
        head = params["head"]
        return head["weight"] @ last + head["bias"], (jac_t.d, jac_t.e)

    logits, jacobians = jax.vmap(one)(xs)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, jacobians


def phase_functions(
    model: SequenceClassifier, method: bppsa.Method
) -> dict[str, Callable[..., Any]]:
    """The four timed functions of ``(params, xs, labels)``, not yet jitted."""
    return {
        "forward": model.loss,
        "forward_jacobians": lambda p, x, y: forward_with_jacobians(model, p, x, y),
        "bp": bppsa.value_and_grad(model.loss, method=bppsa.Sequential()),
        "bppsa": bppsa.value_and_grad(model.loss, method=method),
    }


def measure(
    model: SequenceClassifier,
    params: dict,
    batches: Sequence[tuple[Any, Any]],
    method: bppsa.Method,
    repeats: int,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Times the phases on ``batches`` (round ``r`` uses ``batches[r % len(batches)]``).

    Returns:
        ``{"forward_s", "forward_jacobians_s", "bp_s", "bppsa_s"}`` medians, the derived
        ``jacobians_s``, ``bp_backward_s``, ``bppsa_backward_s``, ``quartiles`` of the measured
        ones, ``compile_s`` and ``repeats``.
    """
    if repeats < 1 or not batches:
        raise ValueError(f"need repeats >= 1 and a batch; got {repeats} and {len(batches)}.")
    compiled, compile_s = {}, {}
    for name, fn in phase_functions(model, method).items():
        start = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(params, *batches[0]).compile()
        compile_s[name] = round(time.perf_counter() - start, 3)
        jax.block_until_ready(compiled[name](params, *batches[0]))  # untimed first call
    times: dict[str, list[float]] = {name: [] for name in PHASES}
    for r in range(repeats):
        batch = batches[r % len(batches)]
        for k in range(len(PHASES)):
            name = PHASES[(r + k) % len(PHASES)]
            times[name].append(timed(compiled[name], params, *batch)[1])
        if progress is not None:
            progress()
    medians = {f"{name}_s": statistics.median(times[name]) for name in PHASES}
    forward, jacobians = medians["forward_s"], medians["forward_jacobians_s"] - medians["forward_s"]
    derived = dict(
        jacobians_s=jacobians,
        bp_backward_s=medians["bp_s"] - forward,
        bppsa_backward_s=medians["bppsa_s"] - forward - jacobians,
    )
    quartiles = {f"{name}_s": _timing.quartiles(times[name], _DIGITS) for name in PHASES}
    return {k: round(v, _DIGITS) for k, v in (medians | derived).items()} | {
        "quartiles": quartiles,
        "compile_s": compile_s,
        "repeats": repeats,
    }


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
    """One line per point: the four parts (ms) and the backward speedup of BPPSA over BP."""
    lines = [
        f"{'var':<3} {'B':>3} {'T':>5} {'F':>3} {'forward':>9} {'Jacobians':>9} "
        f"{'BPPSA bwd':>9} {'BP bwd':>9} {'bwd x':>6} {'total x':>7}   (ms)"
    ]
    for row in rows:
        point = row["point"]
        bppsa_bwd = row["jacobians_s"] + row["bppsa_backward_s"]
        lines.append(
            f"{point['variant']:<3} {point['batch']:>3} {row.get('frames', '-'):>5} "
            f"{row.get('features', '-'):>3} {_ms(row['forward_s'])} {_ms(row['jacobians_s'])} "
            f"{_ms(row['bppsa_backward_s'])} {_ms(row['bp_backward_s'])} "
            f"{_x(row['bp_backward_s'], bppsa_bwd):>6} {_x(row['bp_s'], row['bppsa_s']):>7}"
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:>9.2f}"


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"
