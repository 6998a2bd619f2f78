"""The memory guard: its estimate against XLA's compiled memory analysis, the fallback of the
automatic method and the error of an explicit one under small artificial limits."""

import math

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, LSTM, RNN
from bppsa.scan._core import memory as _memory
from bppsa.scan._core.asked import options_from
from bppsa.scan._core.methods.fallbacks import fallbacks
from bppsa.scan._profile import CPU, GPU
from tests.helpers import assert_trees_close

H, B, T = 8, 4, 300
CELLS = {"rnn": RNN(), "gru": GRU(), "lstm": LSTM()}


def body_of(cell_name, params):
    if cell_name == "autodiff":  # not a cell call: Jacobians by autodiff (dense)
        return lambda h, x: (jnp.tanh(params["weight_hh"] @ h + params["weight_ih"] @ x), None)
    cell = CELLS[cell_name]
    return lambda h, x: (cell(params, h, x), None)


def problem(cell_name, length=T, batch=B, hidden=H):
    cell = CELLS.get(cell_name, RNN())
    params = cell.init(2, hidden, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (batch, length, 2))
    init = cell.initial_state(hidden)

    def loss(params, xs, scan=bppsa.scan, **options):
        def one(x):
            state, _ = scan(body_of(cell_name, params), init, x, **options)
            return jnp.sum(jnp.concatenate(jax.tree.leaves(state)) ** 2)

        return jax.vmap(one)(xs).sum()

    return params, xs, init, loss


def xla_bytes(fn, *args):
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    return analysis.temp_size_in_bytes + analysis.output_size_in_bytes


@pytest.mark.parametrize(
    "cell_name,method",
    [
        ("rnn", bppsa.Blelloch()),
        ("gru", bppsa.Chunked()),
        ("gru", bppsa.Blocked(bppsa.Chunked(1), 64)),
        ("lstm", bppsa.Blelloch()),
        ("autodiff", bppsa.Chunked(1)),
    ],
    ids=str,
)
def test_estimate_is_near_xla_memory_analysis(cell_name, method):
    """The model was fitted on other sizes; within 0.5x..2.5x of what XLA allocates."""
    params, xs, init, loss = problem(cell_name)
    measured = xla_bytes(bppsa.grad(loss, method=method, memory_limit=math.inf), params, xs)
    spec = jax.ShapeDtypeStruct((T, 2), jnp.float32)
    estimated = bppsa.estimate_memory(
        body_of(cell_name, params), init, spec, method=method, batch=B
    )
    print(f"estimate / XLA = {estimated / measured:.2f}")
    assert 0.5 <= estimated / measured <= 2.5, (estimated, measured)


def test_estimate_orders_methods_and_scales():
    params, _, init, _ = problem("rnn")
    body = body_of("rnn", params)

    def estimate(method, length=T, batch=B):
        spec = jax.ShapeDtypeStruct((length, 2), jnp.float32)
        return bppsa.estimate_memory(body, init, spec, method=method, batch=batch)

    blelloch, chunked = estimate(bppsa.Blelloch()), estimate(bppsa.Chunked())
    blocked = estimate(bppsa.Blocked(bppsa.Chunked(1), 64))
    assert blelloch > chunked > blocked
    assert estimate(bppsa.Blelloch(), batch=2 * B) == pytest.approx(2 * blelloch, rel=1e-6)
    assert estimate(bppsa.Blelloch(), length=2 * T) == pytest.approx(2 * blelloch, rel=1e-6)
    with jax.enable_x64(True):
        init64 = init.astype(jnp.float64)
        spec = jax.ShapeDtypeStruct((T, 2), jnp.float64)
        params64 = jax.tree.map(lambda a: a.astype(jnp.float64), params)
        doubled = bppsa.estimate_memory(body_of("rnn", params64), init64, spec, batch=B)
    assert doubled == pytest.approx(2 * estimate(bppsa.Auto()), rel=1e-6)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        estimate(bppsa.Blelloch(), batch=0)


def limit_between(low, high):
    assert low < high, (low, high)
    return (low + high) / 2


