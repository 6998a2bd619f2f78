"""The fused loops on Pallas' Mosaic GPU backend: lowered for an abstract H200 (every JAX the
package admits), run in Mosaic GPU's own interpreter where this JAX has it (the newest:
``make test-newest-jax``), refusals named, and the 3xTF32 split of its products."""

from __future__ import annotations

import dataclasses
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.mesh import AbstractDevice, AbstractMesh

import bppsa
from bppsa.models import (
    CIFGLSTM,
    GRU,
    LSTM,
    RNN,
    cifg_lstm_cell,
    gru_cell,
    lstm_cell,
    rnn_cell,
)
from bppsa.scan._core.fused import mosaic_gpu, mosaic_kernel, mosaic_layout
from bppsa.scan._core.fused.split import split_step
from bppsa.scan._core.problem import prepare

try:  # Mosaic GPU's interpreter (private): its race detector's state
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
except ImportError:  # pragma: no cover - a JAX without it runs no interpreted test here
    interpret_pallas_call = None

H200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
CELLS = {
    "rnn": (RNN, rnn_cell, 1),
    "gru": (GRU, gru_cell, 1),
    "lstm": (LSTM, lstm_cell, 2),
    "cifg": (CIFGLSTM, cifg_lstm_cell, 2),
}
INTERPRETER = mosaic_kernel.interpreter() is not None


@pytest.fixture
def on_mosaic():
    """Every platform's profile names Mosaic GPU as the fused backend (restored after)."""
    for platform in ("cpu", "gpu", "cuda"):
        profile = bppsa.get_profile(platform)
        kernels = dataclasses.replace(profile.kernels, fused_backend="mosaic_gpu")
        bppsa.set_profile(platform, dataclasses.replace(profile, kernels=kernels))
    with warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.FallbackWarning)
        yield
    for platform in ("cpu", "gpu", "cuda"):
        bppsa.set_profile(platform, None)


def _mosaic_profile():
    profile = bppsa.get_profile("cpu")
    kernels = dataclasses.replace(profile.kernels, fused_backend="mosaic_gpu")
    return dataclasses.replace(profile, kernels=kernels)


def _cell(name, hidden):
    model, cell, leaves = CELLS[name]
    params = model().init(3, hidden, key=jax.random.key(0))

    def body(h, x):
        return cell(params, h, x), 0.0

    def init(*batch):
        keys = jax.random.split(jax.random.key(1), leaves)
        state = [jax.random.normal(k, (*batch, hidden)) for k in keys]
        return state[0] if leaves == 1 else tuple(state)

    return body, init


def _bfloat16_cell(name, hidden):
    """:func:`_cell` with its parameters, state and inputs in bfloat16."""
    model, cell, leaves = CELLS[name]
    params = jax.tree.map(
        lambda a: a.astype(jnp.bfloat16), model().init(3, hidden, key=jax.random.key(0))
    )

    def body(h, x):
        return cell(params, h, x), 0.0

    def init(*batch):
        keys = jax.random.split(jax.random.key(1), leaves)
        state = [jax.random.normal(k, (*batch, hidden)).astype(jnp.bfloat16) for k in keys]
        return state[0] if leaves == 1 else tuple(state)

    return body, init


def _loss(scan, body, reverse=False):
    def loss(init, xs):
        final, _ = scan(body, init, xs, reverse=reverse)
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves(final))

    return loss


def _fused(body, init, xs, reverse=False):
    return bppsa.scan(body, init, xs, reverse=reverse, forward="fused", method="fused_sequential")


