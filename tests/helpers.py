"""Tolerances (in one place) and reference problems for the gradient-equivalence tests."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Tolerances on the normwise relative error max|a - b| / max|b| of each gradient leaf.
# Normwise, because BPPSA sums the same products in a different order than back-propagation:
# each entry carries rounding relative to the magnitude of the whole gradient, and entries
# that happen to be near zero would make an elementwise relative error meaningless.
# float64: 1e-10, as the core issue asks; measured errors are ~1e-15 at T = 1000.
# float32: BPPSA reassociates ~log2(T) levels of products of Jacobians and sums the parameter
# cotangents of all steps in one reduction instead of one by one; measured <= 3e-7 at T = 1000
# for RNN, GRU and LSTM (the retired benchmarks/gradient_error.py, in git history), so 1e-5
# leaves a 30x margin while an ordering bug (errors of ~1e-2) still fails.
RTOL = {jnp.dtype("float64"): 1e-10, jnp.dtype("float32"): 1e-5}


def derandomized(max_examples: int, *also_suppress: HealthCheck) -> settings:
    """hypothesis settings that draw the same ``max_examples`` every run (no database, no
    deadline): a property test that cannot fail by chance."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, *also_suppress],
    )


def marked_slow(*values) -> list:
    """``values`` as ``pytest.param``s that only ``-m slow`` runs."""
    return [pytest.param(value, marks=pytest.mark.slow) for value in values]


def spread(*axes, crossed: int = 1) -> list:
    """Every combination of ``axes`` as ``pytest.param``s of one ``parametrize``, the default
    suite running a covering part of them and ``-m slow`` the rest.

    The first ``crossed`` axes are crossed (every combination of their values is in the default
    suite); every other axis is rotated over those combinations, so each of its values is still
    met there. A value that is a tuple fills several argument names (``"length,where"``).
    """
    heads = list(itertools.product(*(range(len(axis)) for axis in axes[:crossed])))
    tails = [len(axis) for axis in axes[crossed:]]
    default = {
        heads[j % len(heads)] + tuple(j % size for size in tails)
        for j in range(max([len(heads), *tails]))
    }
    params = []
    for index in itertools.product(*(range(len(axis)) for axis in axes)):
        values = [axis[i] for axis, i in zip(axes, index, strict=True)]
        flat = [v for value in values for v in (value if isinstance(value, tuple) else (value,))]
        marks = () if index in default else (pytest.mark.slow,)
        params.append(pytest.param(*flat, marks=marks, id="-".join(map(str, flat))))
    return params


def relative_errors(actual, expected) -> list[float]:
    """Normwise relative error of each leaf."""
    out = []
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(np.max(np.abs(b), initial=0.0), np.finfo(np.float64).tiny)
        out.append(float(np.max(np.abs(a - b), initial=0.0) / scale))
    return out


# Tolerances of a trajectory computed by bppsa.Newton against lax.scan's (and of what is derived
# from it). Newton certifies every step's residual to 64 eps (float32: 7.6e-6; float64: 1.4e-14)
# relative to the states, not to lax.scan's own rounding: measured differences from lax.scan
# reach 1.2e-5 in float32 (benchmarks/newton.py) and 1.2e-14 in float64. 1e-4 leaves
# an 8x margin in float32 while a wrong trajectory (errors of order 1) still fails.
NEWTON_RTOL = {jnp.dtype("float64"): 1e-10, jnp.dtype("float32"): 1e-4}