def test_explicit_method_over_the_limit_raises_with_estimate_limit_and_alternatives():
    params, xs, init, loss = problem("rnn")
    spec = jax.ShapeDtypeStruct((T, 2), jnp.float32)
    needs = bppsa.estimate_memory(body_of("rnn", params), init, spec, method="blelloch", batch=B)
    small = bppsa.estimate_memory(
        body_of("rnn", params), init, spec, method=bppsa.Blocked(bppsa.Chunked(1), 64), batch=B
    )
    limit = limit_between(small, needs)
    with pytest.raises(bppsa.MemoryLimitError) as info:
        bppsa.grad(loss, method="blelloch", memory_limit=limit)(params, xs)
    err = info.value
    assert err.estimate == needs and err.limit == limit
    assert err.alternatives and all(b <= limit for _, b in err.alternatives)
    assert bppsa.Blocked(bppsa.SequentialScan(), 64) in [m for m, _ in err.alternatives]
    message = str(err)
    for text in (
        "Blelloch()",
        _memory.human(needs),
        _memory.human(limit),
        "Blocked(method=SequentialScan()",
    ):
        assert text in message, (text, message)
    assert f"{B} vmapped examples" in message and f"T={T}" in message


def test_error_comes_before_the_backward_scan_is_traced(monkeypatch):
    params, xs, _, loss = problem("rnn")

    def fail(*args, **kwargs):
        raise AssertionError("the backward scan was traced")

    monkeypatch.setattr(bppsa.Blelloch, "scan", fail)
    with pytest.raises(bppsa.MemoryLimitError):
        bppsa.grad(loss, method="blelloch", memory_limit=1e4)(params, xs)


def test_automatic_method_falls_back_to_a_method_that_fits(monkeypatch):
    """On an accelerator Auto chooses Blelloch; under a limit it takes a lower-memory method,
    and the gradient is still back-propagation's. (2000 steps: fewer are below the break-even of
    the H200 profile's fused loop, which Auto picks there.)"""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    params, xs, init, loss = problem("gru", length=2000)
    spec = jax.ShapeDtypeStruct((2000, 2), jnp.float32)
    body = body_of("gru", params)
    blelloch = bppsa.estimate_memory(body, init, spec, method="blelloch", batch=B)
    chunked = bppsa.estimate_memory(body, init, spec, method=bppsa.Chunked(), batch=B)
    assert bppsa.estimate_memory(body, init, spec, batch=B) == blelloch  # Auto on "gpu"
    limit = limit_between(chunked, blelloch)

    used = []
    original = bppsa.Chunked.scan
    monkeypatch.setattr(
        bppsa.Chunked, "scan", lambda self, *a: used.append(self) or original(self, *a)
    )
    monkeypatch.setattr(bppsa.Blelloch, "scan", lambda *a: pytest.fail("Blelloch was used"))
    actual = jax.jit(bppsa.grad(loss, memory_limit=limit))(params, xs)
    assert used == [bppsa.Chunked()]
    expected = jax.jit(jax.grad(lambda p, x: loss(p, x, scan=jax.lax.scan)))(params, xs)
    assert_trees_close(actual, expected, jnp.float32)


def test_automatic_method_raises_when_nothing_fits():
    params, xs, _, loss = problem("rnn")
    with pytest.raises(bppsa.MemoryLimitError, match="No lower-memory backward method fits"):
        bppsa.grad(loss, memory_limit=1e3)(params, xs)


def test_fit_prefers_the_largest_fallback_that_fits():
    fp = _memory.Footprint(length=10_000, state=20, element=20, dense=400, itemsize=4, batch=16)
    estimates = {m: m.memory(fp) for m in fallbacks(bppsa.get_profile())}
    chosen = bppsa.Blocked(bppsa.SequentialScan(), 2048)
    fallback = bppsa.Blocked(bppsa.SequentialScan(), 1024)
    smaller = bppsa.Blocked(bppsa.SequentialScan(), 256)
    limit = limit_between(estimates[smaller], estimates[fallback])
    assert bppsa.Auto().scan_method(fp, limit, profile=CPU, jacobians=True) == smaller
    assert bppsa.Auto().scan_method(fp, math.inf, profile=CPU, jacobians=True) == chosen
    assert bppsa.Auto().scan_method(fp, math.inf, profile=GPU, jacobians=True) == bppsa.Blelloch()


