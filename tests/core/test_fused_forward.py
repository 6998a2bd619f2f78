"""The fused forward (``forward="fused"``): one Pallas kernel for a scan's recurrence.

On this CPU the kernel runs in Pallas' interpreter: its values are compared with ``lax.scan``'s
(float32 rounding: the kernel sums products in another order), its gradients through the
library's derivative rules with ``jax.grad`` through ``lax.scan``, and its lowering for CUDA
under an abstract H200 is checked to hold the Triton kernel and no while loop of its own.
"""

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import bppsa
from bppsa.models import (
    CIFGLSTM,
    GRU,
    LSTM,
    RNN,
    DiagonalGRU,
    cifg_lstm_cell,
    diagonal_gru_cell,
    gru_cell,
    lstm_cell,
    rnn_cell,
)
from bppsa.scan._core import tracing
from bppsa.scan._core.forward import SequentialForward
from bppsa.scan._core.fused import backend, kernel, lanes, padded, triton
from bppsa.scan._core.fused import forward as fused_forward
from bppsa.scan._core.fused.forward import Fused
from bppsa.scan._core.fused.matvec import Arranged
from bppsa.scan._core.fused.split import residuals
from bppsa.scan._core.jaxprs.walk import flat_jaxpr
from bppsa.scan._core.problem import prepare
from bppsa.scan._profile import GPU
from tests.helpers import distinct_state, relative_errors

# float32: the kernel's matrix-vector products sum in another order than XLA's dot, so values
# differ by rounding (measured <= 2e-7 at T = 9); 1e-5 (the suite's float32 tolerance) leaves a
# margin for a few steps of amplification while a leaked padded lane (errors ~1e-1) fails.
# bfloat16: 2 ulps (2^-7) of a value of size 1.
RTOL = {jnp.dtype("float32"): 1e-5, jnp.dtype("bfloat16"): 2.0**-6}
T, I = 7, 3


def assert_close(actual, expected, dtype=jnp.float32):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    errors = relative_errors(
        jax.tree.map(lambda a: a.astype(jnp.float32), actual),
        jax.tree.map(lambda a: a.astype(jnp.float32), expected),
    )
    assert max(errors, default=0.0) <= RTOL[jnp.dtype(dtype)], errors


def xs_of(length=T, inputs=I, seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), (length, inputs), dtype)


def params_of(cell, hidden, dtype=jnp.float32):
    return cell.init(I, hidden, key=jax.random.key(0), dtype=dtype)


def state_of(cell, hidden):
    """A seeded initial carry, its leaves distinct (an LSTM's ``h`` is not its ``c``)."""
    return distinct_state(cell.initial_state(hidden), jax.random.key(3))


def weight(hidden, out=None, seed=2):
    out = hidden if out is None else out
    return jax.random.normal(jax.random.key(seed), (out, hidden)) / np.sqrt(hidden)


# ---- the cells: (name, body factory, init) ---------------------------------------------------


def library(cell_type, fn):
    def make(hidden):
        params = params_of(cell_type, hidden)
        return (
            lambda h, x: (fn(params, h, x), cell_type.output(h)),
            state_of(cell_type, hidden),
        )

    return make


def layer_norm(hidden):  # a layer norm over the carry
    w, u = weight(hidden), weight(I, hidden)

    def body(h, x):
        z = w @ h + u @ x
        z = (z - z.mean()) / jnp.sqrt(z.var() + 1e-5)
        return jnp.tanh(z), h.sum()

    return body, jnp.full(hidden, 0.1)


def split_gates(hidden):  # gates split from one product, by jnp.split and by slices
    w, u = weight(hidden, 3 * hidden), weight(I, 3 * hidden)

    def body(h, x):
        g = w @ h + u @ x
        r, z = jnp.split(g[: 2 * hidden], 2)
        n = jnp.tanh(g[2 * hidden :] * jax.nn.sigmoid(r))
        return (1 - jax.nn.sigmoid(z)) * n + jax.nn.sigmoid(z) * h, n[::-1]

    return body, jnp.zeros(hidden)


def pytree_carry(hidden):  # a dict carry with an integer counter, a concatenation and a max
    w = weight(2 * hidden, hidden)

    def body(c, x):
        both = jnp.concatenate([c["h"], c["m"]])
        h = jnp.tanh(w @ both + x.sum())
        m = jnp.maximum(c["m"], h) - 0.1 * jnp.max(h)
        return {"h": h, "m": m, "n": c["n"] + 1}, (h, c["n"])

    return body, {"h": jnp.zeros(hidden), "m": jnp.zeros(hidden), "n": jnp.int32(0)}


