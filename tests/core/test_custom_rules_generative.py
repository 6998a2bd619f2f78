"""A generative test of derivative rules: random parts of random cells wrapped in rules.

Bodies are drawn from the structure analysis' zoo (``test_structure_generative.py``: a few
operations on the packed float leaves of a pytree carry) with some of their operations wrapped in
a rule that changes the derivative and keeps the value: ``custom_jvp`` rules that add a coupling
of all units (a surrogate), scale the derivative or pass the tangent straight through, and
``custom_vjp`` rules whose backward passes the cotangent straight through, scales it (both
linear) or clips it (not linear). For each body:

* with ``custom_jvp`` rules only, the dependencies found must hold every nonzero of the
  Jacobian the rules define (``jax.jacfwd`` at four points), and the blocks every dependency;
* the gradient under the defaults equals ``jax.grad`` through ``lax.scan`` (float64), and so
  does ``Blelloch()``'s where the rules are ``custom_jvp`` or linear ``custom_vjp`` ones
  (declared with ``linear_vjp=True``); with a clipping backward, ``Blelloch()`` refuses.

Examples are drawn deterministically (``derandomize``); the ``slow`` variants draw more.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from jax import lax

import bppsa
from tests.core.test_structure_generative import (
    CARRIES,
    DIFFERENTIABLE,
    NAMES,
    OPS,
    N,
    _floats,
    _weights,
    assert_found_structure_holds,
    step_of,
)
from tests.helpers import derandomized

COUPLING = 0.2 * jax.random.normal(jax.random.key(5), (N, N))


def _jvp_rule(op, tangent_of):
    """``op`` with a ``custom_jvp`` rule: ``tangent_of(v, x, op's own tangent, dv)``."""

    @jax.custom_jvp
    def wrapped(v, x, w):
        return op(v, x, w)

    @wrapped.defjvp
    def _(primals, tangents):
        v, x, w = primals
        dv, dx, _ = tangents
        out, own = jax.jvp(lambda v, x: op(v, x, w), (v, x), (dv, dx))
        return out, tangent_of(v, x, own, dv)

    return wrapped


def _vjp_rule(op, cotangent_of):
    """``op`` with a ``custom_vjp`` rule: its own VJP of ``cotangent_of(g)`` (straight
    through: ``None``, the cotangent itself for ``v`` and zero for ``x``)."""

    @jax.custom_vjp
    def wrapped(v, x, w):
        return op(v, x, w)

    def forward(v, x, w):
        return op(v, x, w), (v, x, w)

    def backward(residuals, g):
        v, x, w = residuals
        if cotangent_of is None:
            return g, jnp.zeros_like(x), jax.tree.map(jnp.zeros_like, w)
        _, pullback = jax.vjp(lambda v, x: op(v, x, w), v, x)
        return (*pullback(cotangent_of(g)), jax.tree.map(jnp.zeros_like, w))

    wrapped.defvjp(forward, backward)
    return wrapped


# name -> (wrap(op) -> op with the rule, kind)
RULES = {
    "surrogate": (lambda op: _jvp_rule(op, lambda v, x, own, dv: own + COUPLING @ dv), "jvp"),
    "scaled": (lambda op: _jvp_rule(op, lambda v, x, own, dv: 0.5 * own), "jvp"),
    "straight_jvp": (lambda op: _jvp_rule(op, lambda v, x, own, dv: dv), "jvp"),
    "straight_vjp": (lambda op: _vjp_rule(op, None), "linear"),
    "scaled_vjp": (lambda op: _vjp_rule(op, lambda g: -0.5 * g), "linear"),
    "clipped_vjp": (lambda op: _vjp_rule(op, lambda g: jnp.clip(g, -0.05, 0.05)), "nonlinear"),
}
JVP_RULES = sorted(name for name, (_, kind) in RULES.items() if kind == "jvp")


def make_step(ops: tuple[str, ...], wraps: tuple[str | None, ...], seed: int):
    """``step(carry, x, scale) -> carry``: the ops (each wrapped in its rule, if any) on the
    packed float leaves, then ``tanh``."""
    w = {k: v for k, v in _weights(seed).items() if k not in ("perm", "start")}
    perm = _weights(seed)["perm"]
    functions = []
    for name, wrap in zip(ops, wraps):
        op = functools.partial(_with_constants, OPS[name], perm=perm)
        functions.append(op if wrap is None else RULES[wrap][0](op))

    return step_of(functions, w)


def _with_constants(op, v, x, w, *, perm):
    """The zoo's ``op`` with its integer constants (not arguments of a rule) put back."""
    return op(v, x, {**w, "perm": perm, "start": jnp.int32(2)})


def assert_found_structure_holds_the_rules_jacobian(ops, wraps, carry_kind, seed):
    step, carry = make_step(ops, wraps, seed), CARRIES[carry_kind]()
    assert_found_structure_holds(step, carry, f"ops {ops} wrapped in {wraps} on a {carry_kind}")


def assert_gradients_equal_lax_scan(ops, wraps, carry_kind, seed):
    step, init = make_step(ops, wraps, seed), CARRIES[carry_kind]()
    init = jax.tree.map(lambda a: a + 0.1 if jnp.issubdtype(a.dtype, jnp.floating) else a, init)
    xs = jax.random.normal(jax.random.key(seed), (5, N))

    def loss(scan, xs, scale, **options):
        carry, ys = scan(lambda c, x: (step(c, x, scale), _floats(c)[0].sum()), init, xs, **options)
        return sum((leaf**2).sum() for leaf in _floats(carry)) + (ys * jnp.arange(5.0)).sum()

    want = jax.grad(functools.partial(loss, lax.scan), argnums=(0, 1))(xs, 0.7)
    kinds = {RULES[wrap][1] for wrap in wraps if wrap is not None}
    runs = [{}]  # the defaults
    if "nonlinear" not in kinds:
        runs.append({"method": "blelloch", "linear_vjp": "linear" in kinds or None})
    for options in runs:
        with bppsa.trace_plans() as plans:
            got = bppsa.grad(functools.partial(loss, bppsa.scan, **options), argnums=(0, 1))(
                xs, 0.7
            )
        context = f"{ops} wrapped in {wraps}, {options}: {plans[0].jacobians}"
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-12, err_msg=context)
    if "nonlinear" in kinds:
        blelloch = functools.partial(loss, bppsa.scan, method="blelloch")
        with pytest.raises(ValueError, match="linear_vjp=True"):
            bppsa.grad(blelloch, argnums=(0, 1))(xs, 0.7)


