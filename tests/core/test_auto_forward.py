"""The forward's policy (the default forward, and forward="auto"): lax.scan on CPUs; on
accelerators the Newton forward bounded at the cost model's break-even count, where the scan's
record of its own certified runs does not say otherwise."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.scan._core import auto_forward
from bppsa.scan._core.auto_forward import MIN_ITERATIONS, break_even
from bppsa.scan._core.cost import footprint_of
from bppsa.scan._core.forward import SequentialForward
from bppsa.scan._profile import GPU
from tests.helpers import assert_trees_close

ON_GPU = bppsa.Auto(profile=GPU)  # the accelerator profile, on this CPU


@pytest.fixture(autouse=True)
def no_records():
    auto_forward.forget()
    yield
    auto_forward.forget()


def test_auto_forward_decisions_are_pinned():
    auto = bppsa.AutoForward()
    assert auto.choose(10_000, 20, "cpu", batch=16) == SequentialForward()  # measured: slower
    # The paper's small cells over long sequences: Newton, bounded at the break-even count.
    for length in (1000, 10_000, 30_000):
        chosen = auto.choose(length, 20, "gpu", batch=16)
        fp = footprint_of(length, 20, 16)
        k = break_even(fp, backend="gpu", shared=True)  # Blelloch takes Newton's Jacobians
        assert chosen == bppsa.Newton(max_iterations=k, solver=bppsa.Blelloch()), length
    # Short sequences, or large cells whose dense Jacobian products cost n-fold: lax.scan.
    assert auto.choose(100, 20, "gpu", batch=16) == SequentialForward()
    assert auto.choose(10_000, 1024, "gpu", batch=16) == SequentialForward()


@pytest.mark.parametrize("length,size", [(1000, 20), (10_000, 20), (4096, 1024)])
def test_the_bound_is_the_break_even_of_the_cost_model(length, size):
    """At the bound Newton is predicted no slower than lax.scan; one iteration more, slower."""
    element, width = (size, 1) if size == 1024 else (None, None)  # the diagonal GRU's maps
    auto = bppsa.AutoForward()
    fp = footprint_of(length, size, 8, element, width)
    k = break_even(fp, backend="gpu", shared=True)  # the backward takes Newton's Jacobians
    assert k >= break_even(fp, backend="gpu")  # one evaluation fewer: never a lower bound
    assert k >= MIN_ITERATIONS
    options = dict(batch=8, element=element, width=width)
    at, above = (auto.predictions(length, size, "gpu", **options, iterations=i) for i in (k, k + 1))
    sequential, newton = SequentialForward(), bppsa.Newton()
    assert at[newton] <= at[sequential] < above[newton]


def rnn_loss(scan, w, xs):
    carry, ys = scan(lambda h, x: (jnp.tanh(w @ h + x), h), jnp.zeros(3), xs)
    return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))


def test_by_default_the_cpu_runs_lax_scan_and_says_why():
    w = 0.5 * jnp.eye(3)
    xs = jnp.linspace(-1.0, 1.0, 60).reshape(20, 3)
    with bppsa.trace_plans() as plans:
        out = bppsa.scan(lambda h, x: (jnp.tanh(w @ h + x), h), jnp.zeros(3), xs)
        bppsa.scan(lambda h, x: (jnp.tanh(w @ h + x), h), jnp.zeros(3), xs, forward="auto")
    assert [p.forward for p in plans] == [SequentialForward()] * 2
    assert all("slower than lax.scan on CPUs" in p.forward_because for p in plans)
    ref = jax.lax.scan(lambda h, x: (jnp.tanh(w @ h + x), h), jnp.zeros(3), xs)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    with bppsa.trace_plans() as plans:
        bppsa.scan(lambda h, x: (h + x, h), jnp.zeros(3), xs, forward="sequential")
    assert plans[0].forward == SequentialForward() and plans[0].forward_because is None


def test_on_an_accelerator_profile_newton_runs_and_its_runs_are_recorded(x64):
    """The policy's profile decides (here the H200's, on this CPU): a bounded Newton forward,
    exact gradients, and its runs in the scan's record; a record over the bound, or whose last
    run fell back, sends the next trace to lax.scan."""
    w = 0.4 * jnp.eye(3) + 0.1
    xs = jax.random.normal(jax.random.key(0), (4, 1000, 3), jnp.float64)
    loss = lambda w, xs: jax.vmap(functools.partial(rnn_loss, bppsa.scan, w))(xs).sum()
    reference = jax.grad(
        lambda w, xs: jax.vmap(functools.partial(rnn_loss, jax.lax.scan, w))(xs).sum()
    )
    with bppsa.trace_plans() as plans:
        grads = jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    (plan,) = plans
    assert isinstance(plan.forward, bppsa.Newton) and plan.forward.max_iterations >= MIN_ITERATIONS
    assert plan.forward_because.startswith("predicted: Newton pays up to")
    assert_trees_close(grads, reference(w, xs), jnp.float64)
    ((_, record),) = auto_forward.RECORDS.items()
    assert record.runs == 4 and 1 <= record.iterations < plan.forward.max_iterations
    assert record.last_converged
    # A new trace reads the record: still below the bound, Newton again, now "measured".
    with bppsa.trace_plans() as plans:
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert isinstance(plans[0].forward, bppsa.Newton)
    assert plans[0].forward_because.startswith("measured:")
    # Over the bound, or a last run that fell back: lax.scan.
    record.iterations = plan.forward.max_iterations
    with bppsa.trace_plans() as plans:
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert plans[0].forward == SequentialForward() and "break-even" in plans[0].forward_because
    record.iterations, record.last_converged = 1.0, False
    with bppsa.trace_plans() as plans:
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert (
        plans[0].forward == SequentialForward() and "did not converge" in plans[0].forward_because
    )


def test_a_scan_that_stops_converging_keeps_its_step_and_is_recorded(x64):
    """An expansive cell: the bounded Newton run falls back (certified: lax.scan's values and
    exact gradients), the record says so, and the next trace runs lax.scan."""
    w = 3.0 * jnp.eye(3) - 1.0
    xs = jax.random.normal(jax.random.key(1), (1000, 3), jnp.float64)
    loss = functools.partial(rnn_loss, bppsa.scan)
    with bppsa.trace_plans() as plans:
        grads = jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert isinstance(plans[0].forward, bppsa.Newton)
    assert_trees_close(
        grads, jax.grad(functools.partial(rnn_loss, jax.lax.scan))(w, xs), jnp.float64
    )
    ((_, record),) = auto_forward.RECORDS.items()
    assert record.runs == 1 and not record.last_converged
    with bppsa.trace_plans() as plans:
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert plans[0].forward == SequentialForward()


def test_plain_back_propagation_keeps_lax_scan_on_every_profile():
    """BP differentiates lax.scan itself: asked for, or where the accelerator profile's cost
    model picks it (a huge batch: BP's n-fold smaller arithmetic wins)."""
    xs = jnp.ones((1000, 3))

    def loss(w, **options):
        body = lambda h, x: (jnp.tanh(w @ h + x), None)
        return bppsa.scan(body, jnp.zeros(3), xs, **options)[0].sum()

    with bppsa.trace_plans() as plans:
        bppsa.grad(functools.partial(loss, method="sequential"))(jnp.eye(3))
        bppsa.grad(functools.partial(loss, method=ON_GPU, batch=10**7))(jnp.eye(3))
    assert [p.method for p in plans] == [bppsa.Sequential()] * 2
    assert all(p.forward == SequentialForward() for p in plans)
    assert all("plain back-propagation" in p.forward_because for p in plans)


def test_newtons_solver_is_held_to_the_memory_limit():
    """The forward's solves form what the backward's scan forms: under a limit that Blelloch's
    estimate exceeds, the solver is the memory guard's fallback; under one that nothing fits,
    lax.scan."""
    fp = footprint_of(10_000, 20, 16)
    method = ON_GPU.scan_method(fp, jacobians=True)
    newton, _ = auto_forward.choose_forward(ON_GPU, fp, method)
    assert newton.solver == bppsa.Blelloch()
    limit = bppsa.Blelloch().memory(fp) - 1
    newton, why = auto_forward.choose_forward(ON_GPU, fp, method, limit=limit)
    assert isinstance(newton, bppsa.Newton) and newton.solver != bppsa.Blelloch()
    assert newton.solver.memory(fp) <= limit and why.startswith("predicted")
    forward, why = auto_forward.choose_forward(ON_GPU, fp, method, limit=1)
    assert forward == SequentialForward() and "memory limit" in why
