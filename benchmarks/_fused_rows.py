"""The rows of :mod:`benchmarks.fused`: the problems, and one function per part that compiles a
case's programs, checks their values against the reference and times them.

Every program is compiled once (``jax.jit(...).lower(...).compile()``) inside
:func:`bppsa.trace_plans`, so that a row records what each ``bppsa.scan`` decided (its forward
and why, its method); two names whose lowered programs are the same text are timed once (the
row says ``<name>_same_program_as``). The programs of a row are timed together, round by round,
each timed call right after an untimed call of itself (:func:`experiments.timing.interleaved`);
``<name>_ms`` is the median and ``<name>_min_ms`` the minimum.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import bppsa
from bppsa.models import (
    CIFGLSTM,
    GRU,
    LSTM,
    RNN,
    DiagonalGRU,
    IndRNN,
    cifg_lstm_cell,
    diagonal_gru_cell,
    gru_cell,
    indrnn_cell,
    lstm_cell,
    rnn_cell,
)
from experiments.timing import interleaved, ms_fields

# The library's cells: dense (RNN, GRU, LSTM) and with independent lanes (the others, which the
# fused kernels split into programs of lanes); the language model's layers scan these cells.
CELLS = {
    "rnn": (RNN(), rnn_cell),
    "gru": (GRU(), gru_cell),
    "lstm": (LSTM(), lstm_cell),
    "cifg-lstm": (CIFGLSTM(), cifg_lstm_cell),
    "diagonal-gru": (DiagonalGRU(), diagonal_gru_cell),
    "indrnn": (IndRNN(), indrnn_cell),
}
FUSED = functools.partial(bppsa.scan, forward="fused")
# the fused forward with one program per example, for cells whose lanes the kernel splits
ONE_PROGRAM = functools.partial(bppsa.scan, forward=bppsa.Fused(lanes=None))
INDEPENDENT_LANES = frozenset({"diagonal-gru"})


@dataclasses.dataclass(frozen=True)
class Case:
    """``batch`` sequences of ``length`` steps of ``inputs`` features, a ``cell`` of ``hidden``
    units scanned over each (``jax.vmap`` over a per-example scan)."""

    cell: str
    hidden: int
    length: int
    batch: int
    inputs: int

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def machine() -> dict[str, str]:
    """The device every row records."""
    device = jax.devices()[0]
    return {"device_kind": device.device_kind, "platform": device.platform, "jax": jax.__version__}


def problem(case: Case, seed: int = 0) -> tuple[Any, jax.Array, jax.Array]:
    """``(params, head, xs)``: the cell's parameters, a linear head on the final state and
    standard-normal inputs ``(B, T, I)``."""
    kind, _ = CELLS[case.cell]
    k_params, k_head, k_xs = jax.random.split(jax.random.key(seed), 3)
    params = kind.init(case.inputs, case.hidden, key=k_params)
    head = jax.random.normal(k_head, (case.hidden,)) / math.sqrt(case.hidden)
    xs = jax.random.normal(k_xs, (case.batch, case.length, case.inputs), jnp.float32)
    return params, head, xs


def step_of(cell: str, params: Any) -> tuple[Callable, Any]:
    """``(body, init)`` of one example's scan: ``body(state, x) -> (new state, None)``."""
    kind, step = CELLS[cell]
    return (lambda s, x: (step(params, s, x), None)), kind


def final_states(scan: Callable, case: Case, params: Any, xs: jax.Array) -> jax.Array:
    """The hidden vector each example ends in, ``(B, H)``: the forward alone."""
    body, kind = step_of(case.cell, params)
    init = kind.initial_state(case.hidden)
    return jax.vmap(lambda x: kind.output(scan(body, init, x)[0]))(xs)


def loss(scan: Callable, case: Case, params: Any, head: jax.Array, xs: jax.Array) -> jax.Array:
    """The head's sum over the final states (the paper's classifiers' shape)."""
    return jnp.sum(final_states(scan, case, params, xs) @ head)