def assert_trees_close(actual, expected, dtype, tolerances=RTOL) -> None:
    """Asserts every leaf is within the tolerance of ``dtype`` and has the same structure."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    errors = relative_errors(actual, expected)
    assert max(errors, default=0.0) <= tolerances[jnp.dtype(dtype)], errors


def as_float64(tree):
    """The floating-point leaves of ``tree`` in float64 (x64 must be enabled)."""
    return jax.tree.map(
        lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def assert_close_to_back_propagation(actual, expected, dtype, reference_fn, args) -> None:
    """``assert_trees_close(actual, expected)`` with ``expected`` back-propagation's result in
    ``dtype``, except for float32 leaves off by more than the tolerance: there the draw may be
    ill-conditioned (seen: T = 5, a 3-leaf carry whose Jacobians nearly cancel; float32 BP off the
    float64 gradient by 2.6e-5, BPPSA by 3.6e-5), so both are measured against the float64
    gradient (``reference_fn`` at ``args``, x64 enabled here) and BPPSA must be within
    ``max(RTOL, 2 x BP's error)`` of it: the accuracy claim of docs/accuracy.md, never a
    skipped draw; or the leaf must be negligible in the whole gradient (its absolute error
    within RTOL of the largest entry of any leaf).
    """
    dtype = jnp.dtype(dtype)
    errors = relative_errors(actual, expected)
    if dtype != jnp.dtype("float32") or max(errors, default=0.0) <= RTOL[dtype]:
        assert_trees_close(actual, expected, dtype)
        return
    with jax.enable_x64(True):
        reference = jax.tree.map(
            lambda a: np.asarray(a, np.float64), jax.jit(reference_fn)(*as_float64(args))
        )
    as_numpy = functools.partial(jax.tree.map, lambda a: np.asarray(a, np.float64))
    bp_errors = relative_errors(as_numpy(expected), reference)
    bppsa_errors = relative_errors(as_numpy(actual), reference)
    # A leaf can be negligible next to the rest of the gradient (seen: T = 9, a saturated tanh
    # carry whose init cotangent is ~1e-17 while the other leaves are O(1): float32 BP off
    # by 1.6% of that leaf, BPPSA by 14%, both from rounding the saturated derivatives, and
    # both ~1e-18 in absolute terms). Such a leaf passes when its absolute error is within the
    # tolerance of the whole gradient's scale.
    whole = max(np.max(np.abs(r), initial=0.0) for r in jax.tree.leaves(reference))
    leaves = zip(
        errors, bp_errors, bppsa_errors, jax.tree.leaves(actual), jax.tree.leaves(reference)
    )
    for error, bp, bppsa, mine, ref in leaves:
        if error > RTOL[dtype]:
            absolute = np.max(np.abs(np.asarray(mine, np.float64) - ref), initial=0.0)
            negligible = absolute <= RTOL[dtype] * whole
            assert negligible or bppsa <= max(RTOL[dtype], 2 * bp), (
                errors,
                bp_errors,
                bppsa_errors,
            )


def cell_problem(cell, length, batch, hidden, dtype, inputs=3, seed=0):
    """Parameters (PyTorch init), inputs ``(batch, length, inputs)``, two read-out vectors and a
    non-zero initial state per example (so that its cotangent is not trivially that of zero)."""
    keys = jax.random.split(jax.random.key(seed), 5)
    params = cell.init(inputs, hidden, key=keys[0], dtype=dtype)
    xs = jax.random.normal(keys[1], (batch, length, inputs), dtype)
    head = jax.random.normal(keys[2], (hidden,), dtype)
    head_every = jax.random.normal(keys[3], (hidden,), dtype)
    init = distinct_state(cell.initial_state(hidden, dtype), keys[4], (batch,))
    return params, xs, (head, head_every), init


def distinct_state(state, key, batch: tuple = ()):
    """``state``'s leaves (e.g. an LSTM's ``h`` and ``c``) drawn from their own keys split from
    ``key``, ``0.5 N(0, 1)``, each with leading dims ``batch``: no two leaves equal, so a
    swap of the carry's leaves changes the result (zeros for both would hide it)."""
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten(
        [
            0.5 * jax.random.normal(k, (*batch, *jnp.shape(leaf)), jnp.result_type(leaf))
            for k, leaf in zip(keys, leaves)
        ]
    )


def cell_loss(cell, scan, where):
    """A scalar loss of ``(params, xs, heads, init)``: one scan per example, vmapped.

    ``where="last"``: read-out of the final state (the cotangent enters on the carry only);
    ``"every"``: read-outs of every step (cotangents on every ``y_t``, none on the carry).
    """

    def loss(params, xs, heads, init):
        head, head_every = heads

        def one(x, state):
            def body(state, x_t):
                state = cell(params, state, x_t)
                return state, cell.output(state) @ head_every

            state, ys = scan(body, state, x)
            return cell.output(state) @ head if where == "last" else ys.sum()

        return jax.vmap(one)(xs, init).sum()

    return loss


def compiled_flops(fn, *args) -> float:
    """XLA's count of the floating-point operations of ``fn`` compiled for ``args`` (a loop's
    body counted once): deterministic, unlike a timing."""
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float(analysis["flops"])


def assert_path(plans, method, jacobians="analytic") -> None:
    """Asserts what the scans traced under ``bppsa.trace_plans()`` ran: the concrete ``method``
    (also for the backward pass, unless it is plain ``lax.scan``) and the Jacobians' kind."""
    assert plans, "no bppsa.scan was traced (a cached trace records nothing)"
    for plan in plans:
        assert plan.method == method, (plan.method, method)
        assert plan.jacobians == jacobians, (plan.jacobians, jacobians)
        if method.keeps_carries:
            assert plan.backward == method, (plan.backward, method)
        else:
            assert plan.backward is None, plan.backward


def classifier_loss_reference(model, params, xs, labels):
    """``SequenceClassifier.loss`` written with ``jax.lax.scan``: the reference for its
    gradients (independent of bppsa's dispatch)."""

    def logits(x):
        state0 = model.cell.initial_state(model.hidden_size, x.dtype)
        state, _ = jax.lax.scan(
            lambda s, x_t: (model.cell(params["cell"], s, x_t), None), state0, x
        )
        return params["head"]["weight"] @ model.cell.output(state) + params["head"]["bias"]

    log_probs = jax.nn.log_softmax(jax.vmap(logits)(xs))
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))
