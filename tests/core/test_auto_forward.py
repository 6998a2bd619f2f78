"""The forward's policy (the default forward, and forward="auto"): lax.scan on CPUs; on
accelerators the Newton forward bounded so that a run that never converges costs at most
1.25x lax.scan, where the cost model says it can pay. Stateless: no record of earlier runs."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.scan._core import cost
from bppsa.scan._core.auto_forward import MIN_ITERATIONS, OVERRUN, break_even, budget
from bppsa.scan._core.cost import footprint_of
from bppsa.scan._core.forward import SequentialForward
from bppsa.scan._profile import GPU, SM90_ENVELOPE
from tests.helpers import assert_trees_close

# The accelerator profile without a fused step latency (no measured rate, its programs without
# the kernel lab's estimates), on this CPU: lax.scan or a bounded Newton.
NO_FUSED = dataclasses.replace(
    GPU, kernels=dataclasses.replace(GPU.kernels, fused_programs=SM90_ENVELOPE)
)
assert GPU.rates.fused_step_latency is None and not cost.fused_rated(NO_FUSED)
ON_GPU = bppsa.Auto(profile=NO_FUSED)
BLELLOCH = bppsa.Blelloch()


def test_auto_forward_decisions_are_pinned():
    auto = bppsa.AutoForward()
    assert auto.choose(10_000, 20, "cpu", batch=16) == SequentialForward()  # measured: slower
    # With the fused kernel (the H200 profile): the best sequential forward, which no Newton
    # budget keeps within 1.25x (its fallback is lax.scan).
    for length in (1000, 10_000, 30_000):
        assert auto.choose(length, 20, "gpu", batch=16) == bppsa.Fused(), length
        fp = footprint_of(length, 20, 16)
        assert budget(fp, GPU, BLELLOCH, shared=True, best=cost.fused_forward(fp, GPU)) == 0

    # Without it: Newton bounded by the budget on the paper's small cells over long sequences.
    def no_fused(length, size=20):
        fp = footprint_of(length, size, 16)
        return auto.forward_for(fp, BLELLOCH, BLELLOCH, NO_FUSED)[0]

    for length in (10_000, 30_000):
        k = budget(footprint_of(length, 20, 16), NO_FUSED, BLELLOCH, shared=True)
        assert no_fused(length) == bppsa.Newton(max_iterations=k, solver=BLELLOCH), length
    assert [no_fused(t).max_iterations for t in (10_000, 30_000)] == [16, 25]
    # Shorter sequences (at T = 1000 four iterations cost more than a quarter of lax.scan),
    # or large cells whose dense Jacobian products cost n-fold: lax.scan.
    assert no_fused(1000) == SequentialForward() and no_fused(100) == SequentialForward()
    assert no_fused(10_000, 1024) == SequentialForward()


@pytest.mark.parametrize("length,size", [(10_000, 20), (30_000, 20), (4096, 1024)])
def test_the_bound_keeps_a_run_that_never_converges_within_1_25x(length, size):
    """At the bound, Newton's iterations cost at most OVERRUN of lax.scan (so a run that
    stops there and finishes sequentially costs at most 1.25x); one iteration more, above."""
    element, width = (size, 1) if size == 1024 else (None, None)  # the diagonal GRU's maps
    auto = bppsa.AutoForward()
    fp = footprint_of(length, size, 8, element, width)
    k = budget(fp, GPU, BLELLOCH, shared=True)  # against lax.scan
    assert MIN_ITERATIONS <= k <= break_even(fp, GPU, BLELLOCH, shared=True)
    options = dict(batch=8, element=element, width=width)
    at, above = (auto.predictions(length, size, "gpu", **options, iterations=i) for i in (k, k + 1))
    sequential, newton = SequentialForward(), bppsa.Newton()
    assert at[newton] <= OVERRUN * at[sequential] < above[newton]
    assert at[newton] + at[sequential] <= (1 + OVERRUN) * at[sequential]


def test_the_break_even_counts_the_final_evaluation_unless_it_is_shared():
    """Where the backward does not take Newton's Jacobians, the evaluation that certifies the
    trajectory forms them once more: the break-even pays for it (by value)."""
    fp = footprint_of(30_000, 20, 1)
    sequential = cost.sequential_forward(fp).seconds(GPU)
    final = cost.jacobians(fp, fp.length).seconds(GPU)
    iteration = cost.plus(BLELLOCH.cost(fp), cost.Cost(1, 0, 0)).seconds(GPU)
    assert final > iteration / 100  # large enough to move the count
    assert break_even(fp, GPU, BLELLOCH, shared=True) == math.floor(sequential / iteration)
    unshared = break_even(fp, GPU, BLELLOCH, shared=False)
    assert unshared == math.floor((sequential - final) / iteration)
    assert unshared < break_even(fp, GPU, BLELLOCH, shared=True)
    assert budget(fp, GPU, BLELLOCH, shared=False) == math.floor(
        (OVERRUN * sequential - final) / iteration
    )


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


def test_on_an_accelerator_profile_newton_runs_the_same_in_every_trace(x64):
    """The policy's profile decides (here the H200's, on this CPU): a bounded Newton forward,
    exact gradients; a second trace decides the same (no record of the runs)."""
    w = 0.4 * jnp.eye(3) + 0.1
    xs = jax.random.normal(jax.random.key(0), (4, 2000, 3), jnp.float64)
    loss = lambda w, xs: jax.vmap(functools.partial(rnn_loss, bppsa.scan, w))(xs).sum()
    reference = jax.grad(
        lambda w, xs: jax.vmap(functools.partial(rnn_loss, jax.lax.scan, w))(xs).sum()
    )
    infos = []
    with bppsa.trace_plans() as plans:
        grads = jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    first, second = plans
    assert isinstance(first.forward, bppsa.Newton)
    assert first.forward.max_iterations >= MIN_ITERATIONS
    assert first.forward_because.startswith("predicted: Newton pays up to")
    assert (second.forward, second.forward_because) == (first.forward, first.forward_because)
    assert_trees_close(grads, reference(w, xs), jnp.float64)
    # What adapts is the caller's: the same Newton with a callback reports every run.
    observed = dataclasses.replace(first.forward, callback=infos.append)
    jax.block_until_ready(jax.grad(lambda w: loss_with(observed, w, xs))(w))
    assert infos and all(bool(jnp.all(i.converged)) for i in infos)
    assert all(int(jnp.max(i.iterations)) < first.forward.max_iterations for i in infos)


def loss_with(forward, w, xs):
    scan = functools.partial(bppsa.scan, forward=forward, method=ON_GPU)
    return jax.vmap(functools.partial(rnn_loss, scan, w))(xs).sum()


def test_a_scan_that_stops_converging_keeps_its_step_within_the_budget(x64):
    """An expansive cell: the bounded Newton run falls back (certified: lax.scan's values and
    exact gradients) after at most the budget's iterations; the next trace decides the same."""
    w = 3.0 * jnp.eye(3) - 1.0
    xs = jax.random.normal(jax.random.key(1), (2000, 3), jnp.float64)
    loss = functools.partial(rnn_loss, bppsa.scan)
    with bppsa.trace_plans() as plans:
        grads = jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
        jax.jit(bppsa.grad(loss, method=ON_GPU))(w, xs)
    assert isinstance(plans[0].forward, bppsa.Newton)
    assert plans[1].forward == plans[0].forward
    assert_trees_close(
        grads, jax.grad(functools.partial(rnn_loss, jax.lax.scan))(w, xs), jnp.float64
    )
    infos = []
    observed = dataclasses.replace(plans[0].forward, callback=infos.append)
    scan = functools.partial(bppsa.scan, forward=observed, method=ON_GPU)
    jax.block_until_ready(jax.grad(functools.partial(rnn_loss, scan))(w, xs))
    (info,) = infos
    assert not bool(info.converged) and int(info.fallback_steps) > 0
    assert int(info.iterations) <= plans[0].forward.max_iterations


