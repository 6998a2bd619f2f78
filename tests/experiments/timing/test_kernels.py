"""The device-kernel cross-check: the sum over a profile's GPU stream events (on a synthetic
profile), and on this CPU a capture that reads JAX's profile, finds no device kernels, returns
``None`` with the reason, cleans up after itself and never raises."""

import tempfile

import jax
import jax.numpy as jnp
import pytest

from experiments.timing import KernelTime, kernel_seconds, kernel_time, summed_kernel_seconds
from experiments.timing.kernels import profile_events

GPU0, GPU1 = "/device:GPU:0", "/device:GPU:1"


def test_only_the_gpu_streams_events_are_summed():
    events = [
        (GPU0, "Stream #13(Kernel,MemcpyD2D)", "loop_add_fusion", 1_500),
        (GPU0, "Stream #13(Kernel,MemcpyD2D)", "MemcpyD2D", 500),
        (GPU0, "Stream #14", "gemm", 2_000),
        (GPU1, "Stream #13(Kernel)", "gemm", 1_000),
        (GPU0, "XLA Ops", "loop_add_fusion", 1_500),  # derived from the streams: counted there
        (GPU0, "XLA Modules", "jit_backward", 9_000),
        (GPU0, "CUPTI overhead", "overhead", 700),
        ("/host:CPU", "python", "Stream #13", 50_000),
        ("/device:TPU:0", "Stream #1", "fusion", 3_000),
    ]
    assert summed_kernel_seconds(events) == pytest.approx(5_000e-9, rel=1e-12)
    assert summed_kernel_seconds(iter(events)) == pytest.approx(5_000e-9, rel=1e-12)


def test_no_gpu_stream_events_is_none():
    assert summed_kernel_seconds([]) is None
    assert summed_kernel_seconds([("/host:CPU", "python", "call", 10)]) is None
    assert summed_kernel_seconds([(GPU0, "XLA Ops", "fusion", 10)]) is None


def test_a_profile_reads_as_events(tmp_path):
    # Fails loudly if jax.profiler.ProfileData changes underneath kernel_time.
    f = jax.jit(lambda x: jnp.sin(x) @ x)
    x = jnp.ones((8, 8))
    jax.block_until_ready(f(x))
    with jax.profiler.trace(tmp_path):
        jax.block_until_ready(f(x))
    (path,) = tmp_path.glob("**/*.xplane.pb")
    events = list(profile_events(jax.profiler.ProfileData.from_file(str(path))))
    assert events
    assert all(isinstance(name, str) for event in events for name in event[:3])
    assert any(plane.startswith("/host:") and duration > 0 for plane, _, _, duration in events)


@pytest.fixture
def temporary_dir(tmp_path, monkeypatch):
    """The temporary folder of tempfile, here: empty after a call that cleans up."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_on_the_cpu_there_is_no_kernel_time_and_no_file_left(temporary_dir):
    x = jnp.ones((8, 8))
    f = jax.jit(lambda x: jnp.tanh(x) @ x).lower(x).compile()
    result = kernel_time(f, x, repeats=2)
    assert list(temporary_dir.iterdir()) == []
    if jax.default_backend() == "gpu":
        assert result.seconds > 0 and result.reason is None
        return
    assert result == KernelTime(
        None, f"no GPU kernel events in the profile ({jax.default_backend()} backend)"
    )
    assert kernel_seconds(f, x) is None


def test_a_failure_is_a_reason_not_an_exception(temporary_dir):
    def fails():
        raise FloatingPointError("a failing program")

    result = kernel_time(fails)
    assert result.seconds is None
    assert result.reason == "profiling failed: FloatingPointError: a failing program"

    with jax.profiler.trace(temporary_dir / "outer"):  # only one trace at a time
        result = kernel_time(jnp.ones, 3)
    assert result.seconds is None and result.reason.startswith("profiling failed: RuntimeError")
    assert [p.name for p in temporary_dir.iterdir()] == ["outer"]


def test_a_jax_without_profile_data_is_a_reason(monkeypatch):
    monkeypatch.delattr(jax.profiler, "ProfileData")
    result = kernel_time(jnp.ones, 3)
    assert result == KernelTime(
        None, f"jax.profiler.ProfileData is missing in JAX {jax.__version__}"
    )


def test_repeats_below_one_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        kernel_time(jnp.ones, 3, repeats=0)