OPS_AND_WRAPS = st.lists(
    st.tuples(st.sampled_from(DIFFERENTIABLE), st.sampled_from([None, *sorted(RULES)])),
    min_size=1,
    max_size=3,
).filter(lambda pairs: any(wrap is not None for _, wrap in pairs))
JVP_OPS_AND_WRAPS = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from([None, *JVP_RULES])), min_size=1, max_size=3
).filter(lambda pairs: any(wrap is not None for _, wrap in pairs))
CARRY_KINDS = st.sampled_from(sorted(CARRIES))
SEEDS = st.integers(0, 3)


def _settings(max_examples):
    return derandomized(
        max_examples, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture
    )


def _split(pairs):
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


@_settings(15)
@given(pairs=JVP_OPS_AND_WRAPS, carry_kind=CARRY_KINDS, seed=SEEDS)
@example(pairs=[("tanh", "surrogate")], carry_kind="vector", seed=0)
@example(pairs=[("scale", "straight_jvp"), ("flip", None)], carry_kind="pair", seed=1)
def test_found_structure_holds_the_jacobian_of_the_rules(x64, pairs, carry_kind, seed):
    assert_found_structure_holds_the_rules_jacobian(*_split(pairs), carry_kind, seed)


@_settings(4)
@given(pairs=OPS_AND_WRAPS, carry_kind=CARRY_KINDS, seed=SEEDS)
@example(pairs=[("scale", "surrogate")], carry_kind="vector", seed=0)
@example(pairs=[("dot_block", "scaled_vjp"), ("tanh", None)], carry_kind="dict", seed=1)
@example(pairs=[("dot_dense", "clipped_vjp")], carry_kind="nested", seed=2)
def test_gradients_of_drawn_bodies_with_rules_equal_lax_scan(x64, pairs, carry_kind, seed):
    assert_gradients_equal_lax_scan(*_split(pairs), carry_kind, seed)


@pytest.mark.slow
@_settings(60)
@given(pairs=OPS_AND_WRAPS, carry_kind=CARRY_KINDS, seed=SEEDS)
def test_gradients_of_many_drawn_bodies_with_rules_equal_lax_scan(x64, pairs, carry_kind, seed):
    assert_gradients_equal_lax_scan(*_split(pairs), carry_kind, seed)