def test_plain_back_propagation_keeps_lax_scan_on_every_profile():
    """BP differentiates lax.scan itself: asked for, or where the accelerator profile's cost
    model picks it (a huge batch: BP's n-fold smaller arithmetic wins; no memory limit, which
    that batch's 600 GB would exceed)."""
    xs = jnp.ones((1000, 3))

    def loss(w, **options):
        body = lambda h, x: (jnp.tanh(w @ h + x), None)
        return bppsa.scan(body, jnp.zeros(3), xs, **options)[0].sum()

    with bppsa.trace_plans() as plans:
        bppsa.grad(functools.partial(loss, method="sequential"))(jnp.eye(3))
        huge = functools.partial(loss, method=ON_GPU, batch=10**7, memory_limit=math.inf)
        bppsa.grad(huge)(jnp.eye(3))
    assert [p.method for p in plans] == [bppsa.Sequential()] * 2
    assert all(p.forward == SequentialForward() for p in plans)
    assert all("plain back-propagation" in p.forward_because for p in plans)


def test_newtons_solver_is_held_to_the_memory_limit():
    """The forward's solves form what the backward's scan forms: under a limit that Blelloch's
    estimate exceeds, the solver is the memory guard's fallback; under one that nothing fits,
    lax.scan (the backward's trace would raise)."""
    w = jnp.full((20, 20), 0.05)
    body = lambda h, x: (jnp.tanh(w @ h + x), None)
    xs = jnp.ones((10_000, 20))

    def plan(limit):
        run = lambda xs: bppsa.scan(
            body, jnp.zeros(20), xs, method=ON_GPU, batch=16, memory_limit=limit
        )
        with bppsa.trace_plans() as plans:
            jax.eval_shape(run, xs)
        return plans[0]

    assert plan(math.inf).forward.solver == BLELLOCH
    blelloch = bppsa.estimate_memory(body, jnp.zeros(20), xs, method=BLELLOCH, batch=16)
    limited = plan(blelloch - 1)
    assert isinstance(limited.forward, bppsa.Newton) and limited.forward.solver != BLELLOCH
    solver = bppsa.estimate_memory(body, jnp.zeros(20), xs, method=limited.forward.solver, batch=16)
    assert solver <= blelloch - 1
    assert limited.forward_because.startswith("predicted")
    nothing = plan(1)
    assert nothing.forward == SequentialForward() and "memory limit" in nothing.forward_because