def test_the_vmapped_batch_counts():
    """The same scan fits for one example and not for 64 of them."""
    params, _, init, loss = problem("rnn", batch=1)
    spec = jax.ShapeDtypeStruct((T, 2), jnp.float32)
    one = bppsa.estimate_memory(body_of("rnn", params), init, spec, method="blelloch")
    limit = 8 * one
    xs = jax.random.normal(jax.random.key(2), (64, T, 2))
    jax.jit(bppsa.grad(loss, method="blelloch", memory_limit=limit))(params, xs[:1])
    with pytest.raises(bppsa.MemoryLimitError, match="64 vmapped examples"):
        bppsa.grad(loss, method="blelloch", memory_limit=limit)(params, xs)


def test_default_limit_is_the_devices_memory(monkeypatch):
    params, xs, _, loss = problem("rnn")
    capacity = _memory.capacity_bytes()
    assert capacity > 1e6 and capacity >= _memory.available_bytes()  # real numbers here
    monkeypatch.setattr(_memory, "capacity_bytes", lambda: 1e4)
    with pytest.raises(bppsa.MemoryLimitError, match="the default device's memory"):
        bppsa.grad(loss, method="blelloch")(params, xs)
    jax.jit(bppsa.grad(loss, method="blelloch", memory_limit=math.inf))(params, xs)  # off


def test_the_default_limit_does_not_follow_what_is_free_when_traced(monkeypatch):
    """Auto() (the GPU profile's Blelloch()) under the default limit chooses the same method
    whatever is free when the scan is traced: the limit is the device's memory, a constant."""
    params, xs, init, loss = problem("gru", length=2000)
    spec = jax.ShapeDtypeStruct((2000, 2), jnp.float32)
    body = body_of("gru", params)
    blelloch = bppsa.estimate_memory(body, init, spec, method="blelloch", batch=B)
    chunked = bppsa.estimate_memory(body, init, spec, method=bppsa.Chunked(), batch=B)
    assert blelloch < _memory.capacity_bytes()
    methods = []
    for free in (limit_between(chunked, blelloch), 1e15):
        monkeypatch.setattr(_memory, "available_bytes", lambda free=free: free)
        with bppsa.trace_plans() as plans:
            jax.eval_shape(bppsa.grad(loss, method=bppsa.Auto(profile=GPU)), params, xs)
        methods.append(plans[0].method)
    assert methods == [bppsa.Blelloch(), bppsa.Blelloch()]


def test_available_is_read_once_when_the_options_are_made(monkeypatch):
    """``memory_limit="available"``: what is free when ``bppsa.grad`` is called, a number in
    its options from then on (what is free when the scan is traced does not matter)."""
    params, xs, _, loss = problem("rnn")
    monkeypatch.setattr(_memory, "available_bytes", lambda: 1e4)
    assert options_from(memory_limit="available").memory_limit == 1e4
    tight = bppsa.grad(loss, method="blelloch", memory_limit="available")
    monkeypatch.setattr(_memory, "available_bytes", lambda: 1e15)
    with pytest.raises(bppsa.MemoryLimitError, match=r"10 kB \(memory_limit\)"):
        tight(params, xs)
    jax.eval_shape(bppsa.grad(loss, method="blelloch", memory_limit="available"), params, xs)


def test_the_scans_own_limit_beats_the_grads():
    params, xs, _, loss = problem("rnn")

    def scan_with_no_limit(*args, **kwargs):
        return bppsa.scan(*args, memory_limit=math.inf, **kwargs)

    grads = jax.jit(
        bppsa.grad(
            lambda p, x: loss(p, x, scan=scan_with_no_limit), method="blelloch", memory_limit=1e3
        )
    )(params, xs)
    assert all(jnp.isfinite(g).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("bad", ["1GB", "free", True, [1]])
def test_memory_limit_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="memory_limit must be a number of bytes"):
        bppsa.grad(lambda x: x, memory_limit=bad)
    with pytest.raises(TypeError, match="memory_limit must be a number of bytes"):
        bppsa.scan(lambda h, x: (h, x), 0.0, jnp.ones(3), memory_limit=bad)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan])
def test_memory_limit_not_positive(bad):
    with pytest.raises(ValueError, match="memory_limit must be positive"):
        bppsa.grad(lambda x: x, memory_limit=bad)


def test_on_accelerators_the_limits_are_the_allocators(monkeypatch):
    monkeypatch.setattr(_memory, "_memory_stats", lambda: {"bytes_limit": 8e9, "bytes_in_use": 3e9})
    assert (_memory.capacity_bytes(), _memory.available_bytes()) == (8e9, 5e9)
