"""``bppsa.Sharded``: its arguments on one device, and its gradients on 8 emulated CPU devices
(tests/multidevice/, run in a subprocess so that the rest of the suite keeps one device).

The emulated cases run in one subprocess (tests/multidevice/runner.py) and are reported here
per test function of tests/multidevice/test_sharded.py: ``test_on_emulated_devices[<function>]``
fails with the names and messages of that function's failing cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import bppsa
from tests.conftest import MULTIDEVICE
from tests.helpers import assert_trees_close
from tests.multidevice import runner


@pytest.fixture(scope="module")
def emulated(request):
    """``outcomes(marks) -> ({group: [Case]}, log)``: the cases of tests/multidevice/ that
    ``marks`` selects, run in ONE subprocess for all the groups this session selected of the
    test that asks (the default or the exhaustive one)."""
    results = {}
    tests = {"not slow": "test_on_emulated_devices", "slow": "test_on_emulated_devices_exhaustive"}

    def outcomes(marks):
        if marks not in results:
            selected = [
                item.callspec.params["group"]
                for item in request.session.items
                if getattr(item, "originalname", None) == tests[marks]
                and item.module is request.module
            ]
            results[marks] = runner.run(selected, marks, MULTIDEVICE)
        return results[marks]

    return outcomes


def check_group(emulated, group, marks):
    """Every case of ``group`` ran and passed; a failure names the failing cases first, then
    gives their messages and the command that reruns the group."""
    cases, log = emulated(marks)
    mine = cases.get(group, [])
    rerun = runner.rerun([group], marks, MULTIDEVICE)
    if not mine:
        pytest.fail(f"no case of {group} ran (rerun: {rerun}):\n{log}", pytrace=False)
    bad = [case for case in mine if case.outcome != "passed"]
    if bad:
        names = ", ".join(f"{c.name} ({c.outcome})" for c in bad)
        details = "\n\n".join(f"--- {c.name}:\n{c.message[-3000:]}" for c in bad)
        message = f"{len(bad)} of {len(mine)} cases: {names}\nrerun: {rerun}\n\n{details}"
        pytest.fail(message, pytrace=False)


@pytest.mark.parametrize("group", runner.groups())
def test_on_emulated_devices(emulated, group):
    check_group(emulated, group, "not slow")


@pytest.mark.slow
@pytest.mark.parametrize("group", runner.groups(slow=True))
def test_on_emulated_devices_exhaustive(emulated, group):
    check_group(emulated, group, "slow")


def one_device_mesh(names=("t",)):
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(names)), names)


def test_bad_mesh_and_axis_are_named():
    with pytest.raises(ValueError, match=r"axis_name='time' is not an axis of the mesh.*\('t',\)"):
        bppsa.Sharded(one_device_mesh(), "time")
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        bppsa.Sharded(jax.devices(), "t")
    with pytest.raises(ValueError, match=r"Pipelined: axis_name='time' is not an axis"):
        bppsa.Pipelined(one_device_mesh(), "time")
    with pytest.raises(TypeError, match=r"Pipelined: mesh must be a jax\.sharding\.Mesh"):
        bppsa.Pipelined(jax.devices(), "t")
    assert bppsa.Pipelined().mesh.axis_names == ("t",)  # forward="pipelined": every device
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