def test_with_a_fused_kernel_the_default_forward_is_the_kernel_where_it_runs():
    """On the H200's profile the default forward is the fused kernel (here interpreted), with
    BP's gradients; a cell the kernel cannot run gets the bounded Newton or lax.scan, and the
    plan says why."""
    w = 0.4 * jnp.eye(3) + 0.1
    xs = jax.random.normal(jax.random.key(0), (2000, 3))
    loss = functools.partial(rnn_loss, bppsa.scan)
    with bppsa.trace_plans() as plans:
        grads = jax.jit(bppsa.grad(loss, method=bppsa.Auto(profile=GPU)))(w, xs)
    assert plans[0].forward == bppsa.Fused(), plans[0]
    assert plans[0].forward_because.startswith("predicted: the fused kernel")
    assert_trees_close(
        grads, jax.grad(functools.partial(rnn_loss, jax.lax.scan))(w, xs), jnp.float32
    )

    def cumulative(scan, w, xs):  # a cumsum over the carry: no padded rule in the kernel
        body = lambda h, x: (jnp.tanh(w @ jnp.cumsum(h) + x), h)
        carry, ys = scan(body, jnp.zeros(3), xs)
        return jnp.sum(carry**2) + jnp.sum(jnp.sin(ys))

    with bppsa.trace_plans() as plans:
        bppsa.grad(functools.partial(cumulative, bppsa.scan), method=bppsa.Auto(profile=GPU))(w, xs)
    assert isinstance(plans[0].forward, bppsa.Newton), plans[0]
    assert "fused kernel: the primitive 'cumsum'" in plans[0].forward_because


