"""The default structure check: a structure found in a cell, checked at one step on two vectors.

Without ``check_structure`` (or with ``None``), wherever the Jacobians are built in a structure
inferred from the cell (not declared by an analytic builder), the structured ``J^T`` of the
middle step is applied to two fixed vectors and compared with the step's own VJP. Misreads are
planted as in ``test_check_structure.py``: a reversal read as a copy, blocks of ``J`` built for
``J^T``, and a rule the analysis is told to read by its primal.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan._core import element_flow, stacked, structure, structure_check
from bppsa.scan._core.jaxprs import rules
from tests.core.test_check_structure import (
    A,
    N,
    T,
    _loss,
    _reference,
    _xs,
    diagonal,
    pairs,
    reversal,
)


@pytest.fixture
def misread_reversal(monkeypatch):
    monkeypatch.setitem(element_flow._RULES, "rev", element_flow._identity)


@pytest.mark.parametrize("method", ["blelloch", "chunked", "sequential-scan"])
def test_a_misread_structure_raises_by_default(misread_reversal, method):
    with pytest.raises(ValueError, match="check_structure") as raised:
        bppsa.grad(_loss(reversal, _xs(), method=method))(A)
    message = str(raised.value)
    assert f"built as diagonal, but at time step xs[{T // 2}]" in message
    # every element of a reversal's J^T u is wrong except the middle one (none for even N)
    assert "at carry element" in message and "check_structure=False" in message


def test_the_step_is_named_as_an_index_into_xs_when_reversed(misread_reversal):
    with pytest.raises(ValueError, match=rf"at time step xs\[{T - 1 - T // 2}\]"):
        bppsa.grad(_loss(reversal, _xs(), reverse=True))(A)


def test_blocks_built_wrong_are_caught(monkeypatch):
    built = structure.coloured_jacobian_t

    def transposed_blocks(fun, point, found):
        jac_t = built(fun, point, found)
        return jac_t.with_per_step(blocks=jnp.swapaxes(jac_t.blocks, -1, -2))

    monkeypatch.setattr(stacked, "coloured_jacobian_t", transposed_blocks)

    def skewed(a, h, x):
        g = h.reshape(2, 2)
        return jnp.tanh(a * h + jnp.stack([g[:, 1], -0.3 * g[:, 0]], 1).reshape(-1) + x)

    with pytest.raises(ValueError, match="built as block-diagonal k=2, but at time step"):
        bppsa.grad(_loss(skewed, _xs()))(A)


def test_a_rule_read_by_its_primal_is_caught(monkeypatch):
    """The analysis made to read a custom_jvp call by the function it decorates (what it did
    before it read rules): a step function's zero derivative looks diagonal, the surrogate's
    dense Jacobian is not."""
    monkeypatch.setattr(element_flow, "_jvp_rule", _primal_call)

    @jax.custom_jvp
    def spike(v):
        return (v > 0).astype(v.dtype)

    spike.defjvp(lambda p, t: (spike(p[0]), t[0] / (1 + jnp.abs(p[0])) ** 2))
    w = jax.random.normal(jax.random.key(3), (N, N))

    def spiking(a, h, x):
        return 0.5 * a * h + spike(w @ h + x)

    with bppsa.trace_plans() as plans, pytest.raises(ValueError, match="built as diagonal"):
        bppsa.grad(_loss(spiking, _xs()))(A)
    assert plans[0].jacobians == "autodiff, diagonal"


def _primal_call(flow, params, ins, values, shapes):
    closed = params["call_jaxpr"]
    return flow.run(closed.jaxpr, closed.consts, ins, values)


@pytest.mark.parametrize("body", [diagonal, pairs], ids=["diagonal", "pairs"])
def test_correct_structures_pass_and_keep_their_gradients(body, dtype):
    xs = _xs().astype(dtype)
    a = A.astype(dtype)
    with bppsa.trace_plans() as plans:
        checked = bppsa.grad(_loss(body, xs))(a)
    assert plans[0].jacobians.startswith("autodiff, ")
    unchecked = bppsa.grad(_loss(body, xs), check_structure=False)(a)
    np.testing.assert_array_equal(checked, unchecked)  # the check changes no value
    rtol = 2e-5 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(checked, jax.grad(_reference(body, xs))(a), rtol=rtol)


def test_the_default_check_runs_under_jit_and_vmap(misread_reversal):
    batch = jnp.stack([_xs(1), _xs(2)])

    def per_example(a, xs):
        return _loss(reversal, xs)(a)

    checked = jax.jit(jax.vmap(bppsa.grad(per_example), (None, 0)))
    with pytest.raises(Exception, match=r"built as diagonal, but at time step xs\[\d\]"):
        jax.block_until_ready(checked(A, batch))


def test_off_nothing_is_checked(misread_reversal):
    bppsa.grad(_loss(reversal, _xs()), check_structure=False)(A)  # wrong, and unchecked


def test_analytic_and_dense_jacobians_are_not_checked():
    w = jax.random.normal(jax.random.key(0), (N, N)) / 2

    def dense(a, h, x):
        return jnp.tanh(w @ (a * h) + x)

    jaxpr = str(jax.make_jaxpr(bppsa.grad(_loss(dense, _xs())))(A))
    assert "debug_callback" not in jaxpr


def test_rules_module_reads_the_name_of_the_function():
    @jax.custom_vjp
    def clipped(x):
        return x

    clipped.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))
    found = rules.opaque_rules(lambda h, w: jnp.tanh(clipped(w @ h)), jnp.ones(3), jnp.eye(3))
    assert len(found) == 1 and found[0].startswith("clipped at ")


def test_the_host_is_called_only_on_a_mismatch(monkeypatch):
    calls = []
    monkeypatch.setattr(structure_check, "_raise_sampled", lambda *a, **k: calls.append(a))
    bppsa.grad(_loss(diagonal, _xs()))(A)  # a correct structure: checked on the device alone
    assert calls == []
    monkeypatch.setitem(element_flow._RULES, "rev", element_flow._identity)
    bppsa.grad(_loss(reversal, _xs()))(A)  # misread: the (counting) report is called
    assert len(calls) == 1 and bool(calls[0][1])
