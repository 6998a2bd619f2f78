"""``check_structure=True``: a structure found in a cell, checked against the cell at run time
(the default, sampled check: ``test_check_structure_default.py``).

Mis-declared structures are planted by breaking the analysis (a reversal read as a copy) or the
builder (blocks of ``J`` instead of ``J^T``); the check must name the structure, the step and
the entry, and must cost nothing when off. Correct structures must pass it, gradients equal to
``lax.scan``'s.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan._core import element_flow, stacked, structure

T, N = 9, 4


def _xs(seed=0, t=T, n=N):
    return jax.random.normal(jax.random.key(seed), (t, n))


def _loss(body, xs, method="blelloch", reverse=False, scan=bppsa.scan, **options):
    """``a -> |final carry|^2`` of ``body`` scanned over ``xs`` (``scan=jax.lax.scan``: the
    reference, without bppsa's options)."""
    if scan is bppsa.scan:
        scan = functools.partial(scan, method=method, **options)

    def loss(a):
        step = lambda h, x: (body(a, h, x), None)
        carry, _ = scan(step, jnp.ones(xs.shape[-1]), xs, reverse=reverse)
        return (carry**2).sum()

    return loss


def _reference(body, xs, reverse=False):
    return _loss(body, xs, reverse=reverse, scan=jax.lax.scan)


def reversal(a, h, x):  # d new_h[i] / d h[N - 1 - i]: anti-diagonal
    return jnp.tanh(a * h[::-1] + x)


def diagonal(a, h, x):
    return jnp.tanh(a * h + x)


def pairs(a, h, x):  # blocks (0, 2), (1, 3): a k = 2 structure with a permutation
    return jnp.tanh(a * h + 0.5 * jnp.roll(h, 2) + x)


A = jnp.linspace(0.5, 0.9, N)


@pytest.fixture
def misread_reversal(monkeypatch):
    """The analysis with ``rev`` read as a copy: a reversal looks diagonal."""
    monkeypatch.setitem(element_flow._RULES, "rev", element_flow._identity)


def test_a_misread_structure_gives_wrong_gradients_without_the_check(misread_reversal):
    xs = _xs()
    with bppsa.trace_plans() as plans:
        wrong = bppsa.grad(_loss(reversal, xs), check_structure=False)(A)
    assert plans[0].jacobians == "autodiff, diagonal"
    assert not np.allclose(wrong, jax.grad(_reference(reversal, xs))(A), atol=1e-3)


@pytest.mark.parametrize("method", ["blelloch", "chunked", "sequential-scan"])
def test_a_misread_structure_is_named_with_its_step_and_entry(misread_reversal, method):
    xs = _xs()
    with pytest.raises(ValueError, match="check_structure") as raised:
        bppsa.grad(_loss(reversal, xs, method=method), check_structure=True)(A)
    message = str(raised.value)
    assert "built as diagonal" in message
    assert "outside the claimed blocks" in message
    assert "steps checked: xs[0], xs[4], xs[8]" in message
    # the entry named is one the reversal has: d new_h[i] / d h[N - 1 - i], i != N - 1 - i
    row, col = (int(s) for s in _between(message, "d new_carry[", "] / d carry[", "] ="))
    assert row + col == N - 1 and row != col


def _between(message, first, middle, last):
    start = message.index(first) + len(first)
    split = message.index(middle, start)
    return message[start:split], message[split + len(middle) : message.index(last, split)]


def test_the_step_with_the_missed_entry_is_named_as_an_index_into_xs(misread_reversal):
    # the reversal is switched on only by x[0] > 100: at the last step the scan takes, checked
    def gated(a, h, x):
        on = (x[0] > 100).astype(h.dtype)
        return jnp.tanh(a * h + on * 0.5 * h[::-1] + jnp.tanh(x))

    for reverse, step in ((False, T - 1), (True, 0)):
        xs = _xs().at[step, 0].set(1000.0)
        loss = _loss(gated, xs, reverse=reverse, check_structure=True)
        with pytest.raises(ValueError, match=rf"at time step xs\[{step}\] the largest entry"):
            bppsa.grad(loss)(A)


def test_blocks_built_wrong_are_named_by_their_wrong_entry(monkeypatch):
    """A builder returning blocks of J instead of J^T: every entry is inside the blocks."""
    built = structure.coloured_jacobian_t

    def transposed_blocks(fun, point, found):
        jac_t = built(fun, point, found)
        return jac_t.with_per_step(blocks=jnp.swapaxes(jac_t.blocks, -1, -2))

    monkeypatch.setattr(stacked, "coloured_jacobian_t", transposed_blocks)

    def skewed(a, h, x):  # blocks (0, 1), (2, 3) with unequal couplings: J != J^T
        g = h.reshape(2, 2)
        return jnp.tanh(a * h + jnp.stack([g[:, 1], -0.3 * g[:, 0]], 1).reshape(-1) + x)

    xs = _xs()
    expected = r"built as block-diagonal k=2, but at time step xs\[\d\] the largest wrong entry"
    with pytest.raises(ValueError, match=expected):
        bppsa.grad(_loss(skewed, xs), check_structure=True)(A)


def test_a_wrong_entry_of_a_small_scale_jacobian_is_caught(monkeypatch):
    """The tolerance is relative to each step's own scale (not floored at 1): Jacobians of
    scale 1e-3 with one entry off by 1e-4 (10%, below sqrt(eps) in absolute terms) raise,
    and the same Jacobians built right pass."""

    def small(a, h, x):  # blocks (0, 1), (2, 3), entries of about 1e-3
        g = h.reshape(2, 2)
        coupled = jnp.stack([g[:, 1], -0.3 * g[:, 0]], 1).reshape(-1)
        return jnp.tanh(1e-3 * (a * h + coupled) + x)

    xs = _xs()
    loss = _loss(small, xs, check_structure=True)
    grads = bppsa.grad(loss)(A)  # built right: passes
    np.testing.assert_allclose(grads, jax.grad(_reference(small, xs))(A), rtol=2e-5)
    built = structure.coloured_jacobian_t

    def one_entry_off(fun, point, found):
        jac_t = built(fun, point, found)
        return jac_t.with_per_step(blocks=jac_t.blocks.at[..., 0, 0, 1].add(1e-4))

    monkeypatch.setattr(stacked, "coloured_jacobian_t", one_entry_off)
    expected = r"built as block-diagonal k=2, but at time step xs\[\d\] the largest wrong entry"
    with pytest.raises(ValueError, match=expected):
        bppsa.grad(_loss(small, xs, check_structure=True))(A)


@pytest.mark.parametrize("body", [diagonal, pairs], ids=["diagonal", "pairs"])
@pytest.mark.parametrize("reverse", [False, True])
def test_correct_structures_pass_the_check(body, reverse):
    xs = _xs()
    loss = _loss(body, xs, reverse=reverse, check_structure=True)
    with bppsa.trace_plans() as plans:
        grads = bppsa.grad(loss)(A)
    assert plans[0].jacobians.startswith("autodiff, ")  # a structure was found and checked
    np.testing.assert_allclose(grads, jax.grad(_reference(body, xs, reverse))(A), rtol=2e-5)


def test_the_check_runs_under_jit_and_vmap(misread_reversal):
    batch = jnp.stack([_xs(1), _xs(2)])

    def per_example(a, xs):
        return _loss(diagonal, xs)(a)

    grads = jax.jit(jax.vmap(bppsa.grad(per_example, check_structure=True), (None, 0)))(A, batch)
    reference = jax.vmap(jax.grad(lambda a, xs: _reference(diagonal, xs)(a)), (None, 0))(A, batch)
    np.testing.assert_allclose(grads, reference, rtol=2e-5)

    def per_example_reversal(a, xs):
        return _loss(reversal, xs)(a)

    checked = jax.jit(jax.vmap(bppsa.grad(per_example_reversal, check_structure=True), (None, 0)))
    with pytest.raises(Exception, match=r"built as diagonal, but at time step xs\[\d\]"):
        jax.block_until_ready(checked(A, batch))


def test_off_the_check_is_not_traced():
    xs = _xs()

    def jaxpr(**options):
        return str(jax.make_jaxpr(bppsa.grad(_loss(diagonal, xs), **options))(A))

    off = jaxpr(check_structure=False)
    assert "debug_callback" not in off
    for checked in (jaxpr(), jaxpr(check_structure=True)):  # the default checks too
        assert "debug_callback" in checked and checked != off


def test_a_scan_s_own_setting_wins_over_grad_s(misread_reversal):
    xs = _xs()
    unchecked = _loss(reversal, xs, check_structure=False)
    bppsa.grad(unchecked, check_structure=True)(A)  # the scan said no: nothing raises
    with pytest.raises(ValueError, match="check_structure"):
        bppsa.grad(_loss(reversal, xs, check_structure=True), check_structure=False)(A)


@pytest.mark.parametrize("value", ["yes", 1, None.__class__])
def test_check_structure_must_be_a_bool(value):
    with pytest.raises(TypeError, match="check_structure must be a bool"):
        bppsa.grad(lambda a: a, check_structure=value)
    with pytest.raises(TypeError, match="check_structure must be a bool"):
        bppsa.scan(lambda h, x: (h, None), 0.0, jnp.ones(3), check_structure=value)