def moves(hidden):  # moves of the carry inside the loop: a reversal, a roll, a pad, a slice
    w = weight(hidden)

    def body(h, x):
        moved = 0.5 * h[::-1] + 0.25 * jnp.roll(h, 1) + 0.125 * jnp.pad(h[1:], (0, 1))
        return jnp.tanh(w @ h + moved + x.sum()), h[:3]

    return body, jnp.linspace(-1.0, 1.0, hidden)


CELLS = {
    "rnn": library(RNN(), rnn_cell),
    "gru": library(GRU(), gru_cell),
    "lstm": library(LSTM(), lstm_cell),
    "layer_norm": layer_norm,
    "split_gates": split_gates,
    "pytree": pytree_carry,
    "moves": moves,
}


def fused_plan(body, init, xs, profile=None):
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    return Fused().prepare(problem, profile), Fused().why_not(problem, profile)


# The built-in envelope and a program of 16 warps holding 2^16 entries in one operation and
# 2^17 loaded: for cases past the built-in envelope whose point is not the envelope (their
# kernels would spill on a device, which the interpreter does not mind).
WIDE = bppsa.FusedProgram(num_warps=16, max_tile=1 << 16, max_resident=1 << 17)


@contextlib.contextmanager
def wide_envelope():
    """The CPU's scans traced inside the block run with :data:`WIDE` added; yields that
    profile."""
    cpu = bppsa.get_profile("cpu")
    programs = (*cpu.kernels.fused_programs, WIDE)
    wide = dataclasses.replace(
        cpu, kernels=dataclasses.replace(cpu.kernels, fused_programs=programs)
    )
    bppsa.set_profile("cpu", wide)
    try:
        yield wide
    finally:
        bppsa.set_profile("cpu", None)


# ---- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "hidden"),
    [
        ("rnn", 20),
        ("gru", 20),
        ("lstm", 20),
        ("layer_norm", 20),
        ("layer_norm", 24),
        ("split_gates", 100),
        ("pytree", 5),
        ("moves", 20),
    ],
)
def test_interpreted_kernel_equals_lax_scan(cell, hidden):
    body, init = CELLS[cell](hidden)
    xs = xs_of()
    with wide_envelope() as profile:
        assert fused_plan(body, init, xs, profile)[1] is None  # the kernel runs it
        assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))


def test_reverse_and_vmap():
    body, init = CELLS["lstm"](20)
    xs = xs_of()
    actual = bppsa.scan(body, init, xs, reverse=True, forward=Fused())
    assert_close(actual, lax.scan(body, init, xs, reverse=True))

    inits = jax.tree.map(lambda a: jnp.stack([a, a + 0.5, -a]), init)
    batch = jnp.stack([xs, 2 * xs, -xs])
    fused = jax.vmap(lambda c, x: bppsa.scan(body, c, x, forward="fused"))(inits, batch)
    assert_close(fused, jax.vmap(lambda c, x: lax.scan(body, c, x))(inits, batch))


def test_bfloat16():
    params = params_of(GRU(), 20, jnp.bfloat16)
    body = lambda h, x: (gru_cell(params, h, x), h)
    init, xs = jnp.zeros(20, jnp.bfloat16), xs_of(dtype=jnp.bfloat16)
    assert fused_plan(body, init, xs)[1] is None
    actual = bppsa.scan(body, init, xs, forward="fused")
    assert_close(actual, lax.scan(body, init, xs), jnp.bfloat16)


def test_the_loop_keeps_only_the_recurrence():
    """The RNN at H = 20: the kernel runs 4 operations a step (``W_hh h``, ``+ b_hh``,
    ``+ (W_ih x_t + b_ih)``, ``tanh``); the input projection and its bias are formed for all
    steps before the loop."""
    body, init = CELLS["rnn"](20)
    xs = xs_of()
    plan, _ = fused_plan(body, init, xs)
    names = [eqn.primitive.name for eqn in plan.split.recurrence]
    assert names == ["dot_general", "add", "add", "tanh"]
    assert [v.aval.shape for v in plan.split.step_residuals] == [(20,)]
    whole = flat_jaxpr(lambda h, x: body(h, x)[0], init, xs[0])
    assert len(whole.jaxpr.eqns) == 8  # and two transposes, one x product, one bias: once

    body, init = CELLS["layer_norm"](20)  # a product used whole, three times: formed once
    plan, _ = fused_plan(body, init, xs)
    assert [e.primitive.name for e in plan.split.recurrence].count("dot_general") == 1


