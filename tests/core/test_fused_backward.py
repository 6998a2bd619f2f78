"""The fused sequential backward (``FusedSequential()``): back-propagation's reverse loop over the
cell's VJP in one Pallas kernel, no Jacobians formed.

On this CPU the kernel runs in Pallas' interpreter: gradients through ``bppsa.grad`` are
compared with ``jax.grad`` through ``lax.scan``, and the gradient's lowering for CUDA under an
abstract H200 is checked to hold the backward's Triton kernel and no while loop of its own.
"""

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
from bppsa.scan._core.cost import Cost
from bppsa.scan._core.fused import backward as fused_backward
from bppsa.scan._core.fused import factors, kernel, padded
from bppsa.scan._core.memory import footprint
from bppsa.scan._core.problem import prepare
from bppsa.scan._profile import CPU, GPU
from tests.core.test_fused_forward import cuda_text
from tests.helpers import distinct_state, relative_errors

# float32: the kernel's products sum in another order than XLA's dot, and the cotangents of the
# constants come from one reduction over the steps instead of T additions (measured <= 3e-7 at
# T = 7); 1e-5, the suite's float32 tolerance, still fails a leaked padded lane or a step
# applied out of order (errors ~1e-2).
RTOL = 1e-5
T, I = 7, 3
METHOD = bppsa.FusedSequential()
KERNELS = bppsa.Kernels()  # the default envelope


def weight(rows, cols, seed):
    return jax.random.normal(jax.random.key(seed), (rows, cols)) / np.sqrt(cols)


def library(cell_type, fn):
    def make(hidden):
        params = cell_type.init(I, hidden, key=jax.random.key(0))
        # Seeded, distinct leaves: a swap of the LSTMs' h and c must change the gradients.
        init = distinct_state(cell_type.initial_state(hidden), jax.random.key(4))
        return fn, params, init, cell_type.output

    return make


def layer_norm(hidden):  # a user cell: a layer norm over the carry, H not a power of two
    def cell(p, h, x):
        z = p["w"] @ h + p["u"] @ x
        z = (z - z.mean()) / jnp.sqrt(z.var() + 1e-5)
        return jnp.tanh(z * p["scale"])

    params = {"w": weight(hidden, hidden, 2), "u": weight(hidden, I, 3), "scale": jnp.ones(hidden)}
    return cell, params, jnp.full(hidden, 0.1), lambda h: h


CELLS = {
    "rnn": library(RNN(), rnn_cell),
    "gru": library(GRU(), gru_cell),
    "lstm": library(LSTM(), lstm_cell),  # a pytree carry (h, c)
    "layer_norm": layer_norm,
    "diagonal_gru": library(DiagonalGRU(), diagonal_gru_cell),
    "cifg_lstm": library(CIFGLSTM(), cifg_lstm_cell),  # 2x2 blocks over (h_i, c_i)
}


def xs_of(length=T, seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), (length, I), dtype)


def loss(scan, cell, output, init, params, xs, *, reverse=False):
    """A loss on every step's output and on the final carry."""
    carry, ys = scan(lambda h, x: (cell(params, h, x), output(h)), init, xs, reverse=reverse)
    return sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves((carry, ys)))


def gradients(name, xs, *, reverse=False, forward=None, method=METHOD, hidden=20):
    """``bppsa.grad`` with ``method`` and ``jax.grad`` through ``lax.scan``, w.r.t. the
    parameters, ``xs`` and the initial carry."""
    cell, params, init, output = CELLS[name](hidden)
    ours = functools.partial(loss, bppsa.scan, cell, output, reverse=reverse)
    reference = functools.partial(loss, lax.scan, cell, output, reverse=reverse)
    options = {} if forward is None else {"forward": forward}
    actual = bppsa.grad(ours, argnums=(0, 1, 2), method=method, **options)(init, params, xs)
    expected = jax.grad(reference, argnums=(0, 1, 2))(init, params, xs)
    return actual, expected


def assert_close(actual, expected, rtol=RTOL):
    errors = relative_errors(actual, expected)
    assert max(errors) <= rtol, errors


@pytest.fixture
def launches(monkeypatch):
    """The backward kernels traced (its abstract build and each platform's branch), as
    ``(reverse, length)``."""
    seen = []
    run = fused_backward.carries_after

    def spy(*args, **kwargs):
        seen.append((kwargs["reverse"], args[1]))
        return run(*args, **kwargs)

    monkeypatch.setattr(fused_backward, "carries_after", spy)
    return seen


