"""Requests are what runs, or say so: an explicit fused forward or backward that falls back warns
with the reason (bppsa.FallbackWarning), the policies' own choices do not; Auto() over a memory
limit that nothing fits raises as an explicit method does; the plans of a jitted function can
be read after its first call (bppsa.trace_plans(fun, *args))."""

import functools
import math
import re
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._profile import GPU
from tests.helpers import assert_trees_close

H, T = 4, 9
FLOAT64 = "a carry of float64"


def rnn(dtype=jnp.float32, length=T, hidden=H):
    params = RNN().init(1, hidden, key=jax.random.key(0), dtype=dtype)
    xs = jax.random.normal(jax.random.key(1), (length, 1), dtype)
    return params, xs, jnp.zeros(hidden, dtype)


def loss(params, xs, init, scan=bppsa.scan, **options):
    carry, hs = scan(lambda h, x: (rnn_cell(params, h, x), h), init, xs, **options)
    return jnp.sum(carry**2) + jnp.sum(jnp.sin(hs))


def reference_grad(params, xs, init):
    return jax.grad(functools.partial(loss, scan=lax.scan))(params, xs, init)


def fallback_warnings(fun, *args):
    """``fun(*args)`` and the messages of the FallbackWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fun(*args)
    return out, [str(w.message) for w in caught if issubclass(w.category, bppsa.FallbackWarning)]


# ---- explicit requests that fall back warn --------------------------------------------------


@pytest.mark.parametrize("forward", ["fused", bppsa.Fused(), bppsa.Fused(lanes=None)], ids=str)
def test_an_explicit_fused_forward_on_float64_warns_and_runs_lax_scan(x64, forward):
    params, xs, init = rnn(jnp.float64)
    body = lambda h, x: (rnn_cell(params, h, x), h)
    name = repr(bppsa.Fused() if forward == "fused" else forward)
    match = re.escape(f"forward={name} runs lax.scan")
    with pytest.warns(bppsa.FallbackWarning, match=match) as caught, bppsa.trace_plans() as plans:
        actual = bppsa.scan(body, init, xs, forward=forward)
    assert [FLOAT64 in str(w.message) for w in caught] == [True]  # once, with the reason
    assert plans[0].forward.sequential and FLOAT64 in plans[0].forward_because
    assert_trees_close(actual, lax.scan(body, init, xs), jnp.float64)


@pytest.mark.parametrize(
    "method", [bppsa.FusedSequential(), bppsa.Blocked(bppsa.FusedSequential(), 4)], ids=str
)
def test_an_explicit_fused_sequential_on_float64_warns_with_the_reason(x64, method):
    params, xs, init = rnn(jnp.float64)
    with bppsa.trace_plans() as plans:
        actual, messages = fallback_warnings(bppsa.grad(loss, method=method), params, xs, init)
    assert len(messages) == 1 and messages[0].startswith(f"bppsa.scan: method={method!r} runs")
    assert FLOAT64 in messages[0]
    assert plans[0].backward == method and FLOAT64 in plans[0].backward_because
    assert_trees_close(actual, reference_grad(params, xs, init), jnp.float64)


def test_both_requests_warn_once_each_per_trace(x64):
    params, xs, init = rnn(jnp.float64)
    fun = bppsa.grad(loss, method=bppsa.FusedSequential(), forward="fused")
    _, messages = fallback_warnings(fun, params, xs, init)
    assert [m.split(" runs ")[0] for m in messages] == [
        "bppsa.scan: forward=Fused()",
        "bppsa.scan: method=FusedSequential()",
    ]
    jitted = jax.jit(fun)
    _, first = fallback_warnings(jitted, params, xs, init)
    _, cached = fallback_warnings(jitted, params, xs, init)
    assert (len(first), cached) == (2, [])  # warned where traced; a cached call is not


def test_the_warning_can_be_made_an_error(x64):
    params, xs, init = rnn(jnp.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bppsa.FallbackWarning)
        with pytest.raises(bppsa.FallbackWarning, match=FLOAT64):
            bppsa.grad(loss, method=bppsa.FusedSequential())(params, xs, init)


def test_a_fused_request_the_kernel_runs_does_not_warn():
    params, xs, init = rnn()
    fun = bppsa.grad(loss, method=bppsa.FusedSequential(), forward="fused")
    actual, messages = fallback_warnings(fun, params, xs, init)
    assert messages == []
    assert_trees_close(actual, reference_grad(params, xs, init), jnp.float32)


@pytest.mark.parametrize("profile", [None, GPU], ids=["cpu", "gpu"])
def test_the_policies_own_choices_never_warn(x64, profile):
    """The defaults (Auto(), AutoForward()) on float64: on the H200's profile, where the
    backward is a parallel scan (T = 600), the forward's policy asks the fused kernel, which
    cannot run float64, and records why, silently."""
    params, xs, init = rnn(jnp.float64, length=600)
    with bppsa.trace_plans() as plans:
        fun = bppsa.grad(loss, method=bppsa.Auto(profile=profile))
        actual, messages = fallback_warnings(fun, params, xs, init)
    assert messages == []
    if profile is GPU:
        assert FLOAT64 in plans[0].forward_because
    assert_trees_close(actual, reference_grad(params, xs, init), jnp.float64)


# ---- Auto() over a memory limit -------------------------------------------------------------


def test_the_default_limit_keeps_autos_plain_back_propagation_bit_identical():
    """On the CPU Auto() picks plain back-propagation for one short sequence; held to the
    default limit (the device's available memory) it still is lax.scan, differentiated by JAX."""
    params, xs, init = rnn()
    with bppsa.trace_plans() as plans:
        actual = jax.jit(bppsa.grad(loss))(params, xs, init)
    assert (plans[0].method, plans[0].backward) == (bppsa.Sequential(), None)
    expected = jax.jit(reference_grad)(params, xs, init)
    assert all((a == e).all() for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)))