def test_gate_slices_become_products_with_sliced_weights():
    """The GRU at H = 20: no move (slice, split) is left in the loop; its three gate
    products are (20, 20) each, not one (60, 20) product and three selections."""
    body, init = CELLS["gru"](20)
    plan, _ = fused_plan(body, init, xs_of())
    names = [eqn.primitive.name for eqn in plan.split.recurrence]
    assert not {"slice", "split"} & set(names)
    dots = [e for e in plan.split.recurrence if e.primitive.name == "dot_general"]
    assert [e.outvars[0].aval.shape for e in dots] == [(20,)] * 3


# ---- independent lanes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell_type", "cell", "hidden", "tiles"),
    [(DiagonalGRU(), diagonal_gru_cell, 300, 3), (CIFGLSTM(), cifg_lstm_cell, 200, 2)],
)
def test_independent_lanes_run_in_tiles(cell_type, cell, hidden, tiles):
    """A diagonal GRU at H = 300 runs in 3 programs of 128 lanes (the last one's 84 lanes past
    H computed and dropped), the CIFG LSTM's ``(h, c)`` pairs at H = 200 in 2."""
    body, init = library(cell_type, cell)(hidden)
    xs = xs_of()
    plan, reason = fused_plan(body, init, xs)
    assert reason is None and (plan.tiled.tile, plan.tiled.count) == (128, tiles)
    actual = bppsa.scan(body, init, xs, reverse=True, forward="fused")
    assert_close(actual, lax.scan(body, init, xs, reverse=True))
    inits = jax.tree.map(lambda a: jnp.stack([a, a + 0.5]), init)
    batch = jnp.stack([xs, -xs])
    fused = jax.vmap(lambda c, x: bppsa.scan(body, c, x, forward="fused"))(inits, batch)
    assert_close(fused, jax.vmap(lambda c, x: lax.scan(body, c, x))(inits, batch))


def test_a_batched_carry_splits_its_last_axis():
    """The language model's scan: a diagonal GRU over a ``(B, H)`` carry (its per-unit weights
    broadcast over ``B`` inside the loop), H = 300 in 3 tiles, every tile holding all of B."""
    params = params_of(DiagonalGRU(), 300)
    body = lambda h, x: (diagonal_gru_cell(params, h, x), h)
    init = jnp.full((2, 300), 0.1)
    xs = jnp.stack([xs_of(), -xs_of()], axis=1)
    plan, reason = fused_plan(body, init, xs)
    assert reason is None and plan.tiled.count == 3
    assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))


def test_a_planted_tile_index_fails(monkeypatch):
    """Every program reading the first tile's lanes must break the equality."""
    body, init = library(DiagonalGRU(), diagonal_gru_cell)(300)
    xs = xs_of()
    spec = kernel._tile_spec
    monkeypatch.setattr(kernel, "_tile_spec", lambda block, axis, lead: spec(block, None, lead))
    with pytest.raises(AssertionError):
        assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))


@pytest.mark.filterwarnings("ignore::bppsa.AnalyticJacobianWarning")  # cells fed a moved carry
def test_lanes_that_mix_are_not_split():
    """The lanes stay whole where the recurrence mixes them, and the analysis says how."""
    params = params_of(DiagonalGRU(), 200)
    cells = {
        "a contraction over the lanes": CELLS["rnn"](200),
        "a reduction over the lanes": (
            lambda h, x: (diagonal_gru_cell(params, h - h.mean(), x), h),
            jnp.zeros(200),
        ),
        "a move along the lanes": (
            lambda h, x: (diagonal_gru_cell(params, h[::-1], x), h),
            jnp.zeros(200),
        ),
    }
    xs = xs_of()
    for why, (body, init) in cells.items():
        with wide_envelope() as profile:  # W_hh of H = 200: past the built-in envelope
            plan, reason = fused_plan(body, init, xs, profile)
            assert reason is None and plan.tiled is None
            assert why in lanes.lanes_of(plan.split)
            assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))
    body, init = library(DiagonalGRU(), diagonal_gru_cell)(128)  # one tile: one program
    assert fused_plan(body, init, xs)[0].tiled is None
    body, init = library(DiagonalGRU(), diagonal_gru_cell)(300)
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    assert Fused(lanes=None).prepare(problem).tiled is None
    assert Fused(lanes=64).prepare(problem).tiled.count == 5
    with pytest.raises(ValueError, match="lanes must be a positive int"):
        Fused(lanes=0)


