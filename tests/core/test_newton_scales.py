"""bppsa.Newton on a carry whose components differ in scale by orders of magnitude: every
component is certified relative to its OWN size, so the small ones come out as accurate as
lax.scan's, checked component by component.

A residual test relative to the largest state (``max |f|`` instead of ``|f|``, or a mean over
all components instead of over the steps of each) passes the first iterate of such a carry
at once: the small components' errors vanish next to the large components."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from tests.helpers import NEWTON_RTOL

T, I = 12, 2
# Large and small scales whose ratio is beyond the tolerance (64 eps: 7.6e-6 in float32,
# 1.4e-14 in float64), so that the small components' first-iterate errors, relative to the large
# components, look converged.
SCALES = {jnp.dtype("float32"): (1e3, 1e-3), jnp.dtype("float64"): (1e8, 1e-8)}


def problem(dtype):
    big, small = SCALES[jnp.dtype(dtype)]
    keys = jax.random.split(jax.random.key(4), 3)
    w = 0.9 * jax.random.normal(keys[0], (2, 2), dtype) / np.sqrt(2)
    u = jax.random.normal(keys[1], (2, I), dtype)
    xs = jax.random.normal(keys[2], (T, I), dtype)

    def body(h, x):
        # Components 0-1: large, from the input alone (exact at the first iterate); 2-3: small,
        # a tanh RNN on their own past (the Newton iterations' work).
        large = big * jnp.tanh(u @ x)
        tiny = small * jnp.tanh(w @ (h[2:] / small) + u[::-1] @ x)
        return jnp.concatenate([large, tiny]), h

    init = jnp.array([big, -big, small, -small], dtype)
    return body, init, xs


def per_component_errors(actual, expected):
    """max over steps of |actual - expected| relative to each component's largest |expected|."""
    a, b = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return np.max(np.abs(a - b), axis=0) / np.max(np.abs(b), axis=0)


@pytest.mark.parametrize("quasi", [False, True])
def test_every_component_is_certified_at_its_own_scale(dtype, quasi):
    body, init, xs = problem(dtype)
    infos = []
    newton = bppsa.Newton(quasi=quasi, max_iterations=T, callback=infos.append)
    # ys[t] is the state entering step t: with the final carry, every state h_0 ... h_T.
    carry, ys = jax.jit(lambda xs: bppsa.scan(body, init, xs, forward=newton))(xs)
    carry_ref, ys_ref = jax.lax.scan(body, init, xs)
    errors = per_component_errors(
        jnp.concatenate([ys, carry[None]]), jnp.concatenate([ys_ref, carry_ref[None]])
    )
    assert np.all(errors <= NEWTON_RTOL[jnp.dtype(dtype)]), errors
    info = infos[-1]
    # The small components start wrong: iterations are needed, and this contractive cell
    # converges (3 iterations with full Jacobians, 11 with their diagonals, in float32).
    assert int(info.iterations) >= 1 and bool(info.converged), info