def reverse_of(problem, offsets, lanes="auto"):
    """The backward plan's reverse step (with the outputs' cotangents or without), its kernel
    planned within the default envelope."""
    made = fused_backward.plan(problem, KERNELS, "auto", lanes)
    assert made.reverse(offsets).loop is not None and not isinstance(
        made.reverse(offsets).loop, str
    )
    return made.reverse(offsets)


def problem_of(name, hidden=20, xs=None, dtype=jnp.float32):
    cell, params, init, output = CELLS[name](hidden)
    xs = xs_of() if xs is None else xs
    body = lambda h, x: (cell(params, h, x), output(h))
    return prepare(body, init, xs, None, reverse=False, batch=None)[0]


# ---- gradients -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm", "layer_norm"])
def test_gradients_equal_back_propagation(name, launches):
    assert METHOD.why_not(problem_of(name)) is None
    with bppsa.trace_plans() as plans:
        actual, expected = gradients(name, xs_of())
    assert set(launches) == {(True, T)}  # the kernel, all steps, in reverse
    assert plans[0].backward == METHOD and plans[0].backward_because is None
    assert_close(actual, expected)


def test_reverse_and_vmap(launches):
    """A reverse scan, and a ``jax.vmap`` batch: the whole batch at once (the kernel's programs
    over the examples)."""
    actual, expected = gradients("lstm", xs_of(5), reverse=True)
    assert_close(actual, expected)

    cell, params, init, output = CELLS["gru"](20)
    batch = jnp.stack([xs_of(5), -xs_of(5), 0.5 * xs_of(5)])

    def batched(scan, params, batch):
        one = functools.partial(loss, scan, cell, output, init, reverse=True)
        return jax.vmap(one, (None, 0))(params, batch).sum()

    with bppsa.trace_plans() as plans:
        actual = bppsa.grad(functools.partial(batched, bppsa.scan), (0, 1), method=METHOD)(
            params, batch
        )
    assert plans[0].whole_batch
    assert_close(actual, jax.grad(functools.partial(batched, lax.scan), (0, 1))(params, batch))
    assert set(launches) == {(True, 5)}


def test_with_the_fused_forward(launches):
    actual, expected = gradients("rnn", xs_of(), forward="fused")
    assert_close(actual, expected)
    assert set(launches) == {(True, T)}


@pytest.mark.parametrize(
    ("name", "hidden", "tiles"), [("diagonal_gru", 300, 3), ("cifg_lstm", 200, 2)]
)
def test_independent_lanes_run_in_tiles(name, hidden, tiles, launches):
    """The reverse loop of a diagonal GRU at H = 300 runs in 3 programs of 128 lanes, the CIFG
    LSTM's at H = 200 in 2; with the fused forward (tiled too) and reversed."""
    actual, expected = gradients(name, xs_of(5), reverse=True, forward="fused", hidden=hidden)
    assert_close(actual, expected)
    assert set(launches) == {(True, 5)}
    made = reverse_of(problem_of(name, hidden), offsets=True)
    assert (made.loop.tiled.tile, made.loop.tiled.count) == (128, tiles)
    one = bppsa.FusedSequential(lanes=None)
    assert reverse_of(problem_of(name, hidden), offsets=True, lanes=None).loop.tiled is None
    assert repr(one) == "FusedSequential(lanes=None)"


def test_a_planted_tile_index_fails(monkeypatch):
    spec = kernel._tile_spec
    monkeypatch.setattr(kernel, "_tile_spec", lambda block, axis, lead: spec(block, None, lead))
    with pytest.raises(AssertionError):
        assert_close(*gradients("diagonal_gru", xs_of(5), hidden=300))


def test_forward_mode_uses_the_jacobians():
    cell, params, init, output = CELLS["rnn"](20)
    xs = xs_of(4)
    ours = functools.partial(loss, functools.partial(bppsa.scan, method=METHOD), cell, output)
    reference = functools.partial(loss, lax.scan, cell, output)
    args = (init, params, xs)
    tangents = jax.tree.map(jnp.ones_like, args)
    actual = jax.jvp(ours, args, tangents)[1]
    assert_close(actual, jax.jvp(reference, args, tangents)[1])


