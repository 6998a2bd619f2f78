"""One profile per platform, the one a scan is traced for: the CPU's, NVIDIA's (the H200 fit),
and for any other platform (ROCm, TPU, ...) one without fused loops, whose kernel would run as
``lax.scan`` there, so that ``Auto()`` never ranks it and its ``why_not`` names the platform."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._core import profiles
from bppsa.scan._core.api import prepare
from bppsa.scan._core.cost import footprint_of
from bppsa.scan._core.fused.forward import Fused
from bppsa.scan._core.methods.auto import ranked
from bppsa.scan._profile import ACCELERATOR, CPU, GPU, built_in, other_platform

OTHERS = ["rocm", "tpu", "a platform of tomorrow"]


@pytest.fixture
def restore_profiles():
    yield
    for platform in ("gpu", "rocm"):
        bppsa.set_profile(platform, None)


def rnn(length=300, hidden=4):
    params = RNN().init(2, hidden, key=jax.random.key(0))
    return (lambda h, x: (rnn_cell(params, h, x), h)), jnp.zeros(hidden), jnp.ones((length, 2))


def rnn_problem():
    body, init, xs = rnn()
    return prepare(body, init, xs, None, reverse=False, batch=None)[0]


def grad_plan(profile=None, *, under=None):
    """The plan of a gradient through the RNN's scan by ``Auto(profile=profile)``, traced under
    the abstract mesh ``under``."""
    body, init, xs = rnn()
    loss = lambda xs: bppsa.scan(body, init, xs)[0].sum()
    fun = bppsa.grad(loss, method=bppsa.Auto(profile=profile))
    with bppsa.trace_plans() as plans:
        if under is None:
            jax.eval_shape(fun, xs)
        else:
            with use_abstract_mesh(under):
                jax.jit(fun).trace(xs)
    return plans[0]


def abstract_mesh(platform):
    device = AbstractDevice(device_kind=f"a {platform} device", num_cores=1, platform=platform)
    return AbstractMesh((1,), ("x",), abstract_device=device)


GPU_MESH, TPU_MESH = abstract_mesh("gpu"), abstract_mesh("tpu")


@pytest.mark.parametrize("platform,profile", [("cpu", CPU), ("cuda", GPU), ("gpu", GPU)])
def test_the_cpu_and_nvidia_gpus_have_their_measured_profiles(platform, profile):
    assert built_in(platform) is profile and bppsa.get_profile(platform) is profile
    assert profile.kernels.fused_backend == "triton"
    reason = Fused().why_not(rnn_problem(), profile)
    assert reason is None and bppsa.FusedSequential().why_not(rnn_problem(), profile) is None


@pytest.mark.parametrize("platform", OTHERS)
def test_any_other_platform_has_the_h200s_rates_assumed_and_no_fused_loops(platform):
    profile = bppsa.get_profile(platform)
    assert profile is built_in(platform) is other_platform(platform)
    assert platform in profile.name and "ASSUMED" in profile.name
    assert profile.rates == dataclasses.replace(GPU.rates, fused_step_latency=None)
    assert profile.kernels.fused_backend is None
    assert not profile.measured_rules and profile.rules == GPU.rules
    assert ACCELERATOR.rates == profile.rates and ACCELERATOR.kernels.fused_backend is None


@pytest.mark.parametrize("platform", OTHERS)
def test_the_fused_loops_refuse_naming_the_platform(platform):
    problem = rnn_problem()
    reason = f"no fused kernel backend on {platform}"
    assert reason in Fused().why_not(problem, built_in(platform))
    assert reason in bppsa.FusedSequential().why_not(problem, built_in(platform))


@pytest.mark.parametrize("platform", OTHERS)
def test_auto_never_ranks_the_fused_loops_there(platform):
    profile = built_in(platform)
    # Where NVIDIA's profile picks FusedSequential() (short scans, below its break-even) ...
    assert bppsa.FusedSequential() in ranked(None, GPU, fused_backward=True)
    assert bppsa.Auto().choose(100, 20, "cuda", batch=16, fused_backward=True) == (
        bppsa.FusedSequential()
    )
    assert grad_plan(GPU).method == bppsa.FusedSequential()
    assert bppsa.AutoForward().choose(1000, 20, "cuda", batch=16) == bppsa.Fused()
    # ... the other platforms' never rank it, nor the fused forward.
    assert bppsa.FusedSequential() not in ranked(None, profile, fused_backward=True)
    auto = bppsa.Auto(profile=profile)
    times = auto.predictions(100, 20, batch=16, fused_backward=True)
    assert bppsa.FusedSequential() not in times and times
    assert auto.choose(100, 20, batch=16, fused_backward=True) != bppsa.FusedSequential()
    plan = grad_plan(profile)
    assert plan.method != bppsa.FusedSequential() and plan.forward != bppsa.Fused()
    assert bppsa.AutoForward().choose(1000, 20, platform, batch=16) != bppsa.Fused()
    fp = footprint_of(1000, 20, 16)
    forward = bppsa.AutoForward().forward_for(fp, bppsa.Blelloch(), bppsa.Blelloch(), profile)
    assert forward[0] != bppsa.Fused()


def test_asked_for_explicitly_the_fused_forward_falls_back_naming_the_platform():
    body, init, xs = rnn()
    auto = bppsa.Auto(profile=built_in("tpu"))
    with bppsa.trace_plans() as plans, pytest.warns(bppsa.FallbackWarning, match="on tpu"):
        jax.eval_shape(lambda x: bppsa.scan(body, init, x, forward="fused", method=auto), xs)
    assert "no fused kernel backend on tpu" in plans[0].forward_because


def test_the_platform_is_the_default_backends_outside_any_setting(monkeypatch):
    assert profiles.platform_now() == jax.default_backend()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert profiles.platform_now() == "tpu"
    assert profiles.profile_of() is other_platform("tpu") is bppsa.get_profile()


def test_the_default_device_beats_the_default_backend(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with jax.default_device(jax.devices("cpu")[0]):
        assert profiles.platform_now() == "cpu"
    with jax.default_device("cpu"):
        assert profiles.platform_now() == "cpu"


def test_the_abstract_mesh_beats_both(monkeypatch):
    with use_abstract_mesh(TPU_MESH), jax.default_device("cpu"):
        assert profiles.platform_now() == "tpu"
    with jax.set_mesh(jax.make_mesh((1,), ("x",), devices=jax.devices("cpu")[:1])):
        monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
        assert profiles.platform_now() == "cpu"


def test_a_scan_is_traced_by_the_profile_of_its_platform():
    """Traced on this CPU, for a GPU and for a TPU (abstract meshes): each plan is the one its
    platform's profile makes (the CPU's rules; NVIDIA's fused loop; neither on the TPU)."""
    methods = [grad_plan(under=mesh).method for mesh in (None, GPU_MESH, TPU_MESH)]
    expected = [grad_plan(profile).method for profile in (CPU, GPU, built_in("tpu"))]
    assert methods == expected
    assert methods[1] == bppsa.FusedSequential() and methods[2] == bppsa.Blelloch()
    assert methods[0] not in methods[1:]


