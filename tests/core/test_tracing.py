"""The reads of JAX's private state (bppsa.scan._core.tracing): they must work on the installed JAX.

These tests FAIL when JAX changes underneath (the library itself then falls back to something
safe, with a warning): a JAX upgrade cannot silently change what Auto() picks or drop the
options of bppsa.grad.
"""

import warnings

import jax
import jax.numpy as jnp
import pytest

from bppsa.scan._core import linear, tracing


def test_nothing_fell_back():
    x = jnp.ones((4, 5, 3))
    seen = []

    def probe(v):
        seen.append(tracing.vmapped_batch_size(v))
        return v.sum()

    jax.jit(jax.vmap(jax.vmap(probe)))(x)
    jax.grad(lambda v: jnp.sum(jax.vmap(probe)(v)))(x[0])
    assert seen == [20, 5]

    assert linear._PRIMITIVE is not None  # forward and reverse mode share one linear map
    assert tracing.OPTIONS_IN_JIT_KEY
    assert tracing.problems() == {}


def test_options_are_part_of_the_jit_cache_key():
    traced = []

    @jax.jit
    def f(x):
        traced.append(tracing.current_options())
        return 2 * x

    def outer(x):  # a jitted function called inside another trace
        return f(x) + 1

    for options in ("a", "b", "a"):
        with tracing.options_context(options):
            f(1.0)
            jax.jit(outer)(1.0)
    assert traced == ["a", "b"]  # a new trace for new options; the cache for the same ones


def test_a_reader_that_breaks_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(tracing, "_problems", {})

    def broken(value):
        raise AttributeError("to_batch_info is gone")

    monkeypatch.setattr(tracing, "_batch_size", broken)
    seen = []
    with pytest.warns(RuntimeWarning, match="cannot read the jax.vmap batch size"):
        jax.vmap(lambda v: seen.append(tracing.vmapped_batch_size(v)) or v)(jnp.ones(3))
    assert seen == [1]
    assert "batch" in tracing.problems()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not at every scan
        jax.vmap(lambda v: seen.append(tracing.vmapped_batch_size(v)) or v)(jnp.ones(3))
