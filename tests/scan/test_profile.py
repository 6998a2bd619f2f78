"""The measured constants in one place: profiles per backend, overridable, read by Auto() and
the kernels."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan import _profile


@pytest.fixture
def restore_cpu_profile():
    yield
    bppsa.set_profile("cpu", None)


def test_each_backend_has_a_profile():
    assert bppsa.get_profile("cpu") is _profile.CPU and _profile.CPU.measured_rules
    assert bppsa.get_profile("gpu") is _profile.GPU and not _profile.GPU.measured_rules
    assert bppsa.get_profile("tpu") is _profile.other_platform("tpu")
    assert bppsa.get_profile() is bppsa.get_profile(jax.default_backend())


def test_set_profile_changes_what_auto_picks(restore_cpu_profile):
    default = bppsa.Auto().choose(10_000, 20, "cpu", batch=1, element=20)
    assert isinstance(default, bppsa.Blocked)
    rules = dataclasses.replace(_profile.CPU.rules, block_work=2**16)
    bppsa.set_profile("cpu", dataclasses.replace(_profile.CPU, rules=rules))
    assert bppsa.Auto().choose(10_000, 20, "cpu", batch=1, element=20).block < default.block
    bppsa.set_profile("cpu", None)
    assert bppsa.Auto().choose(10_000, 20, "cpu", batch=1, element=20) == default


def test_auto_chooses_by_its_own_profile():
    # The CPU's measured thresholds on a "gpu" backend, and the cost model on a "cpu" one.
    on_gpu = bppsa.Auto(profile=_profile.CPU).choose(10_000, 20, "gpu", batch=16, element=20)
    assert on_gpu == bppsa.Auto().choose(10_000, 20, "cpu", batch=16, element=20)
    on_cpu = bppsa.Auto(profile=_profile.GPU).choose(10_000, 20, "cpu", batch=16, element=20)
    assert on_cpu == bppsa.Blelloch()
    assert bppsa.Auto(profile=_profile.CPU) != bppsa.Auto()  # a different key for jax.jit


def with_small_unroll(unroll):
    kernels = dataclasses.replace(_profile.CPU.kernels, small_unroll=unroll)
    return dataclasses.replace(_profile.CPU, kernels=kernels)


def rnn_loss(params):
    body = lambda h, x: (rnn_cell(params, h, x), None)
    return bppsa.scan(body, jnp.zeros(4), jnp.ones((50, 2)))[0].sum()


def test_a_profile_reaches_the_kernels(restore_cpu_profile):
    # A sequential scan over the RNN's structured maps at B = 1 unrolls the profile's
    # small_unroll steps: the compiled loop differs with it.
    params = RNN().init(2, 4, key=jax.random.key(0))
    texts = []
    for unroll in (1, 5):
        bppsa.set_profile("cpu", with_small_unroll(unroll))
        grad = jax.jit(bppsa.grad(rnn_loss, method=bppsa.SequentialScan()))
        texts.append(grad.lower(params).as_text())
    assert texts[0] != texts[1]


def test_the_profile_of_auto_reaches_the_kernels():
    # The same by the profile of the policy that chose the method, the backend's left alone
    # (single_element=0: Auto() scans the Jacobians of one example outside jax.vmap too).
    params = RNN().init(2, 4, key=jax.random.key(0))
    rules = dataclasses.replace(_profile.CPU.rules, single_element=0.0)
    texts = []
    for unroll in (1, 5):
        auto = bppsa.Auto(profile=dataclasses.replace(with_small_unroll(unroll), rules=rules))
        with bppsa.trace_plans() as plans:
            grad = jax.jit(bppsa.grad(rnn_loss, method=auto))
            texts.append(grad.lower(params).as_text())
        assert "SequentialScan()" in repr(plans[0].method), plans[0]
    assert texts[0] != texts[1]


def test_bad_profiles_are_refused():
    with pytest.raises(ValueError, match="flops must be a positive number"):
        bppsa.Rates(0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="spmv_method"):
        bppsa.Kernels(spmv_method="dense")
    with pytest.raises(ValueError, match="max_resident must be a positive integer"):
        bppsa.FusedProgram(num_warps=1, max_tile=16, max_resident=0)
    for bad in (0.0, -1e-6, True, "1e-6"):
        with pytest.raises(ValueError, match="FusedProgram: step_latency must be a positive num"):
            bppsa.FusedProgram(num_warps=1, max_tile=16, max_resident=16, step_latency=bad)
    assert bppsa.FusedProgram(1, 16, 16, step_latency=1).step_latency == 1
    with pytest.raises(ValueError, match="fused_programs must be a non-empty tuple"):
        bppsa.Kernels(fused_programs=())
    with pytest.raises(ValueError, match="by increasing num_warps"):
        bppsa.Kernels(fused_programs=(bppsa.FusedProgram(4, 16, 16), bppsa.FusedProgram(1, 16, 16)))
    with pytest.raises(ValueError, match="fused_prefetch must be a bool"):
        bppsa.Kernels(fused_prefetch=1)
    with pytest.raises(TypeError, match=r"Profile: rates must be a bppsa\.Rates"):
        bppsa.Profile("x", 0.0)
    with pytest.raises(TypeError, match=r"profile must be a bppsa\.Profile"):
        bppsa.set_profile("cpu", {"flops": 1.0})
    with pytest.raises(TypeError, match="backend must be a string"):
        bppsa.set_profile(None, _profile.CPU)
    with pytest.raises(TypeError, match="Auto: profile must be"):
        bppsa.Auto(profile="cpu")