def _lowered(fn, *args) -> str:
    mesh = AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), abstract_device=H200
    )
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    "name, hidden, batch, reverse",
    [
        ("rnn", 20, 16, False),
        ("gru", 20, 16, False),
        ("lstm", 20, 16, True),
        ("rnn", 128, 16, False),
        ("lstm", 64, None, False),
        ("cifg", 20, 16, False),
        ("rnn", 512, 16, False),  # a cluster of 16 blocks
        ("gru", 256, 64, True),  # 16 blocks of 16 lanes each
        ("lstm", 128, None, False),  # 4 blocks
    ],
)
def test_the_loops_lower_to_one_mosaic_gpu_kernel_each(on_mosaic, name, hidden, batch, reverse):
    body, init = _cell(name, hidden)
    shape = () if batch is None else (batch,)
    xs = jnp.ones((*shape, 9, 3))
    loss = _loss(_fused, body, reverse)
    grad = jax.grad(loss) if batch is None else jax.grad(lambda i, x: jnp.sum(jax.vmap(loss)(i, x)))
    text = _lowered(grad, init(*shape), xs)
    # the forward's kernel and the backward's, and no loop outside a kernel
    assert text.count("bppsa_fused_forward") >= 1 and text.count("bppsa_fused_backward") >= 1
    assert "mosaic_gpu" in text and "stablehlo.while" not in text
    # a kernel of a cluster reads its block's place in it
    assert ("cluster_block_id" in text) == (hidden > 128 or (name, hidden) == ("lstm", 128))


@pytest.mark.parametrize(
    "name, hidden, blocks",
    [("rnn", 20, 1), ("rnn", 128, 1), ("gru", 64, 1), ("gru", 128, 4), ("lstm", 128, 4),
     ("rnn", 256, 4), ("rnn", 512, 16), ("gru", 256, 16), ("lstm", 256, 16),
     ("cifg", 512, 2)],  # no product: its registers (a (64, 512) array) want 2 blocks
)  # fmt: skip
def test_a_loop_takes_the_fewest_blocks_of_a_cluster_that_hold_it(name, hidden, blocks):
    """Dense cells past one block's shared memory split their lanes over a cluster: the fewest
    blocks whose shared memory holds their share of the matrices (float32, 3xTF32)."""
    body, init = _cell(name, hidden)
    problem = _problem(body, init(), jnp.ones((4, 3)))
    plan = bppsa.Fused().prepare(problem, _mosaic_profile())
    assert not isinstance(plan, str), plan
    analysis = mosaic_layout.Analysis(plan.loop.split)
    assert analysis.cluster == blocks
    assert analysis.shared_bytes <= mosaic_layout.SHARED_BYTES
    assert analysis.columns <= mosaic_layout.MAX_COLUMNS
    if blocks > 1:  # one block fewer would not hold it
        fewer = mosaic_layout.CLUSTERS[mosaic_layout.CLUSTERS.index(blocks) - 1]
        analysis._size(plan.loop.split, fewer)
        assert (
            analysis.shared_bytes > mosaic_layout.SHARED_BYTES
            or analysis.tile > mosaic_layout.PROGRAMS[0].max_tile
        )


@pytest.mark.parametrize(
    "name, hidden, blocks",
    [("rnn", 20, 1), ("rnn", 1024, 16), ("gru", 512, 8), ("lstm", 512, 16)],
)
def test_bfloat16_loops_keep_their_matrices_once_in_bfloat16(name, hidden, blocks):
    """bfloat16 products run on bfloat16 operands: a matrix once, two bytes an entry, which
    takes the RNN to H = 1024 and the GRU and LSTM to 512."""
    body, init = _bfloat16_cell(name, hidden)
    problem = _problem(body, init(), jnp.ones((4, 3), jnp.bfloat16))
    plan = bppsa.Fused().prepare(problem, _mosaic_profile())
    assert not isinstance(plan, str), plan
    analysis = mosaic_layout.Analysis(plan.loop.split)
    assert analysis.cluster == blocks and analysis.half == set(analysis.matrices)
    assert not analysis.full and analysis.widest == 0 and analysis.widest_half > 0
    assert analysis.shared_bytes <= mosaic_layout.SHARED_BYTES


