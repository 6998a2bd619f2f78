"""What the speed benchmark sets beside each measured backward: the model's floor and its count.

* The **chain**: the sequential scan that no method with ``T`` dependent steps avoids, i.e. the
  library's own sequential scan (:func:`bppsa.scan.sequential`) over the cell's structured
  transposed Jacobians (``(T, B, p)`` per-step factors, one shared ``W_hh``), measured in the
  benchmark's rounds beside the methods. Its time per step is this machine's latency of one
  dependent step at this batch and size.
* The **floor** of a method: its analytic cost (:meth:`bppsa.Method.cost`: dependent steps,
  arithmetic) with that measured step latency and the large matrix product's measured rate,
  ``steps x chain_step + flops / gemm_rate``. Memory traffic is left out (blocks keep it in
  cache), so it is a lower bound: what the method's algorithm would take if its only costs
  were its dependent steps and its arithmetic at the best rate measured here.
* The **parts**: the other work every backward that evaluates the steps in parallel does, one
  VJP of all the steps w.r.t. the parameters (the steps evaluated again and their products
  with the carries' cotangents, summed over steps and examples), written with JAX alone over
  blocks of the steps ``Auto()`` would use, and timed in the same rounds. The chain plus the
  parts is what such a backward takes if nothing else (its Jacobians, its bookkeeping) cost
  anything and its parts cost what they cost alone; BP's backward over that sum is the speedup
  it then reaches. It is a measurement, not a bound: in one compiled backward the parts may
  run faster than alone (XLA fuses them with their neighbours).
* The **HLO count** of a compiled backward: :func:`benchmarks.tools.hlo_cost.count` of the backward
  program itself, the pullback applied to saved residuals (kernels in sequence, flops, bytes),
  the program whose time stands beside it; :mod:`benchmarks.tools.fit_profile` turns the pairs into
  a fitted profile of this machine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.tools import hlo_cost
from bppsa.scan import Structured, sequential
from bppsa.scan._core import cost
from bppsa.scan._core.memory import Footprint

# Transposed-Jacobian factors of the structured cells: (reps of W_hh^T, a diagonal term).
CHAIN_FORMS = {"rnn": (1, False), "gru": (3, True)}


def chain(cell: str, length: int, batch: int, hidden: int):
    """``(fn, args)``: the compiled sequential scan over ``length`` structured maps of ``cell``
    for ``batch`` examples (``None`` for a cell without structured Jacobians)."""
    if cell not in CHAIN_FORMS:
        return None
    reps, diagonal = CHAIN_FORMS[cell]
    keys = jax.random.split(jax.random.key(1), 3)
    u = jax.random.normal(keys[0], (hidden, reps * hidden)) / hidden
    d = jax.random.uniform(keys[1], (length, batch, reps * hidden))
    e = jax.random.uniform(keys[2], (length, batch, hidden)) if diagonal else None
    g = jnp.ones((batch, hidden))

    def run(u, d, e, g):
        return sequential(g, Structured(u=u, d=d, e=e, reps=reps), None)

    args = (u, d, e, g)
    return jax.jit(run).lower(*args).compile(), args


def parts(cell, length: int, batch: int, hidden: int, block: int):
    """``(fn, args)``: the compiled VJP of ``cell``'s steps w.r.t. its parameters (inputs of
    one float, as in the benchmark), all ``batch x block`` steps of a block at once, the
    parameters' cotangents summed over ``length // block`` blocks and a shorter first one."""
    keys = jax.random.split(jax.random.key(2), 4)
    params = cell.init(1, hidden, key=keys[0])
    carries = jax.random.normal(keys[1], (length, batch, hidden))
    xs = jax.random.normal(keys[2], (length, batch, 1))
    cts = jax.random.normal(keys[3], (length, batch, hidden))
    block = max(min(block, length), 1)

    def span_vjp(params, carries, xs, cts):  # the span's steps and examples as one axis
        flat = [a.reshape(-1, a.shape[-1]) for a in (carries, xs, cts)]
        steps = jax.vmap(cell, in_axes=(None, 0, 0))
        _, vjp = jax.vjp(lambda p: steps(p, *flat[:2]), params)
        return vjp(flat[2])[0]

    def run(params, carries, xs, cts):
        head, blocks = length % block, length // block

        def one_block(total, k):
            pieces = (lax.dynamic_slice_in_dim(a, head + k * block, block) for a in arrays)
            return jax.tree.map(jnp.add, total, span_vjp(params, *pieces)), None

        arrays = (carries, xs, cts)
        zeros = jax.tree.map(jnp.zeros_like, params)
        total, _ = lax.scan(one_block, zeros, jnp.arange(blocks))
        if head:
            total = jax.tree.map(jnp.add, total, span_vjp(params, *(a[:head] for a in arrays)))
        return total

    args = (params, carries, xs, cts)
    return jax.jit(run).lower(*args).compile(), args


def footprint(cell: str, length: int, batch: int, hidden: int) -> Footprint:
    """The footprint ``Auto()`` weighs for the benchmark's scan of ``cell``."""
    reps, diagonal = CHAIN_FORMS[cell]  # the floats of one step's stored Jacobian: d and e
    element = (reps + diagonal) * hidden
    return cost.footprint_of(length, hidden, batch, element)


def floor_seconds(method_cost: cost.Cost | None, step_s: float, gemm_flops: float | None):
    """``steps x step_s + flops / gemm_flops`` (``None`` where the model has no cost)."""
    if method_cost is None or gemm_flops is None:
        return None
    return method_cost.steps * step_s + method_cost.flops / gemm_flops


def backward_count(backward) -> dict | None:
    """The HLO count of a compiled backward program (the pullback applied to saved residuals,
    :class:`experiments.timing.GradientPrograms`), ``None`` if it cannot be read."""
    try:
        count = hlo_cost.count(backward)
    except Exception:  # the count is a report: never a reason to lose the row
        return None
    return dict(
        steps=count.steps, flops=count.flops, bytes=count.bytes, unknown_loops=count.unknown_loops
    )


def model_seconds(count: dict | None, profile: cost.Profile) -> float | None:
    """The predicted time of an HLO count on ``profile``."""
    if count is None:
        return None
    return cost.Cost(count["steps"], count["flops"], count["bytes"]).seconds(profile)