def test_the_platform_keys_jax_jits_cache():
    """One jitted function is traced once per platform, and served from the cache after."""
    body, init, xs = rnn()
    traced = []

    def loss(xs):
        traced.append(profiles.profile_of())
        return bppsa.scan(body, init, xs)[0].sum()

    fun = jax.jit(bppsa.grad(loss))
    for mesh in (None, GPU_MESH, TPU_MESH, None, GPU_MESH, TPU_MESH):
        if mesh is None:
            fun.trace(xs)
        else:
            with use_abstract_mesh(mesh):
                fun.trace(xs)
    assert traced == [CPU, GPU, built_in("tpu")]


@pytest.mark.parametrize(
    "version,platform",
    [("PJRT C API\ncuda 12080", "cuda"), ("rocm 60300", "rocm"), ("a new toolkit", "gpu")],
)
def test_gpus_are_named_by_their_toolkit(version, platform):
    device = types.SimpleNamespace(
        platform="gpu", client=types.SimpleNamespace(platform_version=version)
    )
    assert profiles.platform_of(device) == platform
    assert profiles.platform_of(types.SimpleNamespace(platform="rocm", client=None)) == "rocm"
    assert profiles.platform_of(jax.devices("cpu")[0]) == "cpu"


def test_a_profile_set_for_gpu_serves_every_gpu_without_its_own(restore_profiles):
    slow = dataclasses.replace(GPU, name="a slower GPU")
    bppsa.set_profile("gpu", slow)
    assert profiles.profile_of("cuda") is slow and profiles.profile_of("rocm") is slow
    assert profiles.profile_of("tpu") is other_platform("tpu")
    mine = dataclasses.replace(ACCELERATOR, name="my ROCm GPU")
    bppsa.set_profile("rocm", mine)
    assert profiles.profile_of("rocm") is mine and profiles.profile_of("cuda") is slow


def test_a_backend_that_is_not_a_name_is_refused():
    with pytest.raises(ValueError, match="fused_backend must be a backend's name"):
        bppsa.Kernels(fused_backend=3)