@pytest.mark.parametrize(
    "name, hidden, sizes",
    [("lstm", 64, [4]), ("gru", 20, [3]), ("rnn", 128, [1]), ("lstm", 128, [4])],
)
def test_products_of_one_operand_are_issued_together(name, hidden, sizes):
    """An LSTM's four gate products of ``h`` stage ``h`` once and wait once, as long as their
    accumulators fit the registers (at H = 128 on 4 blocks: 32 columns each, all four)."""
    body, init = _cell(name, hidden)
    plan = bppsa.Fused().prepare(_problem(body, init(), jnp.ones((4, 3))), _mosaic_profile())
    analysis = mosaic_layout.Analysis(plan.loop.split)
    groups = list(dict.fromkeys(analysis.groups.values()))
    assert [len(g) for g in groups] == sizes
    assert len({analysis.products[e][0] for g in groups for e in g}) == 1


def test_products_past_the_accumulator_registers_are_issued_apart():
    k = jax.random.split(jax.random.key(7), 3)
    w1, w2 = (jax.random.normal(key, (32, 256)) / 6 for key in k[:2])
    w3 = jax.random.normal(k[2], (32, 32)) / 6

    def body(carry, x):  # (64, 256) accumulators, 128 registers a thread each: one a group
        a, _ = carry
        return (jnp.tanh(a @ w3 + x), jnp.tanh(a @ w1) * jnp.tanh(a @ w2)), 0.0

    init = (jnp.zeros(32), jnp.zeros(256))
    plan = bppsa.Fused().prepare(_problem(body, init, jnp.ones((4, 32))), _mosaic_profile())
    assert not isinstance(plan, str), plan
    analysis = mosaic_layout.Analysis(plan.loop.split)
    assert analysis.cluster == 1
    assert sorted(len(g) for g in set(analysis.groups.values())) == [1, 1, 1]


def test_each_block_computes_whole_swizzled_rows_of_every_vector():
    for cluster in mosaic_layout.CLUSTERS:
        for n in (1, 8, 20, 24, 64, 100, 128, 256, 300, 512, 1024):
            chunk = mosaic_layout.chunk(n, cluster)
            assert chunk * cluster >= n and (chunk * cluster) % mosaic_layout.LANES == 0
            assert chunk in (8, 16) or chunk % mosaic_layout.LANES == 0
    assert mosaic_layout.chunk(256, 16) == 16 and mosaic_layout.chunk(20, 1) == 32
    assert mosaic_layout.chunk(512, 16) == 32 and mosaic_layout.chunk(128, 4) == 32


@pytest.mark.parametrize(
    "name, hidden, reason",
    [
        ("rnn", 1024, "bytes of shared memory a block, split over 16 blocks"),
        ("lstm", 512, "bytes of shared memory a block, split over 16 blocks"),
    ],
)
def test_loops_past_a_cluster_are_refused_naming_shared_memory(on_mosaic, name, hidden, reason):
    body, init = _cell(name, hidden)
    with pytest.warns(bppsa.FallbackWarning, match=reason):
        warnings.simplefilter("default", bppsa.FallbackWarning)
        bppsa.scan(body, init(), jnp.ones((4, 3)), forward="fused")
    body, init = _bfloat16_cell("lstm", 1024)  # bfloat16: the LSTM past H = 512
    with pytest.warns(bppsa.FallbackWarning, match=reason):
        warnings.simplefilter("default", bppsa.FallbackWarning)
        bppsa.scan(body, init(), jnp.ones((4, 3), jnp.bfloat16), forward="fused")


