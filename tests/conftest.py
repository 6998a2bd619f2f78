"""Shared fixtures: dtypes (float64 enabled only inside the tests that ask for it) and pinned
matmul precision, so an accelerator cannot silently compute in TF32.

The suite is mostly XLA compilation of small programs: it compiles them without LLVM's
optimizations (``--xla_backend_optimization_level=0``, which leaves the HLO passes, and so the
programs' operations and memory, as they are; a third less time on a 2-core CPU), unless
``XLA_FLAGS`` already sets the level. Subprocesses of the tests inherit it.
"""

import os

OPT_LEVEL = "--xla_backend_optimization_level"
if OPT_LEVEL not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OPT_LEVEL}=0".strip()

# After XLA_FLAGS, which is read when the backend starts.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _highest_matmul_precision():
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    """Each test that takes ``dtype`` runs in float32, and in float64 with x64 enabled."""
    if request.param == "float64":
        with jax.enable_x64(True):
            yield jnp.float64
    else:
        yield jnp.float32


@pytest.fixture
def x64():
    """Enables float64 for one test."""
    with jax.enable_x64(True):
        yield


MULTIDEVICE = 8  # emulated CPU devices of the tests in tests/multidevice/


def pytest_ignore_collect(collection_path, config):
    """tests/multidevice/ needs several devices: it runs in a subprocess of its own
    (tests/core/test_sharded.py), so that the rest of the suite keeps one device."""
    if collection_path.name == "multidevice":
        return len(jax.devices()) < MULTIDEVICE
    return None
