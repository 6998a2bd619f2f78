"""forward="auto": lax.scan on CPUs; Newton on accelerators where the cost model says so."""

import jax
import jax.numpy as jnp

import bppsa
from bppsa.scan._core.forward import SequentialForward


def test_auto_forward_decisions_are_pinned():
    auto = bppsa.AutoForward()
    assert auto.choose(10_000, 20, "cpu", batch=16) == SequentialForward()  # measured: slower
    # The paper's small cells over long sequences: Newton's ~10 x 2 log2(T) levels beat T steps.
    assert isinstance(auto.choose(10_000, 20, "gpu", batch=16), bppsa.Newton)
    assert isinstance(auto.choose(30_000, 20, "gpu", batch=16), bppsa.Newton)
    # Short sequences, or large cells whose dense Jacobian products cost n-fold: lax.scan.
    assert auto.choose(100, 20, "gpu", batch=16) == SequentialForward()
    assert auto.choose(10_000, 1024, "gpu", batch=16) == SequentialForward()
    times = auto.predictions(10_000, 20, "gpu", batch=16)
    assert set(map(type, times)) == {SequentialForward, bppsa.Newton}


def test_auto_forward_runs_the_choice():
    w = 0.5 * jnp.eye(3)
    body = lambda h, x: (jnp.tanh(w @ h + x), h)
    xs = jnp.linspace(-1.0, 1.0, 60).reshape(20, 3)
    with bppsa.trace_plans() as plans:
        out = bppsa.scan(body, jnp.zeros(3), xs, forward="auto")
    assert plans[0].forward == bppsa.AutoForward()
    ref = jax.lax.scan(body, jnp.zeros(3), xs)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
