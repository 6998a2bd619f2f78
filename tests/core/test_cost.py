"""The cost model of the backward methods (bppsa.scan._core.cost): counts that follow the
algorithms, and a time that adds latency-bound steps to throughput-bound work; a fused loop's
step at the static estimate of the program its plan launches, unless a measured rate wins."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._core import cost
from bppsa.scan._core.memory import NOT_CHECKED, Footprint
from bppsa.scan._core.methods.auto import ACCELERATOR_CHOICES, checked_footprint, ranked
from bppsa.scan._core.problem import prepare
from bppsa.scan._profile import CPU, GPU, SM90_ENVELOPE


def footprint(length, size=20, batch=16):
    return Footprint(length, size, size, size * size, 4, batch, size)


def test_dependent_steps_follow_the_algorithms():
    fp = footprint(10_000)
    assert bppsa.Sequential().cost(fp).steps == 10_000
    assert bppsa.Blelloch().cost(fp).steps == 2 + cost.KERNELS_PER_LEVEL * 2 * 14  # log2(10001)
    chunked = bppsa.Chunked(100).cost(fp)
    assert chunked.steps == 2 + 2 * 100 + cost.KERNELS_PER_LEVEL * 2 * 7
    assert bppsa.Chunked(1).cost(fp).steps == bppsa.SequentialScan().cost(fp).steps


def test_blelloch_does_about_n_times_the_arithmetic_of_back_propagation():
    fp = footprint(10_000, size=64)
    ratio = bppsa.Blelloch().cost(fp).flops / bppsa.Sequential().cost(fp).flops
    assert 64 <= ratio <= 2 * 64


@pytest.mark.parametrize("block", [1, 7, 100, 8192, 10_000, 20_000])
def test_blocks_repeat_the_inner_method(block):
    """Full blocks of the inner method, and a shorter first block where ``block`` does not
    divide ``T`` (10k = 1428 x 7 + 4 = 8192 + 1808)."""
    fp = footprint(10_000)
    inner = bppsa.Blelloch().cost(footprint(min(block, 10_000)))
    blocked = bppsa.Blocked(bppsa.Blelloch(), block).cost(fp)
    blocks, head = divmod(10_000, min(block, 10_000))
    first = bppsa.Blelloch().cost(footprint(head)) if head else cost.Cost(0, 0, 0)
    assert blocked.steps == inner.steps * blocks + first.steps
    assert blocked.flops == inner.flops * blocks + first.flops
    assert (head > 0) == (block in (7, 8192))


def test_time_is_latency_plus_the_larger_of_arithmetic_and_bytes():
    profile = bppsa.Profile("test", bppsa.Rates(flops=1e12, bandwidth=1e11, step_latency=1e-5))
    c = cost.Cost(steps=100, flops=2e12, bytes=1e11)
    assert c.seconds(profile) == pytest.approx(100 * 1e-5 + 2.0)
    c = cost.Cost(steps=100, flops=1e9, bytes=1e12)
    assert c.seconds(profile) == pytest.approx(100 * 1e-5 + 10.0)


class Sharded4(bppsa.Sharded):
    """``Sharded`` as if its mesh had four devices (the cost is arithmetic on the count)."""

    devices = 4  # type: ignore[assignment]


@pytest.mark.parametrize("exchange", ["all_gather", "ppermute"])
def test_sharded_costs_a_slice_its_aggregate_and_the_exchange(exchange):
    local = bppsa.Blelloch()
    one = bppsa.Sharded(local=local, exchange=exchange)
    assert one.cost(footprint(10_000)) == local.cost(footprint(10_000))  # nothing to exchange
    four = Sharded4(local=local, exchange=exchange)
    fp = footprint(10_000)
    part = local.cost(fp.part(2500))
    assert part == local.cost(footprint(2500))  # the carries kept do not enter the cost
    rounds = 2 if exchange == "ppermute" else 0
    expected = cost.plus(part, cost.aggregate(fp, 2500), cost.exchange(fp, 4, rounds))
    sharded = four.cost(fp)
    assert sharded == expected
    # The critical path: about 2 T / P dependent steps (the aggregate, then the slice), far
    # fewer than back-propagation's T, for P times the slice's arithmetic.
    assert 2500 < sharded.steps < 2500 + part.steps + 10
    assert sharded.flops > part.flops


# ---- the fused loops' step: the program's static estimate, unless measured ------------------

B = 16
SMALL = bppsa.FusedProgram(num_warps=1, max_tile=1 << 16, max_resident=1100, step_latency=0.3e-6)
LARGE = bppsa.FusedProgram(num_warps=4, max_tile=1 << 16, max_resident=1 << 17, step_latency=0.9e-6)


def with_fused(*programs, **rates):
    """The GPU profile with ``programs`` and the rates changed by ``rates``."""
    return dataclasses.replace(
        GPU,
        rates=dataclasses.replace(GPU.rates, **rates),
        kernels=dataclasses.replace(GPU.kernels, fused_programs=programs),
    )


def rnn_problem(hidden, length=64):
    """The scan of the paper's RNN over ``length`` steps of ``B`` vmapped examples."""
    params = RNN().init(2, hidden, key=jax.random.key(0))
    body = lambda h, x: (rnn_cell(params, h, x), h)
    xs = jnp.ones((length, 2))
    return prepare(body, jnp.zeros(hidden), xs, None, reverse=False, batch=B)[0]