@dataclasses.dataclass(frozen=True)
class Program:
    """A compiled program, its lowered text and what the scans traced in it decided."""

    compiled: Any
    text: str
    plans: list
    compile_s: float

    @classmethod
    def of(cls, fn: Callable, *args: Any) -> Program:
        start = time.perf_counter()
        with bppsa.trace_plans() as plans:
            lowered = jax.jit(fn).lower(*args)
        compiled = lowered.compile()
        return cls(compiled, lowered.as_text(), plans, time.perf_counter() - start)


def plan_fields(name: str, program: Program) -> dict[str, Any]:
    """What the first scan of ``program`` decided: ``<name>_forward`` (``Fused()``,
    ``'sequential'``, ...), ``<name>_forward_because``, ``<name>_method`` (the backward's, where
    one was traced), ``<name>_backward_because`` (why ``FusedSequential()``'s loop does not
    run in its kernel) and ``<name>_jacobians``."""
    if not program.plans:
        return {f"{name}_forward": None}
    plan = program.plans[0]
    return {
        f"{name}_forward": repr(plan.forward),
        f"{name}_forward_because": plan.forward_because,
        f"{name}_method": repr(plan.method if plan.backward is None else plan.backward),
        f"{name}_backward_because": plan.backward_because,
        f"{name}_jacobians": plan.jacobians,
    }


def why_not_fused(plans: Sequence[bppsa.ScanPlan]) -> str | None:
    """Why the fused kernel does not run the first scan of ``plans`` (``None``: it runs), as
    its plan says (:meth:`bppsa.Fused.why_not` through ``forward_because``)."""
    if not plans:
        return "no bppsa.scan was traced"
    plan = plans[0]
    if isinstance(plan.forward, bppsa.Fused):
        return None
    return plan.forward_because or f"the forward is {plan.forward!r}"


def relative_difference(actual: Any, expected: Any) -> float:
    """The largest ``|a - e|`` over the leaves, over the largest ``|e|``."""
    leaves = zip(jax.tree.leaves(actual), jax.tree.leaves(expected))
    diff = max(float(jnp.max(jnp.abs(a - e))) for a, e in leaves)
    scale = max(float(jnp.max(jnp.abs(e))) for e in jax.tree.leaves(expected))
    return diff / max(scale, 1e-30)