# ---- fallbacks -------------------------------------------------------------------------------


def test_a_primitive_the_kernel_cannot_run_falls_back_with_a_reason():
    w = weight(6)
    body = lambda h, x: (jnp.tanh(jnp.cumsum(w @ h) + x.sum()), h)
    init, xs = jnp.zeros(6), xs_of()
    _, reason = fused_plan(body, init, xs)
    assert isinstance(reason, str) and "cumsum" in reason, reason
    assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))


def test_float64_falls_back(x64):
    params = params_of(RNN(), 4, jnp.float64)
    body = lambda h, x: (rnn_cell(params, h, x), h)
    init, xs = jnp.zeros(4, jnp.float64), xs_of(dtype=jnp.float64)
    assert "float64" in fused_plan(body, init, xs)[1]
    actual = bppsa.scan(body, init, xs, forward="fused")
    expected = lax.scan(body, init, xs)
    assert max(relative_errors(actual, expected)) <= 1e-12


def test_the_envelope_is_the_profiles():
    """The RNN at H = 20 keeps 1088 entries loaded after padding (``W_hh`` 32 x 32, ``b_hh`` and
    the carry 32 each): a profile whose envelope holds 1024 falls back, naming the limit; the
    default and the H200's run the kernel. A plan made under one envelope is not another's."""
    body, init = CELLS["rnn"](20)
    xs = xs_of()
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    small = bppsa.FusedProgram(num_warps=4, max_tile=1 << 16, max_resident=1024)
    kernels = dataclasses.replace(GPU.kernels, fused_programs=(small,))
    tiny = dataclasses.replace(GPU, kernels=kernels)
    assert Fused().why_not(problem) is None and Fused().why_not(problem, GPU) is None
    reason = Fused().why_not(problem, tiny)
    assert reason == (
        "the loop keeps 1088 entries of constants and carry loaded after padding "
        "(max_resident: 1024): beyond the envelope's largest program (4 warps)"
    )
    assert Fused().why_not(problem, GPU) is None
    for profile, forward in ((GPU, Fused()), (tiny, SequentialForward())):  # the decision's
        scan = functools.partial(bppsa.scan, forward="fused", method=bppsa.Auto(profile=profile))
        with bppsa.trace_plans() as plans:
            jax.eval_shape(lambda x, scan=scan: scan(body, init, x), xs)
        assert plans[0].forward == forward
        assert plans[0].forward_because == (
            None if profile is GPU else f"the fused kernel: {reason}"
        )


def test_a_planted_mask_leak_fails(monkeypatch):
    """With the masks all ones, the padded lanes (24 of 32) enter the layer norm's mean and
    variance: the equality with lax.scan must then fail."""
    body, init = CELLS["layer_norm"](24)
    xs = xs_of()
    monkeypatch.setattr(padded, "valid_lanes", lambda shape, axes: None)
    with pytest.raises(AssertionError):
        assert_close(bppsa.scan(body, init, xs, forward="fused"), lax.scan(body, init, xs))


def test_the_padded_lanes_of_the_carry_hold_zeros(monkeypatch):
    """The layer norm at H = 24: its padded lanes (24 to 31 of 32) would hold ``tanh`` of the
    normalized zeros; the kernel writes zeros there after every step (its masked fill) and the
    real lanes equal lax.scan's carries."""
    body, init = CELLS["layer_norm"](24)
    xs = xs_of()
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    loop = Fused().prepare(problem).loop.interpreted
    _, _, constants, steps = residuals(loop.split, problem.body.consts, [xs], T)
    monkeypatch.setattr(kernel, "unpad", lambda x, shape, lead=1: x)  # the padded lanes kept
    (after,) = kernel.carries_after(
        loop.split, T, [init], constants, steps, backend=loop.backend, launch=loop.launch
    )
    assert after.shape == (T, 32)
    assert not np.any(np.asarray(after[:, 24:]))
    final, before = lax.scan(lambda h, x: (body(h, x)[0], h), init, xs)
    assert_close(after[:, :24], jnp.concatenate([before[1:], final[None]]))


