"""The cells ``bppsa.models`` ships run in the fused loops on the GPU profile: within its
envelope neither ``Fused()`` (the forward) nor ``FusedSequential()`` (the backward) falls back.

A fallback is silent apart from a warning and ``trace_plans()``'s ``*_because``: a change to the
kernels' analysis that stops one of the library's own cells from fusing (a primitive it cannot
lower, a lane split it refuses) would otherwise only show as a slower GPU run. The plans are built
by tracing abstractly (nothing is compiled or run).
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import CIFGLSTM, GRU, LSTM, RNN, DiagonalGRU, IndRNN
from bppsa.scan._core.problem import prepare
from bppsa.scan._profile import GPU

T, I, B = 5, 3, 4
CELLS = {
    "rnn": RNN(),
    "rnn_relu": RNN("relu"),
    "gru": GRU(),
    "lstm": LSTM(),
    "cifg_lstm": CIFGLSTM(),
    "diagonal_gru": DiagonalGRU(),
    "indrnn": IndRNN(),
    "indrnn_tanh": IndRNN("tanh"),
}
METHODS = (bppsa.Fused(), bppsa.FusedSequential())


def reasons(cell, hidden, batch, profile=GPU):
    """``{method: why_not(problem, profile)}`` for the scan of ``cell`` over ``T`` float32 steps
    of one example, or of ``batch`` examples under ``jax.vmap``, its parameters traced."""
    found = {}

    def scan(params, init, xs):
        body = lambda state, x: (cell(params, state, x), cell.output(state))
        problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
        assert (problem.batch, problem.vmapped) == (batch or 1, batch is not None)
        found.update({method: method.why_not(problem, profile) for method in METHODS})
        return init

    params = jax.eval_shape(lambda: cell.init(I, hidden, key=jax.random.key(0)))
    init = jax.eval_shape(lambda: cell.initial_state(hidden))
    xs = jax.ShapeDtypeStruct((T, I), jnp.float32)
    if batch is not None:
        scan = jax.vmap(scan, in_axes=(None, 0, 0))
        init, xs = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct((batch, *a.shape), a.dtype), (init, xs)
        )
    jax.eval_shape(scan, params, init, xs)
    return found


def with_resident(limit):
    """The GPU profile with one fused program, of 4 warps, holding ``limit`` resident
    entries."""
    program = bppsa.FusedProgram(num_warps=4, max_tile=1 << 16, max_resident=limit)
    return dataclasses.replace(
        GPU, kernels=dataclasses.replace(GPU.kernels, fused_programs=(program,))
    )


@pytest.mark.parametrize("batch", [None, B], ids=["one", f"vmap{B}"])
@pytest.mark.parametrize("hidden", [20, 64])
@pytest.mark.parametrize("name", list(CELLS))
def test_the_librarys_cells_fuse_on_the_gpu_profile(name, hidden, batch):
    assert reasons(CELLS[name], hidden, batch) == dict.fromkeys(METHODS)


def test_the_check_can_fail():
    """Outside the envelope (the LSTM at H = 64 keeps ``W_hh`` alone, 4 x 64 x 64 entries, loaded)
    both loops name the limit: ``reasons`` reads the profile it is given."""
    found = reasons(CELLS["lstm"], 64, B, with_resident(1024))
    assert set(found) == set(METHODS)
    assert all("(max_resident: 1024)" in reason for reason in found.values()), found


def test_the_envelope_holds_its_limit():
    """The RNN at H = 20 keeps 1088 entries loaded in the forward's loop (``W_hh`` 32 x 32,
    ``b_hh`` and the carry 32 each) and 1056 in the backward's (``W_hh^T`` and the cotangent): an
    envelope of exactly that many runs the kernel, one entry fewer does not."""
    for method, resident in zip(METHODS, (1088, 1056)):
        assert reasons(CELLS["rnn"], 20, None, with_resident(resident))[method] is None
        fewer = reasons(CELLS["rnn"], 20, None, with_resident(resident - 1))[method]
        assert f"keeps {resident} entries" in fewer and f"resident: {resident - 1})" in fewer


@pytest.fixture
def gpu_profile_here():
    """This backend's decisions made with the GPU profile (its envelope) inside the test."""
    backend = jax.default_backend()
    bppsa.set_profile(backend, GPU)
    try:
        yield
    finally:
        bppsa.set_profile(backend, None)


@pytest.mark.parametrize("name", list(CELLS))
def test_the_decision_records_no_fallback(name, gpu_profile_here):
    """Through the public route: ``bppsa.grad`` of a vmapped scan at H = 64 with both loops
    asked for, its plan (``bppsa.trace_plans``) names no reason for either."""
    cell = CELLS[name]

    def loss(params, inits, xs):
        def one(init, x):
            body = lambda state, x: (cell(params, state, x), cell.output(state))
            carry, ys = bppsa.scan(body, init, x, forward="fused")
            return jnp.sum(cell.output(carry)) + jnp.sum(ys)

        return jax.vmap(one)(inits, xs).sum()

    params = jax.eval_shape(lambda: cell.init(I, 64, key=jax.random.key(0)))
    inits = jax.eval_shape(
        lambda: jax.tree.map(lambda a: jnp.stack([a] * B), cell.initial_state(64))
    )
    xs = jax.ShapeDtypeStruct((B, T, I), jnp.float32)
    grad = bppsa.grad(loss, method=bppsa.FusedSequential())
    [plan] = bppsa.trace_plans(grad, params, inits, xs)
    assert (plan.forward, plan.forward_because) == (bppsa.Fused(), None), plan
    assert (plan.backward, plan.backward_because) == (bppsa.FusedSequential(), None), plan


def test_auto_warps_are_the_fewest_of_the_programs_that_hold_the_loop():
    """Programs of 1, 2 and 4 warps holding 1000, 1100 and 20000 resident entries: the RNN at
    H = 20 (1088 in its forward's loop, 1056 in its backward's) gets 2 warps forward and 2
    backward; an explicit ``num_warps`` keeps its own, within its program's envelope."""
    programs = (
        bppsa.FusedProgram(num_warps=1, max_tile=1 << 16, max_resident=1000),
        bppsa.FusedProgram(num_warps=2, max_tile=1 << 16, max_resident=1100),
        bppsa.FusedProgram(num_warps=4, max_tile=1 << 16, max_resident=20000),
    )
    profile = dataclasses.replace(
        GPU, kernels=dataclasses.replace(GPU.kernels, fused_programs=programs)
    )
    cell = CELLS["rnn"]
    params = cell.init(I, 20, key=jax.random.key(0))
    body = lambda state, x: (cell(params, state, x), cell.output(state))
    xs = jnp.zeros((T, I), jnp.float32)
    problem, _ = prepare(body, cell.initial_state(20), xs, None, reverse=False, batch=None)
    assert bppsa.Fused().prepare(problem, profile).loop.launch.num_warps == 2
    backward = bppsa.FusedSequential().prepare(problem, profile)
    assert backward.with_offsets.loop.launch.num_warps == 2
    assert bppsa.Fused(num_warps=4).prepare(problem, profile).loop.launch.num_warps == 4
    # 1 warp's program holds 1000: an explicit num_warps=1 is refused, naming it
    reason = bppsa.Fused(num_warps=1).why_not(problem, profile)
    assert "beyond the envelope at num_warps=1" in reason and "(max_resident: 1000)" in reason