def timed_fields(
    programs: Mapping[str, Program], args: tuple, rounds: int, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``<name>_ms``, ``<name>_min_ms`` and ``<name>_compile_s`` of every program but those in
    ``skip`` (their fields ``None``); a program whose text is an earlier one's is timed once and
    its fields copied, with ``<name>_same_program_as``."""
    same: dict[str, str] = {}
    names = [name for name in programs if name not in skip]
    for i, name in enumerate(names):
        for other in names[:i]:
            if other not in same and programs[other].text == programs[name].text:
                same[name] = other
                break
    calls = {
        name: functools.partial(program.compiled, *args)
        for name, program in programs.items()
        if name not in skip and name not in same
    }
    fields: dict[str, Any] = ms_fields(interleaved(calls, rounds))
    for name, program in programs.items():
        if name in skip:
            fields |= {f"{name}_ms": None, f"{name}_min_ms": None}
        elif name in same:
            fields[f"{name}_ms"] = fields[f"{same[name]}_ms"]
            fields[f"{name}_min_ms"] = fields[f"{same[name]}_min_ms"]
            fields[f"{name}_same_program_as"] = same[name]
        fields[f"{name}_compile_s"] = program.compile_s
    return fields


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


# ----------------------------------------------------------------------------- (a) forward


FORWARDS = {"lax_scan": jax.lax.scan, "fused": FUSED, "default": bppsa.scan}


def forward_row(case: Case, rounds: int) -> dict[str, Any]:
    """The forward alone (the final states), ``lax.scan`` against ``forward="fused"`` and
    ``bppsa.scan``'s default forward: milliseconds, microseconds per step, the speedups over
    ``lax.scan`` and the fused values' difference from ``lax.scan``'s. Where the kernel cannot
    run the case (``fused_why_not``), ``forward="fused"`` (then ``lax.scan``) is not timed.
    Cells with independent lanes also time ``Fused(lanes=None)`` (``fused_one_program``: one
    program per example, where ``fused`` runs one per 128 lanes), and ``lanes_speedup``."""
    params, _, xs = problem(case)
    forwards = dict(FORWARDS)
    if case.cell in INDEPENDENT_LANES:
        forwards["fused_one_program"] = ONE_PROGRAM
    programs = {
        name: Program.of(functools.partial(final_states, scan, case), params, xs)
        for name, scan in forwards.items()
    }
    row: dict[str, Any] = {"part": "forward", **case.fields(), **machine(), "rounds": rounds}
    row |= plan_fields("fused", programs["fused"]) | plan_fields("default", programs["default"])
    row["fused_why_not"] = why = why_not_fused(programs["fused"].plans)
    reference = programs["lax_scan"].compiled(params, xs)
    if why is None:
        row["fused_difference"] = relative_difference(
            programs["fused"].compiled(params, xs), reference
        )
        skip: tuple[str, ...] = ()
    else:
        row["fused_difference"] = None
        skip = ("fused", "fused_one_program")
    row |= timed_fields(programs, (params, xs), rounds, skip)
    for name in forwards:
        for stat in ("", "_min"):
            ms = row[f"{name}{stat}_ms"]
            row[f"{name}{stat}_us_per_step"] = None if ms is None else 1e3 * ms / case.length
    for name in ("fused", "default"):
        for stat in ("", "_min"):
            row[f"{name}_speedup{stat}"] = _ratio(
                row[f"lax_scan{stat}_ms"], row[f"{name}{stat}_ms"]
            )
    if "fused_one_program" in forwards:
        for stat in ("", "_min"):
            row[f"lanes_speedup{stat}"] = _ratio(
                row[f"fused_one_program{stat}_ms"], row[f"fused{stat}_ms"]
            )
    return row


# ----------------------------------------------------------------------------- (b) gradients


def gradient_fns(case: Case) -> dict[str, Callable]:
    """``value_and_grad`` of :func:`loss` with respect to the parameters: ``bp`` (JAX through
    ``lax.scan``), ``defaults`` (``bppsa.value_and_grad`` with no options),
    ``fused_blelloch`` (``forward="fused"``, ``method=bppsa.Blelloch()``) and
    ``fused_sequential`` (``forward="fused"``, ``method=bppsa.FusedSequential()``: both loops
    in one kernel each, the sequential baseline)."""
    through_bppsa = functools.partial(loss, bppsa.scan, case)
    return {
        "bp": jax.value_and_grad(functools.partial(loss, jax.lax.scan, case)),
        "defaults": bppsa.value_and_grad(through_bppsa),
        "fused_blelloch": bppsa.value_and_grad(
            through_bppsa, method=bppsa.Blelloch(), forward="fused"
        ),
        "fused_sequential": bppsa.value_and_grad(
            through_bppsa, method=bppsa.FusedSequential(), forward="fused"
        ),
    }


def grad_row(case: Case, rounds: int) -> dict[str, Any]:
    """Whole gradients (``value_and_grad``, one program each): milliseconds, the speedups over
    BP, each gradient's difference from BP's, and what each bppsa run's scans decided."""
    params, head, xs = problem(case)
    fns = gradient_fns(case)
    programs = {name: Program.of(fn, params, head, xs) for name, fn in fns.items()}
    row: dict[str, Any] = {"part": "grad", **case.fields(), **machine(), "rounds": rounds}
    _, reference = programs["bp"].compiled(params, head, xs)
    for name in fns:
        if name != "bp":
            row |= plan_fields(name, programs[name])
            _, grads = programs[name].compiled(params, head, xs)
            row[f"{name}_difference"] = relative_difference(grads, reference)
    row |= timed_fields(programs, (params, head, xs), rounds)
    for name in fns:
        if name != "bp":
            for stat in ("", "_min"):
                row[f"{name}_speedup{stat}"] = _ratio(row[f"bp{stat}_ms"], row[f"{name}{stat}_ms"])
    return row


# ----------------------------------------------------------------------------- (c) cuDNN's LSTM


def cudnn_lstm_loss(case: Case) -> Callable:
    """:func:`loss` through cuDNN's LSTM (``jax.experimental.rnn.lstm``, batch first, one layer,
    one direction) as a function of its flat weights: ``(weights, head, xs) -> scalar``."""
    from jax.experimental import rnn

    zeros = jnp.zeros((1, case.batch, case.hidden), jnp.float32)
    lengths = jnp.full((case.batch,), case.length, jnp.int32)

    def cudnn_loss(weights, head, xs):
        _, h, _ = rnn.lstm(xs, zeros, zeros, weights, lengths, input_size=case.inputs,
                           hidden_size=case.hidden, num_layers=1, dropout=0.0,
                           bidirectional=False)  # fmt: skip
        return jnp.sum(h[0] @ head)

    return cudnn_loss


def lstm_params(weights: jax.Array, case: Case) -> dict[str, jax.Array]:
    """cuDNN's flat LSTM weights as ``bppsa.models.LSTM``'s parameters (both PyTorch's layout,
    gates i, f, g, o); linear, so it also maps a gradient of the flat weights to theirs."""
    from jax.experimental import rnn

    w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(weights, case.inputs, case.hidden, 1, False)
    return {"weight_ih": w_ih[0], "weight_hh": w_hh[0], "bias_ih": b_ih[0], "bias_hh": b_hh[0]}


def cudnn_row(case: Case, rounds: int) -> dict[str, Any]:
    """cuDNN's LSTM (``value_and_grad`` of its loss) against bppsa's LSTM with its defaults
    (``bppsa.value_and_grad``) on the same weights: milliseconds, ``bppsa_over_cudnn`` (under 1:
    bppsa is faster), the gradients' difference. Where cuDNN's LSTM cannot run (no GPU; a JAX
    without it) ``cudnn_status`` says why and only bppsa is timed."""
    _, head, xs = problem(case)
    from jax.experimental import rnn

    weights = rnn.init_lstm_weight(jax.random.key(0), case.inputs, case.hidden, 1, False)
    params = lstm_params(weights, case)
    programs = {
        "bppsa": Program.of(
            bppsa.value_and_grad(functools.partial(loss, bppsa.scan, case)), params, head, xs
        )
    }
    row: dict[str, Any] = {"part": "cudnn", **case.fields(), **machine(), "rounds": rounds}
    row |= plan_fields("bppsa", programs["bppsa"])
    value, grads = programs["bppsa"].compiled(params, head, xs)
    try:
        cudnn = Program.of(jax.value_and_grad(cudnn_lstm_loss(case)), weights, head, xs)
        cudnn_value, cudnn_grads = jax.block_until_ready(cudnn.compiled(weights, head, xs))
    except Exception as error:  # no cuDNN here: recorded, bppsa still timed
        row["cudnn_status"] = f"not available: {type(error).__name__}: {str(error)[:300]}"
        row |= timed_fields(programs, (params, head, xs), rounds)
        row |= {"cudnn_ms": None, "cudnn_min_ms": None}
        row |= {"bppsa_over_cudnn": None, "bppsa_over_cudnn_min": None}
        return row
    row["cudnn_status"] = "ok"
    row["value_difference"] = relative_difference(value, cudnn_value)
    row["grad_difference"] = relative_difference(grads, lstm_params(cudnn_grads, case))
    calls = {
        "bppsa": (programs["bppsa"], (params, head, xs)),
        "cudnn": (cudnn, (weights, head, xs)),
    }
    times = interleaved(
        {n: functools.partial(p.compiled, *a) for n, (p, a) in calls.items()}, rounds
    )
    row |= ms_fields(times)
    row |= {f"{name}_compile_s": program.compile_s for name, (program, _) in calls.items()}
    for stat in ("", "_min"):
        row[f"bppsa_over_cudnn{stat}"] = _ratio(row[f"bppsa{stat}_ms"], row[f"cudnn{stat}_ms"])
    return row