def test_the_lowering_table_is_read():
    assert triton._RULES is not None and triton.has_rule("tanh")
    assert not triton.has_rule("cumsum_of_nothing")
    assert "fused" not in tracing.problems()


# ---- gradients -------------------------------------------------------------------------------


@pytest.mark.parametrize(("cell_type", "cell"), [(RNN(), rnn_cell), (LSTM(), lstm_cell)])
def test_gradients_through_the_library_rules(cell_type, cell, monkeypatch):
    launches = []
    run = fused_forward.carries_after
    monkeypatch.setattr(
        fused_forward, "carries_after", lambda *a, **k: launches.append(1) or run(*a, **k)
    )
    params, init, xs = params_of(cell_type, 20), state_of(cell_type, 20), xs_of()

    def loss(scan, params, xs):
        carry, ys = scan(lambda h, x: (cell(params, h, x), cell_type.output(h)), init, xs)
        return sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves((carry, ys)))

    actual = bppsa.grad(lambda p, x: loss(bppsa.scan, p, x), argnums=(0, 1), forward="fused")(
        params, xs
    )
    assert launches  # the kernel ran (no fallback)
    expected = jax.grad(lambda p, x: loss(lax.scan, p, x), argnums=(0, 1))(params, xs)
    assert max(relative_errors(actual, expected)) <= 1e-5


# ---- the loop's step: residuals loaded ahead, constants permuted once ------------------------


def interpreted_loop(cell, hidden, reverse=False):
    """``(loop, run)``: the interpreted plan of ``cell``'s fused forward at ``hidden``, and
    ``run(launch)``, its kernel's carries after every step under ``launch``."""
    body, init = CELLS[cell](hidden)
    xs = xs_of()
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    loop = Fused().prepare(problem).loop.interpreted
    _, _, constants, steps = residuals(loop.split, problem.body.consts, [xs], T)
    leaves = jax.tree.leaves(init)

    def run(launch, constants=constants, steps=steps):
        return kernel.carries_after(
            loop.split,
            T,
            leaves,
            constants,
            steps,
            backend=loop.backend,
            launch=launch,
            reverse=reverse,
        )

    return loop, run, (constants, steps)


@pytest.mark.parametrize(("cell", "hidden"), [("rnn", 20), ("gru", 20), ("lstm", 64)])
@pytest.mark.parametrize("reverse", [False, True])
def test_prefetch_on_and_off_give_identical_carries(cell, hidden, reverse):
    """The kernel loads step ``t + 1``'s residuals during step ``t`` (``Launch.prefetch``, the
    default) or each step's own: the same carries, bit for bit, in both directions, at one to
    three steps an iteration (``Launch.unroll``). Across those the steps are the same; the
    interpreter's compiler may round a loop of several steps a body differently (within the
    tolerance of the exactness tests)."""
    loop, run, _ = interpreted_loop(cell, hidden, reverse)
    assert loop.launch.prefetch
    single = run(dataclasses.replace(loop.launch, prefetch=False, unroll=1))
    for unroll in (1, 2, 3):
        ahead = run(dataclasses.replace(loop.launch, prefetch=True, unroll=unroll))
        own = run(dataclasses.replace(loop.launch, prefetch=False, unroll=unroll))
        for a, b, c in zip(ahead, own, single, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-7)


def test_the_profile_switches_the_prefetch():
    assert GPU.kernels.fused_prefetch
    off = dataclasses.replace(GPU.kernels, fused_prefetch=False)
    small = GPU.kernels.fused_programs[0]
    assert not backend.launch_of(off, small, "auto", "auto").prefetch
    assert backend.launch_of(GPU.kernels, small, "auto", "auto").prefetch
    with pytest.raises(ValueError, match="fused_prefetch must be a bool"):
        dataclasses.replace(GPU.kernels, fused_prefetch=1)


def test_the_profile_sets_the_steps_an_iteration():
    """The forward's loop runs ``Kernels.fused_unroll`` steps an iteration of its time loop, a
    backward's ``fused_backward_unroll``."""
    program = GPU.kernels.fused_programs[0]
    kernels = dataclasses.replace(GPU.kernels, fused_unroll=3, fused_backward_unroll=5)
    assert backend.launch_of(kernels, program, "auto", "auto").unroll == 3
    assert backend.launch_of(kernels, program, "auto", "auto", backward=True).unroll == 5
    with pytest.raises(ValueError, match="fused_unroll"):
        dataclasses.replace(GPU.kernels, fused_unroll=0)