def test_a_product_of_mixed_types_is_refused_by_name(on_mosaic):
    w = jnp.ones((20, 20), jnp.bfloat16)

    def body(h, x):
        product = lax.dot(h.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
        return jnp.tanh(product + x), 0.0

    with pytest.warns(bppsa.FallbackWarning, match=r"a product of mixed types \(bfloat16, float32"):
        warnings.simplefilter("default", bppsa.FallbackWarning)
        bppsa.scan(body, jnp.zeros(20), jnp.ones((4, 20)), forward="fused")


def test_a_gpu_older_than_sm_90_is_refused_by_name(monkeypatch):
    class A100:
        device_kind, compute_capability = "NVIDIA A100-SXM4-80GB", "8.0"

    class H100:
        device_kind, compute_capability = "NVIDIA H100 80GB HBM3", "9.0"

    for devices, reason in (([H100()], None), ([H100(), A100()], "sm_80")):
        monkeypatch.setattr(mosaic_gpu.jax, "devices", lambda platform, found=devices: found)
        mosaic_gpu.older_devices.cache_clear()
        try:
            got = mosaic_gpu.MosaicGPU().missing()
        finally:
            mosaic_gpu.older_devices.cache_clear()
        if reason is None:
            assert got is None
        else:
            assert "need sm_90 or newer (NVIDIA A100-SXM4-80GB is sm_80)" in got


def test_a_primitive_outside_the_table_is_refused_by_name(on_mosaic):
    w = jax.random.normal(jax.random.key(0), (20, 20))

    def body(h, x):
        return jnp.sin(h @ w) + x, 0.0

    with pytest.warns(bppsa.FallbackWarning, match="sin"):
        warnings.simplefilter("default", bppsa.FallbackWarning)
        bppsa.scan(body, jnp.zeros(20), jnp.ones((4, 20)), forward="fused")


def test_the_3xtf32_split_recovers_float32_products():
    """hi(x) hi(W) + hi(x) lo(W) + lo(x) hi(W), each factor rounded as the tensor cores round
    TF32 operands, is as close to the float64 product as a float32 product; one TF32 product
    is not."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((128, 96)), jnp.float32)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    hi_x, lo_x = mosaic_layout.split_tf32(x)
    hi_w, lo_w = mosaic_layout.split_tf32(w)
    bits = np.asarray(lax.bitcast_convert_type(hi_x, jnp.int32))
    assert np.all(bits & 0x1FFF == 0)  # 10 bits of mantissa left
    np.testing.assert_array_equal(np.asarray(hi_x + lo_x), np.asarray(x))  # exact split

    def tensor_core(a, b):  # TF32 operands, float32 accumulation
        t = mosaic_layout.tf32
        return jnp.dot(t(a), t(b), precision="highest")

    three = tensor_core(hi_x, hi_w) + tensor_core(hi_x, lo_w) + tensor_core(lo_x, hi_w)
    one = tensor_core(x, w)
    full = jnp.dot(x, w, precision="highest")
    err = {
        k: np.max(np.abs(np.asarray(v, np.float64) - exact))
        for k, v in {"three": three, "one": one, "float32": full}.items()
    }
    assert err["three"] < 4 * err["float32"]
    assert err["one"] > 100 * err["float32"]


def test_shared_memory_counts_the_matrices_twice_at_full_precision():
    w = jnp.zeros((64, 64))

    def step(carry, x, consts):
        (h,), (xt,), (wt,) = carry, x, consts
        return [jnp.tanh(h @ wt + xt)], []

    leaf = jax.ShapeDtypeStruct((64,), jnp.float32)
    split = split_step(step, [leaf], [leaf], [jax.ShapeDtypeStruct(w.shape, w.dtype)])
    # W (hi, lo) 2 x 64 x 64, the carry's buffer 64 x 64, the staged operand (hi, lo)
    assert mosaic_layout.Analysis(split).shared_bytes == 4 * (2 * 64 * 64 + 64 * 64 + 2 * 64 * 64)


needs_interpreter = pytest.mark.skipif(
    not INTERPRETER, reason="Mosaic GPU's interpreter is in JAX 0.12 and later"
)


@needs_interpreter
@pytest.mark.parametrize(
    "name, hidden, batch, reverse",
    [
        ("rnn", 20, 16, False),
        ("gru", 20, 16, True),
        ("lstm", 20, 16, False),
        ("rnn", 20, 64, False),
        ("rnn", 128, 16, False),
        ("lstm", 64, 16, False),
        ("gru", 20, None, False),
        ("cifg", 20, 16, False),
        ("cifg", 128, 64, True),
        # clusters: 4 blocks at 128, 16 at 512
        ("gru", 128, 16, False),
        ("lstm", 128, 64, True),
        ("rnn", 512, 16, False),
        ("rnn", 512, 64, True),
        ("cifg", 512, 16, False),  # 2 blocks, no exchange
    ],
)
def test_the_interpreted_kernels_equal_lax_scan_and_bp(
    on_mosaic, monkeypatch, name, hidden, batch, reverse
):
    body, init = _cell(name, hidden)
    shape = () if batch is None else (batch,)
    xs = jax.random.normal(jax.random.key(2), (*shape, 7, 3))
    state = init(*shape)
    calls = []
    real = mosaic_kernel.RowsKernel.__call__

    def counted(self, *args):
        calls.append(self.reverse)
        return real(self, *args)

    monkeypatch.setattr(mosaic_kernel.RowsKernel, "__call__", counted)
    ours = jax.value_and_grad(_batched(_loss(_fused, body, reverse), batch), (0, 1))
    theirs = jax.value_and_grad(_batched(_loss(lax.scan, body, reverse), batch), (0, 1))
    got, want = ours(state, xs), theirs(state, xs)
    assert sorted(set(calls)) == [False, True]  # the forward's kernel and the backward's ran
    assert not interpret_pallas_call.get_races().races_found
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "name, hidden, batch",
    [("rnn", 20, 16), ("gru", 20, 16), ("lstm", 64, 64), ("cifg", 20, 16), ("rnn", 1024, 16)],
)
def test_bfloat16_loops_lower_to_mosaic_gpu_kernels(on_mosaic, name, hidden, batch):
    body, init = _bfloat16_cell(name, hidden)
    loss = _loss(_fused, body)
    grad = jax.grad(lambda i, x: jnp.sum(jax.vmap(loss)(i, x)))
    text = _lowered(grad, init(batch), jnp.ones((batch, 9, 3), jnp.bfloat16))
    assert text.count("bppsa_fused_forward") >= 1 and text.count("bppsa_fused_backward") >= 1
    assert "mosaic_gpu" in text and "stablehlo.while" not in text
    assert ("cluster_block_id" in text) == (hidden > 128)


@needs_interpreter
@pytest.mark.parametrize(
    "name, hidden, batch",
    [("rnn", 20, 16), ("gru", 20, 16), ("lstm", 64, 16), ("cifg", 20, 64), ("lstm", 512, 16),
     ("gru", 512, 64)],
)  # fmt: skip
def test_bfloat16_interpreted_kernels_are_as_close_to_float64_as_bp(on_mosaic, name, hidden, batch):
    """In bfloat16 each operation rounds (as the loop's jaxpr says) where XLA may keep excess
    precision, so values are not bit-equal to lax.scan's: the value and gradients are as close
    to float64 (same bfloat16 inputs) as back-propagation's, and within bfloat16 rounding of
    them."""
    body, init = _bfloat16_cell(name, hidden)
    state = init(batch)
    xs = jax.random.normal(jax.random.key(2), (batch, 7, 3)).astype(jnp.bfloat16)

    def run(scan, body, state, xs):
        return jax.value_and_grad(_batched(_loss(scan, body), batch), (0, 1))(state, xs)

    ours, bp = run(_fused, body, state, xs), run(lax.scan, body, state, xs)
    model, cell, _ = CELLS[name]
    params = model().init(3, hidden, key=jax.random.key(0))
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda a: jnp.asarray(np.asarray(a, np.float64)), (state, xs))
        wide_params = jax.tree.map(
            lambda a: jnp.asarray(np.asarray(a.astype(jnp.bfloat16), np.float64)), params
        )
        exact = run(lax.scan, lambda h, x: (cell(wide_params, h, x), 0.0), *wide)
        exact = [np.asarray(a) for a in jax.tree.leaves(exact)]

    def error(result):
        return max(
            np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b))
            for a, b in zip(jax.tree.leaves(result), exact)
        )

    assert error(ours) <= 2 * error(bp) + 1e-3, (error(ours), error(bp))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(bp)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 0.05 * np.max(np.abs(b)) + 1e-2


def _batched(loss, batch):
    if batch is None:
        return loss
    return lambda i, x: jnp.sum(jax.vmap(loss)(i, x))


@needs_interpreter
@pytest.mark.parametrize("hidden, batch", [(24, 16), (300, 64)])  # 300: a cluster of 16
def test_a_user_cell_with_a_transposed_product_runs_in_the_interpreter(on_mosaic, hidden, batch):
    """An unseen cell (``W h`` rather than ``h W``, a division, a literal): values equal
    lax.scan's and gradients back-propagation's."""
    k = jax.random.split(jax.random.key(3), 3)
    w = jax.random.normal(k[0], (hidden, hidden)) / np.sqrt(hidden)
    xs = jax.random.normal(k[1], (batch, 6, hidden))
    init = jax.random.normal(k[2], (batch, hidden))

    def body(h, x):
        return jnp.tanh(w @ h) / (1.5 + jnp.exp(-x)) + 0.25 * h, h

    got = jax.vmap(lambda i, x: bppsa.scan(body, i, x, forward="fused")[0])(init, xs)
    want = jax.vmap(lambda i, x: lax.scan(body, i, x)[0])(init, xs)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    ours = jax.value_and_grad(_batched(_loss(_fused, body), batch), (0, 1))(init, xs)
    theirs = jax.value_and_grad(_batched(_loss(lax.scan, body), batch), (0, 1))(init, xs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@needs_interpreter
@pytest.mark.parametrize("dropped", ["wait_smem_to_gmem", "commit_smem", "barrier_wait"])
def test_a_planted_missing_synchronisation_is_a_detected_race(on_mosaic, monkeypatch, dropped):
    """Without the wait for the TMA copy out, the fence before the tensor cores read shared
    memory, or the wait for the constants' copy in, Mosaic GPU's race detector fails the run."""
    real = mosaic_kernel.plgpu
    planted = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if k[:2] != "__"})
    setattr(planted, dropped, lambda *args, **kwargs: None)
    monkeypatch.setattr(mosaic_kernel, "plgpu", planted)
    body, init = _cell("rnn", 20)
    xs = jax.random.normal(jax.random.key(2), (16, 5, 3))
    try:
        with pytest.raises(Exception, match="RACE DETECTED"):
            jax.block_until_ready(jax.vmap(lambda x: _fused(body, init(), x)[0])(xs))
    finally:
        interpret_pallas_call.gpu_callbacks.reset_gpu_interpret_mode_state()


@needs_interpreter
@pytest.mark.parametrize("planted", ["no wait for the cluster", "wrong columns"])
def test_a_planted_cluster_fault_fails(on_mosaic, monkeypatch, planted):
    """A cluster kernel whose blocks do not wait for each other's lanes races (the detector
    fails the run); one whose blocks keep a neighbour's columns of the matrices computes a
    wrong loop (it differs from lax.scan)."""
    body, init = _cell("gru", 128)  # 4 blocks
    xs = jax.random.normal(jax.random.key(2), (16, 5, 3))
    state = init(16)

    def run():
        return jax.block_until_ready(jax.vmap(lambda i, x: _fused(body, i, x)[0])(state, xs))

    want = jax.vmap(lambda i, x: lax.scan(body, i, x)[0])(state, xs)
    np.testing.assert_allclose(run(), want, rtol=2e-5, atol=2e-6)  # unplanted: right
    if planted == "wrong columns":
        real = mosaic_kernel._matrix_columns
        monkeypatch.setattr(
            mosaic_kernel,
            "_matrix_columns",
            lambda block, width, cluster: real((block + 1) % cluster, width, cluster),
        )
        assert not np.allclose(run(), want, rtol=1e-3, atol=1e-3)
        return
    monkeypatch.setattr(mosaic_kernel, "_all_wrote", mosaic_kernel.plgpu.barrier_arrive)
    try:
        with pytest.raises(Exception, match="RACE DETECTED"):
            run()
    finally:
        interpret_pallas_call.gpu_callbacks.reset_gpu_interpret_mode_state()


@needs_interpreter
# the batch's padded rows (zeros) are -inf in every lane: NaN there, never read back
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_padded_lanes_of_a_product_s_operand_are_read_as_zeros(on_mosaic):
    """``log(h * h)`` is -inf in the carry's padded lanes (zeros); the product must read zeros
    there (``-inf * 0`` would be NaN in every lane)."""
    k = jax.random.split(jax.random.key(6), 3)
    w = jax.random.normal(k[0], (20, 20)) / 5
    xs = jax.random.normal(k[1], (16, 5, 20))
    h0 = 1.0 + jax.random.uniform(k[2], (20,))

    def body(h, x):
        return 1.5 + jnp.tanh(jnp.log(h * h) @ w + x), 0.0

    got = jax.vmap(lambda x: bppsa.scan(body, h0, x, forward="fused")[0])(xs)
    want = jax.vmap(lambda x: lax.scan(body, h0, x)[0])(xs)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


ELEMENTWISE = {
    "neg": lambda a: -a,
    "exp": jnp.exp,
    "log": lambda a: jnp.log(1 + a * a),
    "sqrt": lambda a: jnp.sqrt(1 + a * a),
    "rsqrt": lambda a: lax.rsqrt(1 + a * a),
    "abs": jnp.abs,
    "sub": lambda a: a - 1.0,
    "max": lambda a: jnp.maximum(a, 0.0),
    "min": lambda a: jnp.minimum(a, 1.0),
    "integer_pow": lambda a: a**3,
    "square": lax.square,
    "div": lambda a: a / 3.0,
}


@pytest.mark.parametrize("primitive", sorted(ELEMENTWISE))
def test_each_elementwise_primitive_lowers_or_is_refused_by_name(on_mosaic, primitive):
    """A primitive of the kernel's table lowers for the device where this JAX's Mosaic GPU
    lowering has a rule for it (``sqrt`` has none in JAX 0.10), and is refused by name where
    it has none: never a lowering error on the device."""
    w = jnp.ones((24, 24)) / 24

    def body(h, x):
        return jnp.tanh(ELEMENTWISE[primitive](h @ w) + x), 0.0

    def forward(xs):
        return bppsa.scan(body, jnp.zeros(24), xs, forward="fused")[0]

    xs = jnp.ones((5, 24))
    if mosaic_kernel.has_rule(primitive):
        text = _lowered(forward, xs)
        assert "mosaic_gpu" in text and "stablehlo.while" not in text
    else:
        with pytest.warns(bppsa.FallbackWarning, match=f"{primitive} .no rule in this JAX"):
            warnings.simplefilter("default", bppsa.FallbackWarning)
            forward(xs)


def _two_widths():
    """A cell whose two carries (24 and 70 lanes) stage products of different widths."""
    k = jax.random.split(jax.random.key(4), 2)
    w1 = jax.random.normal(k[0], (24, 70)) / 6
    w2 = jax.random.normal(k[1], (70, 24)) / 6

    def body(carry, x):
        a, b = carry
        return (jnp.tanh(b @ w2 + x), jnp.tanh(a @ w1)), 0.0

    return body, (jnp.zeros(24), jnp.zeros(70))


def test_products_of_different_widths_lower(on_mosaic):
    body, init = _two_widths()
    text = _lowered(
        jax.vmap(lambda x: bppsa.scan(body, init, x, forward="fused")[0]), jnp.ones((16, 5, 24))
    )
    assert "mosaic_gpu" in text and "stablehlo.while" not in text


@needs_interpreter
def test_products_of_different_widths_run_in_the_interpreter(on_mosaic):
    body, init = _two_widths()
    xs = jax.random.normal(jax.random.key(5), (16, 5, 24))
    got = jax.vmap(lambda x: bppsa.scan(body, init, x, forward="fused")[0])(xs)
    want = jax.vmap(lambda x: lax.scan(body, init, x)[0])(xs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_forced_backend_is_checked_and_shown():
    for make in (bppsa.Fused, bppsa.FusedSequential):
        with pytest.raises(ValueError, match=r"backend must be 'auto'.*'mosaic_gpu'.*'nope'"):
            make(backend="nope")
    assert repr(bppsa.Fused(backend="mosaic_gpu")) == "Fused(backend='mosaic_gpu')"
    assert repr(bppsa.FusedSequential(num_warps=2, backend="triton")) == (
        "FusedSequential(num_warps=2, backend='triton')"
    )


def test_a_forced_backend_runs_on_the_default_profile():
    """``Fused(backend="mosaic_gpu")`` and ``FusedSequential(backend="mosaic_gpu")`` lower
    to Mosaic GPU kernels though the profile names Triton."""
    body, init = _cell("gru", 20)
    forced = "mosaic_gpu"

    def loss(state, xs):
        final, _ = bppsa.scan(
            body,
            state,
            xs,
            forward=bppsa.Fused(backend=forced),
            method=bppsa.FusedSequential(backend=forced),
        )
        return jnp.sum(jnp.sin(final))

    with warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.FallbackWarning)
        text = _lowered(
            jax.grad(lambda i, x: jnp.sum(jax.vmap(loss)(i, x))), init(16), jnp.ones((16, 9, 3))
        )
    assert "mosaic_gpu" in text and "triton" not in text and "stablehlo.while" not in text


def _problem(body, init, xs):
    problem, _ = prepare(body, init, xs, None, reverse=False, batch=None)
    return problem


def test_the_profile_s_backends_are_tried_in_order():
    """A profile naming ("mosaic_gpu", "triton") plans Mosaic GPU where it runs the loop, and
    Triton where only Triton does (``sin``: no rule in Mosaic GPU's table)."""
    profile = bppsa.get_profile("cpu")
    both = dataclasses.replace(
        profile,
        kernels=dataclasses.replace(profile.kernels, fused_backend=("mosaic_gpu", "triton")),
    )
    w = jnp.ones((20, 20)) / 20
    xs = jnp.ones((5, 20))

    def backend_of(step):
        plan = bppsa.Fused().prepare(_problem(step, jnp.zeros(20), xs), both)
        return plan if isinstance(plan, str) else plan.loop.backend.name

    assert backend_of(lambda h, x: (jnp.tanh(h @ w + x), h)) == "mosaic_gpu"
    assert backend_of(lambda h, x: (jnp.sin(h @ w + x), h)) == "triton"


def test_where_no_backend_runs_the_loop_each_one_s_reason_is_named(x64):
    profile = bppsa.get_profile("cpu")
    both = dataclasses.replace(
        profile,
        kernels=dataclasses.replace(profile.kernels, fused_backend=("mosaic_gpu", "triton")),
    )
    w = jnp.ones((20, 20), jnp.float64) / 20
    problem = _problem(lambda h, x: (jnp.tanh(h @ w + x), h), jnp.zeros(20, jnp.float64),
                       jnp.ones((5, 20), jnp.float64))  # fmt: skip
    reason = bppsa.Fused().prepare(problem, both)
    assert reason.startswith("mosaic_gpu: a carry of float64"), reason
    assert "; triton: a carry of float64" in reason, reason