def test_a_hessian_differentiates_the_loop_in_lax_scan():
    w = weight(4, 4, 5)
    xs = jax.random.normal(jax.random.key(1), (5, 4))

    def loss(scan, w):
        carry, ys = scan(lambda h, x: (jnp.tanh(w @ h + x), h), jnp.zeros(4), xs)
        return jnp.sum(jnp.sin(ys)) + carry.sum()

    actual = jax.hessian(functools.partial(loss, functools.partial(bppsa.scan, method=METHOD)))
    assert_close(actual(w), jax.hessian(functools.partial(loss, lax.scan))(w))


# ---- what the kernel runs --------------------------------------------------------------------


def test_the_loop_runs_only_the_cotangents_cone():
    """Per step of the RNN at H = 20, the kernel multiplies the cotangent by one factor
    hoisted for all steps (tanh's derivative: JAX's rule's two products and sum, folded), forms
    one product with ``W_hh`` and adds what the output sends. The GRU: four scalings, three
    (20, 20) products and their sums, no move (slice, split) of the cotangent; the LSTM (a
    pytree carry): five scalings fewer than JAX's VJP has."""
    made = reverse_of(problem_of("rnn"), offsets=True).split
    names = [e.primitive.name for e in made.recurrence]
    assert names == ["mul", "dot_general", "add"]
    assert [v.aval.shape for v in made.constant_residuals] == [(20, 20)]
    assert [v.aval.shape for v in made.step_residuals] == [(20,), (20,)]
    made = reverse_of(problem_of("gru"), offsets=False).split
    names = [e.primitive.name for e in made.recurrence]
    assert names.count("mul") == 4 and len(names) == 10
    dots = [e for e in made.recurrence if e.primitive.name == "dot_general"]
    assert [e.outvars[0].aval.shape for e in dots] == [(20,)] * 3
    made = reverse_of(problem_of("lstm"), offsets=False).split
    # JAX's own VJP of the LSTM step differs by version: 16 after folding on JAX 0.10, 14 on
    # JAX 0.12.
    assert len(made.recurrence) <= 16


def test_folded_scalings_keep_the_values():
    """``(g a + g) b - 3 g`` and ``-(g c)``: one product each with the carry ``g``; a product
    of two values that depend on the carry is left alone."""

    def fn(g, h, a, b, c):
        return [(g * a + g) * b - 3.0 * g, -(g * c), g * h]

    args = [jnp.linspace(-1.0, 1.0, 5) + k for k in range(5)]
    folded = factors.fold_scalings(jax.make_jaxpr(fn)(*args), 2)
    on_carry, loop = set(folded.jaxpr.invars[:2]), []
    for eqn in folded.jaxpr.eqns:
        if any(v in on_carry for v in eqn.invars if not isinstance(v, jax.extend.core.Literal)):
            on_carry.update(eqn.outvars)
            loop.append(eqn.primitive.name)
    assert loop == ["mul", "mul", "mul"]
    actual = jax.core.eval_jaxpr(folded.jaxpr, folded.consts, *args)
    assert max(relative_errors(actual, fn(*args))) <= 1e-6


def summed(hidden):
    """A cell whose VJP sums, within one step, a value broadcast over the carry's lanes:
    ``mean(h + mean(h))``; elsewhere the factors of the loop, zero in the padded lanes, keep
    them out of every sum even without the masks."""

    def cell(p, h, x):
        return jnp.tanh(p["w"] @ h + p["u"] @ x) + jnp.mean(h + jnp.mean(h))

    params = {"w": weight(hidden, hidden, 2), "u": weight(hidden, I, 3)}
    return cell, params, jnp.full(hidden, 0.1), lambda h: h


def test_a_planted_mask_leak_fails(monkeypatch):
    """With the masks all ones, the padded lanes (12 of 32) enter a sum in the loop: the
    gradients must then differ from lax.scan's."""
    monkeypatch.setitem(CELLS, "summed", summed)
    assert_close(*gradients("summed", xs_of(3)))
    monkeypatch.setattr(padded, "valid_lanes", lambda shape, axes: None)
    with pytest.raises(AssertionError):
        assert_close(*gradients("summed", xs_of(3)))


# ---- fallbacks -------------------------------------------------------------------------------


