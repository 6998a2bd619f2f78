"""One decision per scan, from explicit inputs: the policy is asked once, nothing global is read
while a scan is traced, and a new profile reaches a function jitted before it."""

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, RNN, Chain, Conv2d, Flatten, Linear, ReLU, gru_cell, rnn_cell
from bppsa.scan import _profile
from bppsa.scan._core import forwards, profiles, tracing
from bppsa.scan._core.methods import auto, policy
from tests.helpers import assert_trees_close

resolve = sys.modules["bppsa.scan._core.methods.resolve"]


@pytest.fixture
def restore_cpu_profile():
    yield
    bppsa.set_profile("cpu", None)


def cell_loss(cell, params, xs):
    body = lambda h, x: (cell(params, h, x), h)
    carry, hs = bppsa.scan(body, jnp.zeros(params["weight_hh"].shape[-1]), xs)
    return jnp.sum(carry**2) + jnp.sum(jnp.sin(hs))


def batched(cell, init, **options):
    params = init().init(2, 8, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (3, 40, 2))
    loss = lambda p: jax.vmap(functools.partial(cell_loss, cell, p))(xs).sum()
    return bppsa.value_and_grad(loss, **options), params


def chain_step():
    chain = Chain([Conv2d(1, 2, 3, padding=1), ReLU(), Flatten(), Linear(2 * 4 * 4, 3)])
    params = chain.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 1, 4, 4))
    return bppsa.value_and_grad(lambda p: jnp.sum(chain.apply(p, x) ** 2)), params


STEPS = {
    "rnn": lambda: batched(rnn_cell, RNN),
    "gru": lambda: batched(gru_cell, GRU),
    "chain": chain_step,
    "newton": lambda: batched(rnn_cell, RNN, forward="newton"),
}


def refuse(*args, **kwargs):
    raise AssertionError("global state read while a scan was traced")


class Refusing(dict):
    """A name table that refuses every read."""

    def __getitem__(self, key):
        refuse()

    get = __contains__ = items = keys = values = __iter__ = __getitem__


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_tracing_reads_no_global_table(step, profile, monkeypatch, restore_cpu_profile):
    """The default value_and_grad of an RNN, a GRU, a chain of layers and a Newton forward
    traces with get_profile, the built-in profiles' lookup and the name tables refusing every
    read, on the CPU's profile and on the H200's (given to this CPU by set_profile)."""
    if profile == "gpu":
        bppsa.set_profile("cpu", _profile.GPU)
    fun, params = STEPS[step]()
    for name, module in list(sys.modules.items()):
        if name.startswith("bppsa") and hasattr(module, "get_profile"):
            monkeypatch.setattr(module, "get_profile", refuse)
    monkeypatch.setattr(resolve, "METHODS", Refusing())
    monkeypatch.setattr(forwards, "FORWARDS", Refusing())
    with pytest.raises(AssertionError, match="global state"):
        bppsa.get_profile()  # the patch works
    with bppsa.trace_plans() as plans:
        jax.jit(fun).lower(params)
    assert plans, "no scan was traced"
    if profile == "gpu" and step != "chain":
        # The H200's cost model chose: at T = 40 back-propagation's loop in one kernel.
        assert plans[0].method == bppsa.FusedSequential(), plans[0]


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_policy_is_asked_once_per_scan(step, profile, monkeypatch, restore_cpu_profile):
    if profile == "gpu":
        bppsa.set_profile("cpu", _profile.GPU)
    asked = []
    for cls in (auto.Auto, policy.Fixed):
        for name in ("scan_method", "chain_method"):
            original = getattr(cls, name)

            def counting(self, *args, _original=original, **kwargs):
                asked.append(self)
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting)
    fun, params = STEPS[step]()
    with bppsa.trace_plans() as plans:
        jax.jit(fun).lower(params)
    # Newton's solver is its own question, on its own footprint: one more where Newton runs.
    newton = sum(isinstance(p.forward, bppsa.Newton) for p in plans)
    expected = len(plans) + (newton if step == "newton" else 0)
    assert len(asked) == expected, (asked, plans)


def test_set_profile_reaches_a_function_jitted_before(restore_cpu_profile):
    """The profiles are part of jax.jit's cache key: the next call is traced again, by them."""
    fun = jax.jit(batched(rnn_cell, RNN)[0])
    params = batched(rnn_cell, RNN)[1]
    with bppsa.trace_plans() as plans:
        before = fun(params)
        fun(params)  # from the cache: no new trace
    assert len(plans) == 1 and isinstance(plans[0].method, bppsa.Blocked)
    bppsa.set_profile("cpu", _profile.GPU)
    with bppsa.trace_plans() as plans:
        after = fun(params)
    assert len(plans) == 1 and plans[0].method == bppsa.FusedSequential()
    assert "on CPUs" not in plans[0].forward_because  # the H200's forward policy decided
    bppsa.set_profile("cpu", None)
    with bppsa.trace_plans() as plans:
        fun(params)
    assert not plans  # the first trace's, from jax.jit's cache
    assert_trees_close(before, after, jnp.float32)


def test_the_profiles_live_in_jax_jits_key_not_in_a_table(restore_cpu_profile):
    assert tracing.problems().get("profiles") is None
    slow = dataclasses.replace(_profile.CPU, name="a slower CPU")
    bppsa.set_profile("cpu", slow)
    assert tracing.profile_overrides() == (("cpu", slow),)
    assert profiles.profile_of("cpu") is slow and profiles.profile_of("gpu") is _profile.GPU
    bppsa.set_profile("cpu", None)
    assert tracing.profile_overrides() == () and bppsa.get_profile("cpu") is _profile.CPU
