"""Methods own their backward: a new method is one class, blocking wraps any Jacobian method,
Auto() is a policy that returns a concrete method."""

import dataclasses
import math
import typing

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU, gru_cell
from bppsa.scan import Method, apply
from bppsa.scan._core import cost
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods.base import Supports, require
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import CPU
from tests.helpers import assert_trees_close, spread

XS = jnp.linspace(-1.0, 1.0, 26).reshape(13, 2)
PARAMS = GRU().init(2, 3, key=jax.random.key(0))


class PythonLoop(Method):
    """A method defined outside the library: its scan is a Python loop of affine steps."""

    def scan(self, g_last, maps, offsets):
        out = [g_last]
        for t in reversed(range(len(maps))):
            b = jnp.zeros_like(g_last) if offsets is None else offsets[t]
            out.append(apply(out[-1][None], (maps.take(t, t + 1), b[None]))[0])
        return jnp.stack(out[::-1])

    def memory(self, fp):
        return fp.span_bytes()

    def cost(self, fp):
        return cost.plus(cost.jacobians(fp, fp.length), cost.sequential_scan(fp, fp.length))

    def __eq__(self, other):
        return type(other) is PythonLoop

    def __hash__(self):
        return hash(PythonLoop)


def loss(scan, method=None):
    def fn(params, h0):
        body = lambda h, x: (gru_cell(params, h, x), h.sum())
        kwargs = {} if method is None else dict(method=method)
        h, ys = scan(body, h0, XS, **kwargs)
        return jnp.sum(h**2) + jnp.sum(ys)

    return fn


@pytest.mark.parametrize(
    "method",
    [PythonLoop(), bppsa.Blocked(PythonLoop(), 5)],
    ids=["PythonLoop", "Blocked(PythonLoop, 5)"],  # names without addresses: the same in every run
)
def test_a_method_defined_outside_the_library(method):
    args = (PARAMS, 0.3 * jnp.ones(3))
    expected = jax.grad(loss(jax.lax.scan), argnums=(0, 1))(*args)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(bppsa.grad(loss(bppsa.scan), argnums=(0, 1), method=method))(*args)
    assert [(p.method, p.backward) for p in plans] == [(method, method)]
    assert_trees_close(actual, expected, jnp.float32)


@pytest.mark.parametrize(
    "inner,block",
    spread([bppsa.Blelloch(), bppsa.Chunked(2), bppsa.SequentialScan()], [1, 4, 13, 50]),
)
def test_blocked_wraps_any_jacobian_method(inner, block):
    method = bppsa.Blocked(inner, block)
    args = (PARAMS, 0.3 * jnp.ones(3))
    expected = jax.grad(loss(jax.lax.scan), argnums=(0, 1))(*args)
    actual = bppsa.grad(loss(bppsa.scan, method), argnums=(0, 1))(*args)
    assert_trees_close(actual, expected, jnp.float32)


@pytest.mark.parametrize(
    "method,error",
    [
        (bppsa.Sequential(), TypeError),
        (bppsa.Auto(), TypeError),
        (bppsa.Blocked(bppsa.Blelloch(), 2), TypeError),
        ("blelloch", TypeError),
    ],
    ids=str,
)
def test_blocked_needs_a_jacobian_method(method, error):
    with pytest.raises(error, match="Blocked\\(method, block\\) needs a method that scans"):
        bppsa.Blocked(method, 4)


@pytest.mark.parametrize("block", [0, -1, 2.5, True, "4"])
def test_blocked_needs_a_positive_block(block):
    with pytest.raises(ValueError, match="block must be a positive int"):
        bppsa.Blocked(bppsa.Blelloch(), block)


def test_auto_is_a_policy_that_returns_a_concrete_method():
    fp = Footprint(length=10_000, state=20, element=20, dense=400, itemsize=4, batch=16, size=20)
    assert bppsa.Auto().scan_method(fp, profile=CPU) == bppsa.Auto().choose(
        10_000, 20, "cpu", batch=16, element=20
    )
    assert isinstance(bppsa.Auto(), bppsa.Policy) and not isinstance(bppsa.Auto(), bppsa.Method)
    for backend, runs in (("cpu", bppsa.Blocked), ("gpu", bppsa.Blelloch)):
        assert isinstance(
            bppsa.Auto().scan_method(fp, math.inf, profile=profile_of(backend), jacobians=True),
            runs,
        )


def test_memory_is_owned_by_each_method():
    fp = Footprint(length=10_000, state=20, element=20, dense=400, itemsize=4, batch=16, size=20)
    blelloch = bppsa.Blelloch().memory(fp)
    chunked = bppsa.Chunked().memory(fp)
    blocked = bppsa.Blocked(bppsa.Blelloch(), 100).memory(fp)
    sequential = bppsa.SequentialScan().memory(fp)
    assert blelloch > chunked > sequential > 0
    assert blelloch > blocked > bppsa.Blocked(bppsa.SequentialScan(), 100).memory(fp)
    assert bppsa.Blocked(bppsa.Blelloch(), 10**6).memory(fp) == blelloch  # one block of all


def test_every_capability_has_its_message():
    """require() names what is missing for every field of Supports (no KeyError, no field
    without a message), and the methods that form their own Jacobians refuse given ones."""

    @dataclasses.dataclass(frozen=True)
    class Bare(bppsa.Blelloch):
        supports: typing.ClassVar[Supports] = Supports(
            **{f.name: False for f in dataclasses.fields(Supports)}
        )

    for field in dataclasses.fields(Supports):
        with pytest.raises(TypeError, match=r"Bare|does not") as error:
            require(Bare(), field.name, leaves=("complex64[3]",))
        assert "KeyError" not in repr(error.value)
    for method in (bppsa.Blocked(bppsa.Blelloch(), 4),):
        with pytest.raises(TypeError, match="the Jacobians a forward formed"):
            method.backward(None, [], None, None, None, None, check=False, jacobians=object())