def rnn_grad_plan(profile, length, hidden=20):
    """The plan ``Auto(profile=profile)`` makes for a gradient through the RNN (traced only)."""
    params = RNN().init(2, hidden, key=jax.random.key(0))
    xs = jnp.ones((B, length, 2))

    def loss(p, x):
        h, hs = bppsa.scan(lambda h, x: (rnn_cell(p, h, x), h), jnp.zeros(hidden), x)
        return jnp.sum(h**2) + jnp.sum(jnp.sin(hs))

    grad = bppsa.grad(
        lambda p: jax.vmap(functools.partial(loss, p))(xs).sum(),
        method=bppsa.Auto(profile=profile),
    )
    [plan] = bppsa.trace_plans(grad, params)
    return plan


def assert_priced_at(latency, fp, forward_step, profile):
    """Both fused loops of ``fp`` (its forward's plan estimating ``forward_step``) cost their
    steps at ``latency`` each on ``profile``: ``FusedSequential()``'s ``T`` steps save the
    step latency less it, and ``Fused()``'s forward is ``T`` of it over the arithmetic."""
    predicted = bppsa.FusedSequential().cost(fp)
    saved = fp.length * (profile.rates.step_latency - latency)
    plain = cost.Cost.seconds(predicted, profile)
    assert predicted.seconds(profile) == pytest.approx(plain - saved, rel=1e-12)
    stepped = dataclasses.replace(fp, fused_forward_step=forward_step)
    work = cost.sequential_forward(fp)
    arithmetic = cost.Cost(0, work.flops, work.bytes).seconds(profile)
    assert cost.fused_forward(stepped, profile) == pytest.approx(
        fp.length * latency + arithmetic, rel=1e-12
    )


def test_a_fused_loop_is_priced_at_the_estimate_of_the_program_its_plan_launches():
    """Two programs: the RNN at H = 20 (1088 resident entries in its forward's loop, 1056 in
    its backward's) runs in the first, at its 0.3 us a step; at H = 64 (over 4096) in the
    second, at its 0.9 us. The plans carry the program, the footprint its estimate, and the
    cost model prices each loop's steps at it (no measured rate on this profile)."""
    profile = with_fused(SMALL, LARGE)
    assert profile.rates.fused_step_latency is None and cost.fused_rated(profile)
    for hidden, program in ((20, SMALL), (64, LARGE)):
        problem = rnn_problem(hidden)
        forward = bppsa.Fused().prepare(problem, profile)
        assert forward.loop.program == program and forward.step_latency == program.step_latency
        fp = checked_footprint(problem, profile)
        assert (fp.fused_backward, fp.fused_backward_step) == (None, program.step_latency)
        assert_priced_at(program.step_latency, fp, forward.step_latency, profile)
    # A footprint of numbers has no plan: the slowest of the programs' estimates.
    assert cost.fused_step(profile) == LARGE.step_latency
    numbers = bppsa.FusedSequential().cost(footprint(64))
    assert numbers.fused_step is None
    assert numbers.seconds(profile) == pytest.approx(
        cost.Cost.seconds(numbers, profile)
        - 64 * (profile.rates.step_latency - LARGE.step_latency),
        rel=1e-12,
    )