def test_a_backend_without_step_estimates_is_not_priced_with_another_s():
    """A profile whose programs carry the kernel lab's estimates (Triton's) but whose fused
    backend is Mosaic GPU (no estimate: unmeasured) ranks neither fused loop: the decision
    says why, rather than pricing Mosaic GPU's kernels at Triton's estimates."""
    mosaic = dataclasses.replace(
        GPU, kernels=dataclasses.replace(GPU.kernels, fused_backend="mosaic_gpu")
    )
    assert cost.fused_rated(mosaic)
    w = 0.4 * jnp.eye(3) + 0.1
    xs = jnp.ones((2000, 3))
    loss = functools.partial(rnn_loss, bppsa.scan)
    for profile, fused in ((GPU, True), (mosaic, False)):
        with bppsa.trace_plans() as plans:
            jax.eval_shape(bppsa.grad(loss, method=bppsa.Auto(profile=profile)), w, xs)
        assert (plans[0].forward == bppsa.Fused()) == fused, plans[0]
        if not fused:
            assert cost.UNPRICED in plans[0].forward_because, plans[0]
            assert plans[0].method != bppsa.FusedSequential(), plans[0]


def test_an_explicit_fused_forward_that_cannot_run_is_lax_scan_with_its_reason():
    xs = jnp.ones((7, 3), jnp.float32)
    body = lambda h, x: (jnp.tanh(jnp.cumsum(h) + x), h)
    with bppsa.trace_plans() as plans:
        out = bppsa.scan(body, jnp.zeros(3), xs, forward="fused", method="sequential")
    assert plans[0].forward == SequentialForward()
    assert plans[0].forward_because.startswith("the fused kernel: the primitive 'cumsum'")
    assert plans[0].method == bppsa.Sequential()  # plain lax.scan: no Jacobians
    ref = jax.lax.scan(body, jnp.zeros(3), xs)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))


def test_the_policy_s_queries_by_value():
    """choose() and predictions() answer for the footprint they are given, on the backend's
    profile: a structured cell's maps, the batch, and the bound by default."""
    bppsa.set_profile("bppsa-test-no-fused", NO_FUSED)
    try:
        auto = bppsa.AutoForward()
        assert repr(auto) == "'auto'"
        diagonal = dict(element=1024, width=1)
        for fp, asked in (
            (footprint_of(4096, 1024, 8, 1024, 1), dict(batch=8, **diagonal)),
            (footprint_of(30_000, 20, 1), {}),  # the default batch: one example
            (footprint_of(4096, 1024, 8), dict(batch=8)),  # dense: lax.scan
        ):
            expected = auto.forward_for(fp, BLELLOCH, BLELLOCH, NO_FUSED)[0]
            assert auto.choose(fp.length, fp.size, "bppsa-test-no-fused", **asked) == expected
        assert isinstance(auto.choose(4096, 1024, "bppsa-test-no-fused", batch=8, **diagonal),
                          bppsa.Newton)  # fmt: skip
        fp = footprint_of(30_000, 20, 16)
        k = budget(fp, GPU, BLELLOCH, shared=True)
        predicted = auto.predictions(30_000, 20, "gpu", batch=16)
        assert predicted[bppsa.Newton()] == cost.newton_forward(fp, k, BLELLOCH, True).seconds(GPU)
        assert predicted[SequentialForward()] == cost.sequential_forward(fp).seconds(GPU)
    finally:
        bppsa.set_profile("bppsa-test-no-fused", None)
    # Where the final evaluation alone costs more than lax.scan: no iteration pays.
    dense = footprint_of(4096, 1024, 8)
    assert break_even(dense, GPU, BLELLOCH, shared=False) == 0
    assert budget(dense, GPU, BLELLOCH, shared=False) == 0
