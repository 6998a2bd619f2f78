"""The modified Blelloch scan's depth: ``ceil(log2(T + 1))`` up-sweep levels and as many
down-sweep levels, for stacks of steps and lists of layers, counted at trace time.

An up-sweep level that does not shrink the sequence (an odd element carried up when there is
none) would trace forever: the counts stop at a bound and fail instead."""

import math

import jax
import jax.numpy as jnp
import pytest

from bppsa.scan import Dense
from bppsa.scan import _algorithms as algorithms
from bppsa.scan._algorithms import blelloch, chain_scan

BOUND = 64  # far above any level count here


@pytest.fixture
def levels(monkeypatch):
    """Counts of the up-sweep (``paired``) and down-sweep (``down``) levels traced, by kind."""
    counts = {"paired": 0, "down": 0}
    for kind in (algorithms._Stack, algorithms._List):
        for name in counts:
            original = getattr(kind, name)

            def counted(self, *args, _original=original, _name=name):
                counts[_name] += 1
                if counts[_name] > BOUND:
                    raise RuntimeError(f"more than {BOUND} {_name} levels: the sweep does not end")
                return _original(self, *args)

            monkeypatch.setattr(kind, name, counted)
    return counts


LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17]


@pytest.mark.parametrize("length", LENGTHS)
def test_a_stack_of_steps(levels, length):
    n = 2
    jax.make_jaxpr(lambda g, a, b: blelloch(g, Dense(a), b))(
        jnp.zeros(n), jnp.zeros((length, n, n)), jnp.zeros((length, n))
    )
    depth = math.ceil(math.log2(length + 1))
    assert levels == {"paired": depth, "down": depth}


@pytest.mark.parametrize("length", LENGTHS)
def test_a_list_of_layers(levels, length):
    sizes = [2 + k % 3 for k in range(length + 1)]  # maps of different shapes
    maps = [Dense(jnp.zeros((1, sizes[k], sizes[k + 1]))) for k in range(length)]
    jax.make_jaxpr(lambda g: chain_scan(g, maps))(jnp.zeros(sizes[-1]))
    depth = math.ceil(math.log2(length + 1))
    assert levels == {"paired": depth, "down": depth}
