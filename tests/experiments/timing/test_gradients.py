"""The three quantities of a gradient, each its own program: the forward of ``jax.vjp`` returns
the loss and a pullback that works, the backward program reproduces ``jax.grad`` from the saved
residuals, the total is ``jax.value_and_grad``; and all are timed in one interleaved protocol."""

import functools

import jax
import jax.numpy as jnp
import pytest

import bppsa
from experiments.timing import QUANTITIES, GradientPrograms, ms_fields, time_gradients
from tests.experiments.timing.fake_clock import FakeClock
from tests.helpers import assert_trees_close


def problem(length, dtype, hidden=3):
    keys = jax.random.split(jax.random.key(0), 4)
    params = {
        "w": jax.random.normal(keys[0], (hidden, hidden), dtype) / hidden,
        "u": jax.random.normal(keys[1], (hidden,), dtype),
        "b": jax.random.normal(keys[2], (hidden,), dtype),
    }
    xs = jax.random.normal(keys[3], (length,), dtype)
    return params, xs


def loss(params, xs, scan=jax.lax.scan):
    def step(h, x):
        h = jnp.tanh(params["w"] @ h + params["u"] * x + params["b"])
        return h, jnp.sum(h)

    h, ys = scan(step, jnp.zeros_like(params["b"]), xs)
    return jnp.mean(ys) + jnp.sum(h**2)


@pytest.mark.parametrize("length", [1, 5, 17])
def test_each_quantity_is_its_own_program_of_the_gradient(length, dtype):
    params, xs = problem(length, dtype)
    programs = GradientPrograms.from_loss(loss, params, xs)
    value, grads = jax.value_and_grad(loss)(params, xs)

    # The forward: the loss, and the pullback of jax.vjp (usable outside the program too).
    forward_value, pullback = programs.forward(params, xs)
    assert_trees_close(forward_value, value, dtype)
    assert_trees_close(programs.value, value, dtype)
    assert_trees_close(pullback(jnp.ones_like(value))[0], grads, dtype)

    # The backward: the saved residuals and a cotangent of ones give jax.grad.
    assert programs.cotangent.shape == () and programs.cotangent == 1
    assert_trees_close(programs.backward(programs.pullback, programs.cotangent), grads, dtype)

    # The total: jax.value_and_grad.
    assert_trees_close(programs.total(params, xs), (value, grads), dtype)

    assert set(programs.compile_seconds) == set(QUANTITIES)
    assert all(s >= 0 for s in programs.compile_seconds.values())
    assert programs.total.memory_analysis() is not None
    calls = programs.calls()
    assert tuple(calls) == QUANTITIES
    assert_trees_close(calls["backward"](), grads, dtype)


def test_the_backward_runs_the_method_bound_in_the_loss():
    params, xs = problem(17, jnp.float32)
    blelloch = functools.partial(bppsa.scan, method=bppsa.Blelloch())
    with bppsa.trace_plans() as plans:
        programs = GradientPrograms.from_loss(functools.partial(loss, scan=blelloch), params, xs)
    assert plans and {repr(plan.backward) for plan in plans if plan.backward} == {"Blelloch()"}
    expected = jax.grad(loss)(params, xs)  # back-propagation through lax.scan
    actual = programs.backward(programs.pullback, programs.cotangent)
    assert_trees_close(actual, expected, jnp.float32)


def test_a_loss_that_is_not_a_scalar_float_or_not_callable_is_refused():
    params, xs = problem(3, jnp.float32)
    with pytest.raises(ValueError, match="scalar float"):
        GradientPrograms.from_loss(lambda p, xs: p["b"] * jnp.sum(xs), params, xs)
    with pytest.raises(TypeError, match="callable"):
        GradientPrograms.from_loss(None, params, xs)


def fake_programs(clock, name, durations):
    """Programs whose calls take known fake times: ``durations[quantity]`` per call."""
    fakes = {q: clock.call(f"{name}.{q}", durations[q]) for q in QUANTITIES}
    return GradientPrograms(
        total=fakes["total"],
        forward=fakes["forward"],
        backward=fakes["backward"],
        args=(),
        value=None,
        pullback=None,
        cotangent=None,
        compile_seconds={},
    )


def test_all_quantities_of_all_methods_are_interleaved_in_the_same_rounds():
    clock = FakeClock()
    # untimed, timed per round, twice
    programs = {
        "bp": fake_programs(
            clock, "bp", {"total": [1.0, 0.5], "forward": [1.0, 0.25], "backward": [1.0, 0.125]}
        ),
        "blelloch": fake_programs(
            clock,
            "blelloch",
            {"total": [1.0, 0.25, 1.0, 0.5], "forward": [0.5], "backward": [1.0, 0.0625]},
        ),
    }
    others = {"chain": clock.call("chain", [2.0])}
    times = time_gradients(programs, 2, others=others, clock=clock)
    one_round = [
        *("bp.total", "bp.total", "bp.forward", "bp.forward", "bp.backward", "bp.backward"),
        *("blelloch.total", "blelloch.total", "blelloch.forward", "blelloch.forward"),
        *("blelloch.backward", "blelloch.backward", "chain", "chain"),
    ]
    assert clock.order == one_round * 2
    assert times == {
        "bp": {"total": [0.5, 0.5], "forward": [0.25, 0.25], "backward": [0.125, 0.125]},
        "blelloch": {"total": [0.25, 0.5], "forward": [0.5, 0.5], "backward": [0.0625, 0.0625]},
        "chain": {"chain": [2.0, 2.0]},
    }
    assert ms_fields(times["blelloch"]) == {
        "total_ms": 375.0,
        "total_min_ms": 250.0,
        "forward_ms": 500.0,
        "forward_min_ms": 500.0,
        "backward_ms": 62.5,
        "backward_min_ms": 62.5,
    }
    assert ms_fields(times["chain"]) == {"chain_ms": 2000.0, "chain_min_ms": 2000.0}


def test_a_name_in_both_programs_and_others_is_refused():
    clock = FakeClock()
    programs = {"bp": fake_programs(clock, "bp", {q: [1.0] for q in QUANTITIES})}
    with pytest.raises(ValueError, match="bp"):
        time_gradients(programs, 1, others={"bp": clock.call("bp", [1.0])}, clock=clock)


def test_compiled_programs_are_timed_on_the_real_clock():
    params, xs = problem(5, jnp.float32)
    programs = {"bp": GradientPrograms.from_loss(loss, params, xs)}
    times = time_gradients(programs, 2)
    assert {q: len(ts) for q, ts in times["bp"].items()} == dict.fromkeys(QUANTITIES, 2)
    assert all(t >= 0 for ts in times["bp"].values() for t in ts)


def test_the_backwards_kernel_time_is_none_on_a_cpu_and_summed_on_a_device(monkeypatch):
    from experiments.timing import gradients

    params, xs = problem(5, jnp.float32)
    programs = GradientPrograms.from_loss(loss, params, xs)
    assert programs.backward_kernel_ms() is None  # a CPU has no device kernels
    seen = []

    def fake_kernel_seconds(fn, *args, repeats):
        seen.append((fn, args, repeats))
        return 0.0025

    monkeypatch.setattr(gradients.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(gradients, "kernel_seconds", fake_kernel_seconds)
    assert programs.backward_kernel_ms(repeats=4) == 2.5
    ((fn, args, repeats),) = seen
    assert fn is programs.backward and args == (programs.pullback, programs.cotangent)
    assert repeats == 4
