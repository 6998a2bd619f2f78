"""The cost model of the backward methods (bppsa.scan._core.cost): counts that follow the
algorithms, and a time that adds latency-bound steps to throughput-bound work."""

import pytest

import bppsa
from bppsa.scan._core import cost
from bppsa.scan._core.memory import Footprint


def footprint(length, size=20, batch=16):
    return Footprint(length, size, size, size * size, 4, batch, size)


def test_dependent_steps_follow_the_algorithms():
    fp = footprint(10_000)
    assert bppsa.Sequential().cost(fp).steps == 10_000
    assert bppsa.Blelloch().cost(fp).steps == 2 + cost.KERNELS_PER_LEVEL * 2 * 14  # log2(10001)
    chunked = bppsa.Chunked(100).cost(fp)
    assert chunked.steps == 2 + 2 * 100 + cost.KERNELS_PER_LEVEL * 2 * 7
    assert bppsa.Chunked(1).cost(fp).steps == bppsa.SequentialScan().cost(fp).steps


def test_blelloch_does_about_n_times_the_arithmetic_of_back_propagation():
    fp = footprint(10_000, size=64)
    ratio = bppsa.Blelloch().cost(fp).flops / bppsa.Sequential().cost(fp).flops
    assert 64 <= ratio <= 2 * 64


@pytest.mark.parametrize("block", [1, 7, 100, 8192, 10_000, 20_000])
def test_blocks_repeat_the_inner_method(block):
    """Full blocks of the inner method, and a shorter first block where ``block`` does not
    divide ``T`` (10k = 1428 x 7 + 4 = 8192 + 1808)."""
    fp = footprint(10_000)
    inner = bppsa.Blelloch().cost(footprint(min(block, 10_000)))
    blocked = bppsa.Blocked(bppsa.Blelloch(), block).cost(fp)
    blocks, head = divmod(10_000, min(block, 10_000))
    first = bppsa.Blelloch().cost(footprint(head)) if head else cost.Cost(0, 0, 0)
    assert blocked.steps == inner.steps * blocks + first.steps
    assert blocked.flops == inner.flops * blocks + first.flops
    assert (head > 0) == (block in (7, 8192))


def test_time_is_latency_plus_the_larger_of_arithmetic_and_bytes():
    profile = bppsa.Profile("test", bppsa.Rates(flops=1e12, bandwidth=1e11, step_latency=1e-5))
    c = cost.Cost(steps=100, flops=2e12, bytes=1e11)
    assert c.seconds(profile) == pytest.approx(100 * 1e-5 + 2.0)
    c = cost.Cost(steps=100, flops=1e9, bytes=1e12)
    assert c.seconds(profile) == pytest.approx(100 * 1e-5 + 10.0)


class Sharded4(bppsa.Sharded):
    """``Sharded`` as if its mesh had four devices (the cost is arithmetic on the count)."""

    devices = 4  # type: ignore[assignment]


@pytest.mark.parametrize("exchange", ["all_gather", "ppermute"])
def test_sharded_costs_a_slice_its_aggregate_and_the_exchange(exchange):
    local = bppsa.Blelloch()
    one = bppsa.Sharded(local=local, exchange=exchange)
    assert one.cost(footprint(10_000)) == local.cost(footprint(10_000))  # nothing to exchange
    four = Sharded4(local=local, exchange=exchange)
    fp = footprint(10_000)
    part = local.cost(fp.part(2500))
    assert part == local.cost(footprint(2500))  # the carries kept do not enter the cost
    rounds = 2 if exchange == "ppermute" else 0
    expected = cost.plus(part, cost.aggregate(fp, 2500), cost.exchange(fp, 4, rounds))
    sharded = four.cost(fp)
    assert sharded == expected
    # The critical path: about 2 T / P dependent steps (the aggregate, then the slice), far
    # fewer than back-propagation's T, for P times the slice's arithmetic.
    assert 2500 < sharded.steps < 2500 + part.steps + 10
    assert sharded.flops > part.flops