def cumsum_cell(p, h, x):
    return jnp.tanh(jnp.cumsum(p @ h) + x.sum())


def test_a_primitive_the_kernel_cannot_run_loops_in_lax_scan(launches):
    w, init, xs = weight(6, 6, 4), jnp.zeros(6), xs_of()
    body = lambda h, x: (cumsum_cell(w, h, x), h)
    problem = prepare(body, init, xs, None, reverse=False, batch=None)[0]
    reason = METHOD.why_not(problem)
    assert isinstance(reason, str) and "cumsum" in reason, reason

    def loss(scan, w, xs):
        carry, ys = scan(lambda h, x: (cumsum_cell(w, h, x), h), init, xs)
        return jnp.sum(jnp.sin(ys)) + carry.sum()

    actual = bppsa.grad(functools.partial(loss, bppsa.scan), (0, 1), method=METHOD)(w, xs)
    assert not launches
    assert_close(actual, jax.grad(functools.partial(loss, lax.scan), (0, 1))(w, xs))


def test_float64_loops_in_lax_scan(x64, launches):
    params = RNN().init(I, 4, key=jax.random.key(0), dtype=jnp.float64)
    init, xs = jnp.zeros(4, jnp.float64), xs_of(dtype=jnp.float64)
    body = lambda h, x: (rnn_cell(params, h, x), h)
    assert "float64" in METHOD.why_not(prepare(body, init, xs, None, reverse=False, batch=None)[0])

    def loss(scan, params, xs):
        carry, ys = scan(lambda h, x: (rnn_cell(params, h, x), h), init, xs)
        return jnp.sum(jnp.sin(ys)) + carry.sum()

    with bppsa.trace_plans() as plans:
        actual = bppsa.grad(functools.partial(loss, bppsa.scan), method=METHOD)(params, xs)
    assert not launches
    assert plans[0].backward == METHOD
    assert plans[0].backward_because.startswith("the fused kernel: a carry of float64")
    assert_close(actual, jax.grad(functools.partial(loss, lax.scan))(params, xs), 1e-10)


def test_the_envelope_is_the_profiles(launches):
    """With a profile whose envelope holds 1024 entries, the RNN at H = 20 (``W_hh^T`` 32 x 32
    and the cotangent, 1056 entries, kept loaded) loops in lax.scan both ways, and the plan says
    why; the default envelope runs the kernel."""
    problem = problem_of("rnn")
    small = bppsa.FusedProgram(num_warps=4, max_tile=1 << 16, max_resident=1024)
    kernels = dataclasses.replace(GPU.kernels, fused_programs=(small,))
    tiny = dataclasses.replace(GPU, kernels=kernels)
    assert METHOD.why_not(problem) is None and METHOD.why_not(problem, GPU) is None
    reason = "keeps 1056 entries of constants and carry loaded after padding (max_resident: 1024)"
    assert reason in METHOD.why_not(problem, tiny)
    launches.clear()  # the default's abstract build
    bppsa.set_profile("cpu", tiny)
    try:
        with bppsa.trace_plans() as plans:
            actual, expected = gradients("rnn", xs_of(), forward="fused")
    finally:
        bppsa.set_profile("cpu", None)
    assert not launches
    assert plans[0].backward == METHOD and reason in plans[0].backward_because
    assert "(max_resident: 1024)" in plans[0].forward_because
    assert_close(actual, expected)