def test_auto_raises_when_nothing_fits_also_where_it_picked_back_propagation():
    params, xs, init = rnn()
    with bppsa.trace_plans() as plans:
        jax.eval_shape(functools.partial(loss, memory_limit=math.inf), params, xs, init)
    assert plans[0].method == bppsa.Sequential()  # Auto()'s pick without a limit
    with pytest.raises(bppsa.MemoryLimitError) as error:
        bppsa.grad(loss, memory_limit=100)(params, xs, init)
    message = str(error.value)
    for text in ("(which chose Sequential())", "limit of 100 B", "tried: bppsa.Chunked("):
        assert text in message, (text, message)
    assert error.value.limit == 100 and error.value.alternatives == []
    # As for an explicit method; the forward alone is no error.
    with pytest.raises(bppsa.MemoryLimitError, match=r"method=Sequential\(\) needs"):
        bppsa.grad(loss, method=bppsa.Sequential(), memory_limit=100)(params, xs, init)
    jax.jit(functools.partial(loss, memory_limit=100))(params, xs, init)


def test_auto_falls_back_from_back_propagation_to_a_method_that_fits():
    params, xs, init = rnn(length=2000)
    body = lambda h, x: (rnn_cell(params, h, x), h)
    plain = bppsa.estimate_memory(body, init, xs, method="sequential")
    small = bppsa.Blocked(bppsa.SequentialScan(), 64)
    fits = bppsa.estimate_memory(body, init, xs, method=small)
    assert bppsa.estimate_memory(body, init, xs) == plain and fits < plain  # Auto()'s pick
    limit = (fits + plain) / 2
    with bppsa.trace_plans() as plans:
        actual = bppsa.grad(loss, memory_limit=limit)(params, xs, init)
    assert plans[0].method.keeps_carries and plans[0].backward == plans[0].method
    assert bppsa.estimate_memory(body, init, xs, method=plans[0].method) <= limit
    assert_trees_close(actual, reference_grad(params, xs, init), jnp.float32)


# ---- the plans of a jitted function ---------------------------------------------------------


def test_the_plans_of_a_jitted_function_can_be_read_after_its_first_call():
    params, xs, init = rnn()
    step = jax.jit(bppsa.grad(loss, method=bppsa.Blelloch()))
    with bppsa.trace_plans() as first:
        step(params, xs, init)
    with bppsa.trace_plans() as cached:
        step(params, xs, init)
    assert len(first) == 1 and first[0].backward == bppsa.Blelloch() and cached == []
    assert bppsa.trace_plans(step, params, xs, init) == first
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, xs, init))
    assert bppsa.trace_plans(step, *shapes) == first  # shapes alone do
    with bppsa.trace_plans() as after:
        step(params, xs, init)
    assert after == []  # the compiled function is still served from the cache


def test_trace_plans_of_a_function_passes_keywords_as_they_are():
    params, xs, init = rnn()
    fun = jax.jit(loss, static_argnames="method")
    traced = bppsa.trace_plans(fun, params, xs, init, method=bppsa.Chunked())
    assert [plan.method for plan in traced] == [bppsa.Chunked()]
    assert traced[0].backward is None  # no derivative was traced


def test_trace_plans_needs_a_callable():
    with pytest.raises(TypeError, match="without a function"):
        bppsa.trace_plans(None, 1.0)
    with pytest.raises(TypeError, match="fun must be callable"):
        bppsa.trace_plans(1.0)