def _loop_body(text_jaxpr):
    """The body of the one loop in a kernel's jaxpr and its step counter."""
    (eqn,) = [e for e in text_jaxpr.eqns if e.primitive.name in ("scan", "while")]
    if eqn.primitive.name == "scan":
        body = eqn.params["jaxpr"].jaxpr
        if "num_consts" in eqn.params:
            return body, body.invars[eqn.params["num_consts"]]
        # JAX 0.12: the operands' structure, (constants, carry, xs)
        return body, body.invars[len(list(eqn.params["ft_in"].elts[0].vals))]
    body = eqn.params["body_jaxpr"].jaxpr
    return body, body.invars[eqn.params["body_nconsts"]]


def _ancestors(jaxpr, var) -> list:
    """The equations of ``jaxpr`` that ``var`` is computed from."""
    made = {v: e for e in jaxpr.eqns for v in e.outvars}
    seen, todo = [], [var]
    while todo:
        eqn = made.get(todo.pop())
        if eqn is not None and eqn not in seen:
            seen.append(eqn)
            todo.extend(v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal))
    return seen


@pytest.mark.parametrize("unroll", [1, 2])
@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_loop_body_reads_the_next_steps_residuals(prefetch, reverse, unroll):
    """The loop's iteration ``i`` runs steps ``k = unroll * i + j`` (``j < unroll``): with the
    prefetch, its loads read steps ``k + 1`` (of the loop's order; unclamped: the residuals hold
    one more zero step, after the last or, in reverse, before the first), carried into the next
    step; without it, steps ``k``. The constants are read once, before the loop."""
    loop, run, (constants, steps) = interpreted_loop("rnn", 20, reverse)
    launch = dataclasses.replace(loop.launch, prefetch=prefetch, unroll=unroll)
    traced = jax.make_jaxpr(lambda c, s: run(launch, c, s))(constants, steps)
    (call,) = [e for e in traced.jaxpr.eqns if e.primitive.name == "pallas_call"]
    body, counter = _loop_body(call.params["jaxpr"])
    loads = [e for e in body.eqns if e.primitive.name == "get"]
    assert len(loads) == unroll * len(loop.split.step_residuals) >= 1

    def time(k):  # the index of step k in the residuals passed
        return T - k if reverse and prefetch else T - 1 - k if reverse else k

    for i in range(3):
        read = set()
        for load in loads:
            (index,) = [v for v in load.invars[1:] if not isinstance(v, jax.extend.core.Literal)]
            chain = _ancestors(body, index)
            assert "min" not in [e.primitive.name for e in chain]
            read.add(_evaluated(body, chain, {counter: i})[index])
        wanted = {time(unroll * i + j + (1 if prefetch else 0)) for j in range(unroll)}
        assert read == wanted


def _evaluated(jaxpr, eqns, env) -> dict:
    """``env`` (variables to values) with the outputs of ``eqns`` (equations of ``jaxpr``),
    evaluated in ``jaxpr``'s order."""
    env = dict(env)
    for eqn in sorted(eqns, key=jaxpr.eqns.index):
        args = [v.val if isinstance(v, jax.extend.core.Literal) else env[v] for v in eqn.invars]
        outs = eqn.primitive.bind(*args, **eqn.params)
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
    return {v: int(x) for v, x in env.items()}


