"""``bppsa.Sharded``: its arguments on one device, and its gradients on 8 emulated CPU devices
(tests/multidevice/, run in a subprocess so that the rest of the suite keeps one device)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import bppsa
from tests.conftest import MULTIDEVICE
from tests.helpers import assert_trees_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_emulated(marks: str):
    """tests/multidevice/ in a subprocess with 8 emulated devices, its cases selected by
    ``marks`` (a ``-m`` expression)."""
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(MULTIDEVICE), PYTHONPATH=ROOT)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks]
    out = subprocess.run(
        [*command, "tests/multidevice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-2000:]


def test_on_emulated_devices():
    run_emulated("not slow")


@pytest.mark.slow
def test_on_emulated_devices_exhaustive():
    run_emulated("slow")


def one_device_mesh(names=("t",)):
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(names)), names)


def test_bad_mesh_and_axis_are_named():
    with pytest.raises(ValueError, match=r"axis_name='time' is not an axis of the mesh.*\('t',\)"):
        bppsa.Sharded(one_device_mesh(), "time")
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        bppsa.Sharded(jax.devices(), "t")
    with pytest.raises(ValueError, match="forward must be one of"):
        bppsa.Sharded(one_device_mesh(), "t", forward="parallel")
    with pytest.raises(ValueError, match="exchange must be one of"):
        bppsa.Sharded(one_device_mesh(), "t", exchange="tree")
    with pytest.raises(TypeError, match="local must be a method that scans Jacobians"):
        bppsa.Sharded(one_device_mesh(), "t", local=bppsa.Auto())


def test_one_device_is_the_local_method():
    method = bppsa.Sharded(one_device_mesh(), "t")
    xs = jnp.linspace(-1, 1, 14).reshape(7, 2)

    def loss(scan, w):
        return scan(lambda h, x: (jnp.tanh(w @ h + x), h.sum()), jnp.ones(2), xs)[0].sum()

    w = jnp.array([[0.5, -0.4], [0.3, 0.2]])
    actual = bppsa.grad(lambda w: loss(bppsa.scan, w), method=method)(w)
    assert_trees_close(actual, jax.grad(lambda w: loss(jax.lax.scan, w))(w), jnp.float32)
