"""``Auto()`` ranks ``FusedSequential()`` on a profile that prices a fused step (a measured
``fused_step_latency``, or the kernel lab's static estimates on the programs: the H200's): the
one-kernel loop of back-propagation where ``T`` is too short for a parallel scan to pay, the
parallel scan beyond the break-even ``T`` that the cost model's formulas give, never where the
kernel cannot run the step or the Jacobians are scanned anyway, and never on a CPU profile
(whose choices and programs stay those of the measured rules). No gradient runs: the picks, and
the plans of lowered gradients. The formulas are pinned on the H200's profile with a measured
flat rate of 1 us a step (:data:`RATED`), which does not move when the lab's estimates do."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._core import cost, decision
from bppsa.scan._core.memory import NOT_CHECKED
from bppsa.scan._core.methods.auto import (
    ACCELERATOR_CHOICES,
    CostModel,
    checked_footprint,
    ranked,
)
from bppsa.scan._core.problem import prepare
from bppsa.scan._profile import CPU, GPU

FUSED = bppsa.FusedSequential()
H, B = 20, 16  # the paper's RNN: its transposed Jacobian stores H floats a step
# The H200's profile with a measured fused step (benchmarks.tools.fit_profile --fused sets one).
RATED = dataclasses.replace(GPU, rates=dataclasses.replace(GPU.rates, fused_step_latency=1e-6))


def seconds(method, length, profile=RATED):
    """The cost model's prediction for the RNN's backward at ``length`` steps."""
    return method.cost(cost.footprint_of(length, H, B, H)).seconds(profile)


def pick(length, profile=RATED, **options):
    return CostModel(profile=profile).choose(length, H, batch=B, element=H, **options)


def break_even() -> int:
    """The fewest steps at which a parallel scan is predicted faster than the fused loop."""
    low, high = 64, 30_000  # the loop is faster at low, a scan at high

    def scan_pays(length):
        return min(seconds(m, length) for m in (bppsa.Blelloch(), bppsa.Chunked())) < seconds(
            FUSED, length
        )

    assert not scan_pays(low) and scan_pays(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if scan_pays(middle) else (middle, high)
    return high


def test_the_h200_picks_the_fused_loop_below_the_break_even_and_the_scan_above():
    rates = RATED.rates
    found = break_even()
    # The cost model's formulas at these sizes: the loop's T + 2 steps, T of them in the kernel,
    # and its 64 T B H bytes (memory-bound); Blelloch's 2 + 6 ceil(log2(T + 1)) steps (9
    # levels from T = 256 to 511) and 12 T B (H + 4 H + H^2) bytes (memory-bound too).
    fused_per_step = rates.fused_step_latency + 64 * B * H / rates.bandwidth
    scan_per_step = 12 * B * (H + 4 * H + H * H) / rates.bandwidth
    steps_apart = (2 + 6 * 9) - 2
    analytic = steps_apart * rates.step_latency / (fused_per_step - scan_per_step)
    assert analytic == pytest.approx(439.3, abs=0.05)
    assert found == math.ceil(analytic) == 440
    assert seconds(bppsa.Blelloch(), found) == pytest.approx(
        56 * rates.step_latency + found * scan_per_step, rel=1e-9
    )
    assert seconds(FUSED, found) == pytest.approx(
        2 * rates.step_latency + found * fused_per_step, rel=1e-9
    )
    # The policy follows the comparison, on both sides of it.
    for length in (5, 64, 300, found - 1):
        assert pick(length, fused_backward=True) == FUSED, length
    for length in (found, 1000, 30_000):
        assert pick(length, fused_backward=True) == bppsa.Blelloch(), length
    assert seconds(FUSED, 64) < seconds(bppsa.Sequential(), 64) / 6
    # One or two steps: back-propagation's T launches beat the loop's two evaluations around it.
    assert pick(1, fused_backward=True) == pick(2, fused_backward=True) == bppsa.Sequential()
    times = bppsa.Auto().predictions(64, H, "gpu", batch=B, element=H, fused_backward=True)
    assert min(times, key=times.get) == FUSED and set(times) == {*ACCELERATOR_CHOICES, FUSED}


def test_it_is_not_ranked_where_the_kernel_or_the_jacobians_say_no():
    # Where the kernel cannot run the step its loop runs in lax.scan at the step latency.
    assert pick(64) == bppsa.Chunked()
    assert FUSED not in bppsa.Auto().predictions(64, H, "gpu", batch=B, element=H)
    # The finiteness check and a parallel forward's solves scan Jacobians: it forms none.
    assert pick(64, fused_backward=True, jacobians=True) == bppsa.Chunked()
    assert ranked(None, GPU, jacobians=True, fused_backward=True) == (
        bppsa.Blelloch(),
        bppsa.Chunked(),
    )
    # A policy's own candidates hold a method over the Jacobians besides it.
    with pytest.raises(ValueError, match="scans the Jacobians"):
        bppsa.Auto(candidates=(bppsa.Sequential(), FUSED))
    own = CostModel(profile=GPU, candidates=(FUSED, bppsa.Blelloch()))
    assert own.choose(64, H, batch=B, element=H) == bppsa.Blelloch()
    assert own.choose(64, H, batch=B, element=H, fused_backward=True) == FUSED


@pytest.mark.parametrize("length", [1, 5, 64, 440, 30_000])
def test_on_the_cpu_profile_it_is_never_picked(length):
    assert CPU.rates.fused_step_latency is None
    assert ranked(None, CPU, fused_backward=True) == ACCELERATOR_CHOICES
    assert pick(length, CPU, fused_backward=True) != FUSED
    auto = bppsa.Auto().choose(length, H, "cpu", batch=B, element=H, fused_backward=True)
    assert auto == bppsa.Auto().choose(length, H, "cpu", batch=B, element=H)


def rnn_params(dtype):
    return jax.tree.map(lambda a: a.astype(dtype), RNN().init(2, H, key=jax.random.key(0)))


def rnn_body(params):
    return lambda h, x: (rnn_cell(params, h, x), h)


def rnn_grad(length, dtype=jnp.float32, **options):
    """The plan and lowered text of a gradient through the RNN over ``B`` examples."""
    params = rnn_params(dtype)
    xs = jnp.ones((B, length, 2), dtype)

    def loss(p, x):
        h, hs = bppsa.scan(rnn_body(p), jnp.zeros(H, dtype), x)
        return jnp.sum(h**2) + jnp.sum(jnp.sin(hs))

    grad = bppsa.grad(lambda p: jax.vmap(functools.partial(loss, p))(xs).sum(), **options)
    with bppsa.trace_plans() as plans:
        text = jax.jit(grad).lower(params).as_text()
    return plans[0], text


def test_a_scan_on_the_h200_profile_runs_the_loop_where_its_kernel_runs_the_step(x64):
    auto = bppsa.Auto(profile=RATED)
    assert rnn_grad(64, method=auto)[0].method == FUSED
    assert rnn_grad(1000, method=auto)[0].method == bppsa.Blelloch()
    assert rnn_grad(64, method=auto, check_finite=True)[0].method == bppsa.Chunked()
    # A float64 carry: the kernel runs 32-bit types, so the loop would run in lax.scan.
    assert rnn_grad(64, jnp.float64, method=auto)[0].method == bppsa.Chunked()
    for dtype, verdict in ((jnp.float32, None), (jnp.float64, "a carry of float64")):
        init, xs = jnp.zeros(H, dtype), jnp.ones((64, 2), dtype)
        problem, _ = prepare(rnn_body(rnn_params(dtype)), init, xs, None, reverse=False, batch=B)
        checked = checked_footprint(problem, GPU).fused_backward
        assert checked is None if verdict is None else checked.startswith(verdict)
        assert checked_footprint(problem, CPU).fused_backward == NOT_CHECKED


def test_the_cpu_default_asks_nothing_of_the_kernel(monkeypatch):
    """On the CPU's profile the footprint stays unchecked: the decision traces no reverse step,
    and the program is the one of the decision by the plain footprint."""
    plan, text = rnn_grad(64)
    assert isinstance(plan.method, bppsa.Blocked)

    def refuse(self, problem, profile=None):
        raise AssertionError("the kernel was asked on the CPU's profile")

    monkeypatch.setattr(bppsa.FusedSequential, "prepare", refuse)
    monkeypatch.setattr(
        decision, "checked_footprint", lambda problem, profile, prepare=None: problem.footprint
    )
    assert rnn_grad(64) == (plan, text)
    assert cost.footprint_of(64, H, B, H).fused_backward == NOT_CHECKED