def test_a_step_that_cannot_be_traced_falls_back_to_the_sequential_scan(monkeypatch, launches):
    def broken(*args, **kwargs):
        raise NotImplementedError("planted")

    monkeypatch.setattr(fused_backward, "split_step", broken)
    assert "planted" in METHOD.why_not(problem_of("gru"))
    actual, expected = gradients("gru", xs_of(4))
    assert not launches
    assert_close(actual, expected)


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_prefetch_on_and_off_give_identical_gradients(name, monkeypatch):
    """The backward's kernel loads step ``t - 1``'s factors during step ``t`` (the launch's
    prefetch, the default) or each step's own: the same gradients, bit for bit."""
    launches = []
    run = fused_backward.carries_after

    def without(*args, **kwargs):
        launches.append(kwargs["launch"].prefetch)
        kwargs["launch"] = dataclasses.replace(kwargs["launch"], prefetch=False)
        return run(*args, **kwargs)

    ahead, _ = gradients(name, xs_of())
    monkeypatch.setattr(fused_backward, "carries_after", without)
    own, _ = gradients(name, xs_of())
    assert launches and all(launches)  # the profile's default: on
    for a, b in zip(jax.tree.leaves(ahead), jax.tree.leaves(own), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- the CUDA lowering -----------------------------------------------------------------------


@pytest.mark.parametrize("forward", ["sequential", "fused"])
def test_the_cuda_lowering_holds_the_backward_kernel(forward):
    """The gradient lowered for CUDA: the backward's Triton kernel, and no while loop but the
    forward's ``lax.scan`` (none with the fused forward); under ``jax.vmap`` too."""
    cell, params, init, output = CELLS["lstm"](20)
    xs = xs_of()
    ours = functools.partial(loss, bppsa.scan, cell, output, init, reverse=True)
    grad = bppsa.grad(ours, method=METHOD, forward=forward)
    batched = bppsa.grad(
        lambda p, b: jax.vmap(ours, (None, 0))(p, b).sum(), method=METHOD, forward=forward
    )
    for text in (cuda_text(grad, params, xs), cuda_text(batched, params, jnp.stack([xs] * 2))):
        assert text.count(fused_backward.KERNEL_NAME) >= 1
        assert text.count("xla.gpu.triton") == (1 if forward == "sequential" else 2)
        assert text.count("stablehlo.while") == (1 if forward == "sequential" else 0)


def test_the_cuda_lowering_splits_independent_lanes_across_programs():
    """The CIFG LSTM's gradient at H = 4096, B = 8, both loops fused: each kernel a grid of 32
    tiles of 128 lanes by the 8 examples."""
    cell, params, init, output = CELLS["cifg_lstm"](4096)
    ours = functools.partial(loss, bppsa.scan, cell, output, init)
    batched = bppsa.grad(
        lambda p, b: jax.vmap(ours, (None, 0))(p, b).sum(), method=METHOD, forward="fused"
    )
    text = cuda_text(batched, params, jnp.stack([xs_of(5)] * 8))
    assert text.count("xla.gpu.triton") == 2 and "stablehlo.while" not in text
    assert text.count("grid_x = 32") == 2 and text.count("grid_y = 8") == 2


# ---- the method ------------------------------------------------------------------------------


def test_the_method_object():
    assert bppsa.scan.resolve("fused-sequential") == METHOD
    assert repr(METHOD) == "FusedSequential()"
    assert repr(bppsa.FusedSequential(num_warps=8)) == "FusedSequential(num_warps=8)"
    with pytest.raises(ValueError, match="num_warps"):
        bppsa.FusedSequential(num_warps=0)
    assert not METHOD.supports.forward_jacobians and not METHOD.supports.layers


def test_memory_and_cost():
    """It keeps the carries as back-propagation does, and no Jacobians: less memory than the
    sequential scan over them; its T steps run at the profile's fused step latency where it
    prices one (a footprint of numbers: the slowest of the programs' estimates), else at its
    step latency."""
    fp = footprint(None, state=20, length=10_000, itemsize=4, batch=16)
    assert METHOD.memory(fp) < bppsa.SequentialScan().memory(fp)
    predicted = METHOD.cost(fp)
    assert (predicted.steps, predicted.fused, predicted.fused_step) == (10_002, 10_000, None)
    programs = GPU.kernels.fused_programs
    step = max(p.step_latency for p in programs)
    unfused = dataclasses.replace(
        GPU,
        kernels=dataclasses.replace(
            GPU.kernels,
            fused_programs=tuple(dataclasses.replace(p, step_latency=None) for p in programs),
        ),
    )
    saved = 10_000 * (GPU.rates.step_latency - step)
    assert predicted.seconds(GPU) == pytest.approx(predicted.seconds(unfused) - saved)
    assert predicted.seconds(unfused) == Cost.seconds(predicted, unfused)
    scaled = predicted.times(3)  # a block's cost, for three blocks: the fused steps too
    assert (scaled.steps, scaled.fused) == (30_006, 30_000)
    assert scaled.seconds(GPU) == pytest.approx(3 * predicted.seconds(GPU))
    assert predicted.seconds(CPU) == Cost.seconds(predicted, CPU)  # the CPU prices none