def test_the_scan_s_decision_prices_the_loops_by_their_plans(monkeypatch):
    """At T = 1000 the RNN's backward (H = 20) is the fused loop at the small program's
    0.3 us a step, Blelloch's scan where it runs in the large one at 0.9 us (the first
    program holding too little); the forward's policy sees its own plan's estimate."""
    seen = []
    forward_for = bppsa.AutoForward.forward_for

    def spy(self, fp, *args, **kwargs):
        seen.append(fp.fused_forward_step)
        return forward_for(self, fp, *args, **kwargs)

    monkeypatch.setattr(bppsa.AutoForward, "forward_for", spy)
    tight = dataclasses.replace(SMALL, max_resident=1000)
    assert rnn_grad_plan(with_fused(SMALL, LARGE), 1000).method == bppsa.FusedSequential()
    assert rnn_grad_plan(with_fused(tight, LARGE), 1000).method == bppsa.Blelloch()
    assert seen == [SMALL.step_latency, LARGE.step_latency]


def test_a_measured_fused_step_latency_wins_over_the_estimates():
    """``Rates.fused_step_latency`` (a device's measurement, ``fit_profile --fused``) prices
    every fused step, whatever program the plan launches."""
    measured = with_fused(SMALL, LARGE, fused_step_latency=2e-6)
    problem = rnn_problem(20)
    fp = checked_footprint(problem, measured)
    assert fp.fused_backward_step == SMALL.step_latency  # the plan's, overridden below
    assert cost.fused_step(measured, SMALL.step_latency) == 2e-6 == cost.fused_step(measured)
    assert_priced_at(2e-6, fp, SMALL.step_latency, measured)
    # Without estimates on the programs, the measured rate alone rates the profile.
    assert cost.fused_step(with_fused(SM90_ENVELOPE[0], fused_step_latency=2e-6)) == 2e-6


@pytest.mark.parametrize("which", ["no estimate", "no backend"])
def test_a_profile_with_no_fused_step_does_not_rank_the_fused_loops(which):
    """Neither a measured rate nor estimates on its programs, or estimates but no fused
    backend (other platforms): the fused loops are not priced, not ranked, and the step is not
    traced for them."""
    if which == "no estimate":
        profile = with_fused(*SM90_ENVELOPE)
    else:
        profile = dataclasses.replace(
            with_fused(SMALL, LARGE),
            kernels=dataclasses.replace(with_fused(SMALL, LARGE).kernels, fused_backend=None),
        )
    assert not cost.fused_rated(profile) and cost.fused_step(profile, 1e-6) is None
    assert ranked(None, profile, fused_backward=True) == ACCELERATOR_CHOICES
    problem = rnn_problem(20)
    fp = checked_footprint(problem, profile)
    assert (fp.fused_backward, fp.fused_backward_step) == (NOT_CHECKED, None)
    assert cost.fused_forward(dataclasses.replace(fp, fused_forward_step=1e-6), profile) is None
    predicted = bppsa.FusedSequential().cost(dataclasses.replace(fp, fused_backward_step=1e-6))
    assert predicted.seconds(profile) == cost.Cost.seconds(predicted, profile)
    plan = rnn_grad_plan(profile, 64)
    assert plan.method != bppsa.FusedSequential() and plan.forward != bppsa.Fused()


def test_the_cpu_profile_prices_no_fused_step():
    """The CPU keeps sm_90a's envelope without the lab's estimates: nothing fused is priced
    there, as before the estimates."""
    assert CPU.kernels.fused_programs == SM90_ENVELOPE and not cost.fused_rated(CPU)
    assert cost.fused_rated(GPU) and GPU.rates.fused_step_latency is None
    assert all(p.step_latency is not None for p in GPU.kernels.fused_programs)