@pytest.mark.parametrize(("hidden", "num_warps"), [(20, 2), (20, 1), (64, 4), (64, 1)])
def test_the_matrix_times_the_carry_is_arranged_once_outside_the_loop(hidden, num_warps):
    """The RNN's ``W_hh^T`` (hoisted as ``h @ W_hh^T``'s constant) multiplies the carry: the
    kernel reads it arranged for the program's warps (:mod:`bppsa.scan._core.fused.matvec`),
    passed so from outside the kernel, and never permutes it in the loop. The carries equal
    those of the broadcast product on the constant as it is (summed in another order: equal
    to rounding)."""
    loop, run, _ = interpreted_loop("rnn", hidden)
    split = loop.split
    launch = dataclasses.replace(loop.launch, num_warps=num_warps)
    pairs = loop.backend.permuted_constants(
        split.recurrence, split.constant_residuals, num_warps=num_warps
    )
    ((var, arranged),) = pairs
    assert isinstance(arranged, Arranged) and var in split.constant_residuals
    size = padded.pow2(hidden)
    assert (arranged.k, arranged.n, arranged.warps) == (size, size, num_warps)
    ours = run(launch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(loop.backend), "permuted_constants", lambda self, e, c, num_warps: [])
        theirs = run(launch)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_one_warp_and_several_give_equal_carries():
    """The contraction's order follows the program's warps (columns in one warp, rows of a
    short contraction in several): the carries are equal to rounding either way."""
    for cell in ("rnn", "gru", "lstm"):
        loop, run, _ = interpreted_loop(cell, 20)
        one = run(dataclasses.replace(loop.launch, num_warps=1))
        two = run(dataclasses.replace(loop.launch, num_warps=2))
        for a, b in zip(one, two, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# ---- the CUDA lowering -----------------------------------------------------------------------


def cuda_text(fun, *args) -> str:
    from jax._src.mesh import AbstractDevice, AbstractMesh

    mesh = AbstractMesh(
        (1,),
        ("x",),
        axis_types=(jax.sharding.AxisType.Explicit,),
        abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu"),
    )
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fun).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    ("cell", "hidden"),
    [
        ("rnn", 20),
        ("gru", 20),
        ("lstm", 20),
        ("layer_norm", 24),
        ("split_gates", 20),
        ("pytree", 5),
        ("moves", 20),
    ],
)
def test_the_cuda_lowering_holds_the_kernel_and_no_while(cell, hidden):
    body, init = CELLS[cell](hidden)
    xs = xs_of()

    def fused(c, x):
        return bppsa.scan(body, c, x, reverse=True, forward="fused")

    inits = jax.tree.map(lambda a: jnp.stack([a, a]), init)
    for text in (
        cuda_text(fused, init, xs),
        cuda_text(jax.vmap(fused), inits, jnp.stack([xs] * 2)),
    ):
        assert "xla.gpu.triton" in text
        assert "stablehlo.while" not in text


def test_the_cuda_lowering_splits_independent_lanes_across_programs():
    """The CIFG LSTM at H = 4096, B = 8: 32 programs of 128 lanes per example, 256 in all."""
    body, init = library(CIFGLSTM(), cifg_lstm_cell)(4096)
    inits = jax.tree.map(lambda a: jnp.stack([a] * 8), init)
    xs = jnp.stack([xs_of()] * 8)
    text = cuda_text(jax.vmap(lambda c, x: bppsa.scan(body, c, x, forward="fused")), inits, xs)
    assert "xla.gpu.triton" in text and "stablehlo.while" not in text
    assert "grid_x = 32" in text and "grid_y = 8" in text


def test_the_cuda_lowering_launches_with_the_asked_warps_and_the_profiles_stages():
    """On the H200's profile the RNN at H = 20 (1088 resident entries) gets its first program
    that holds it, the fewest warps, and 1 stage; ``Fused(num_warps=2)`` launches 2 warps."""
    body, init = CELLS["rnn"](20)
    first = GPU.kernels.fused_programs[0]
    assert first.max_resident >= 1088 and GPU.kernels.fused_num_stages == 1
    text = cuda_text(lambda c, x: bppsa.scan(body, c, x, forward="fused"), init, xs_of())
    assert f"num_warps = {first.num_warps}" in text and "num_stages = 1" in text
    text = cuda_text(lambda c, x: bppsa.scan(body, c, x, forward=Fused(num_warps=2)), init, xs_of())
    assert "xla.gpu.triton" in text
    assert "num_warps = 2" in text and "num_stages = 1" in text


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_cuda_lowering_holds_the_kernel_with_and_without_the_prefetch(prefetch):
    """The GRU at H = 20 lowered for CUDA on the H200's profile with ``fused_prefetch`` on and
    off: the Triton kernel either way, and no while loop of its own."""
    body, init = CELLS["gru"](20)
    kernels = dataclasses.replace(GPU.kernels, fused_prefetch=prefetch)
    profile = dataclasses.replace(GPU, kernels=kernels)
    method = bppsa.Auto(profile=profile)
    with bppsa.trace_plans() as plans:
        text = cuda_text(
            lambda c, x: bppsa.scan(body, c, x, forward="fused", method=method), init, xs_of()
        )
    assert plans[0].forward == Fused() and plans[0].forward_because is None
    assert text.count(fused_forward.KERNEL_NAME) >= 1 and "xla.gpu.triton" in text
    assert "stablehlo.while" not in text
