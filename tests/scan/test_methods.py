"""Method objects and their resolution from names."""

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import GRU
from bppsa.scan import (
    METHODS,
    Auto,
    Blelloch,
    Blocked,
    Chunked,
    Sequential,
    SequentialScan,
    resolve,
)


def test_names_resolve_to_method_objects():
    assert resolve("blelloch") == Blelloch()
    assert resolve("Sequential") == Sequential()
    assert resolve(SequentialScan()) == SequentialScan()
    assert resolve("chunked") == Chunked()
    names = {
        "auto",
        "blelloch",
        "blocked",
        "chunked",
        "fused-sequential",
        "sequential",
        "sequential-scan",
        "sharded",
    }
    assert set(METHODS) == names
    # Every method is nameable: the classes that need arguments have defaults.
    assert resolve("blocked") == Blocked(SequentialScan(), 1024)
    sharded = resolve("sharded")
    assert (sharded.axis_name, sharded.devices) == ("t", len(jax.devices()))


def test_default_is_auto():
    assert resolve(None) == Auto()


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"method='fast'.*'auto', 'blelloch', 'blocked'"):
        resolve("fast")
    with pytest.raises(ValueError, match="method='fast'"):
        bppsa.grad(lambda x: x, method="fast")


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="method must be a method object"):
        resolve(3)


def test_only_sequential_default_skips_jacobians():
    assert not Sequential().keeps_carries
    assert SequentialScan().keeps_carries
    assert Blelloch().keeps_carries


@pytest.mark.parametrize("chunks", [0, -2, 2.5, "4"])
def test_chunk_counts_are_checked(chunks):
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        Chunked(chunks)
    with pytest.raises(ValueError, match="block must be a positive int"):
        Blocked(Chunked(2), chunks)


def test_auto_says_what_it_picks():
    assert Auto().choose(10_000, 20, backend="cpu") == Blocked(SequentialScan(), 2048)
    assert Auto().choose(10_000, 20, backend="gpu") == Blelloch()


def test_auto_on_cpu_shrinks_blocks_with_the_batch_then_back_propagates():
    """The RNN's Jacobian keeps 20 floats per step, the GRU's 80: the work per step is the
    batch times that, and blocks shrink as it grows, until plain BP is cheaper."""
    blocks = []
    for batch in (1, 2, 4, 8, 16, 32):
        method = Auto().choose(1000, 20, "cpu", batch=batch, element=20)
        assert isinstance(method, Blocked) and method.method == SequentialScan()
        blocks.append(method.block)
    assert blocks == sorted(blocks, reverse=True) and blocks[0] > blocks[-1]
    assert all(b & (b - 1) == 0 and 64 <= b <= 8192 for b in blocks)  # powers of two, bounded
    assert blocks == [8192, 8192, 8192, 4096, 2048, 1024]
    assert Auto().choose(1000, 20, "cpu", batch=64, element=20) == Sequential()
    assert Auto().choose(1000, 20, "cpu", batch=8, element=80) != Sequential()
    assert Auto().choose(1000, 20, "cpu", batch=16, element=80) == Sequential()
    # From 2048 steps on, structured Jacobians (the RNN's, the GRU's) stay parallel up to 4096
    # carry floats per step over the batch; dense ones (the LSTM's 40 x 40) only up to 1024
    # Jacobian floats.
    assert Auto().choose(10_000, 20, "cpu", batch=128, element=20) != Sequential()
    assert Auto().choose(10_000, 20, "cpu", batch=256, element=20) == Sequential()
    assert Auto().choose(10_000, 20, "cpu", batch=32, element=80) != Sequential()
    assert Auto().choose(2048, 20, "cpu", batch=16, element=80) != Sequential()
    assert Auto().choose(2047, 20, "cpu", batch=16, element=80) == Sequential()
    assert Auto().choose(2500, 20, "cpu", batch=64, element=20) != Sequential()
    assert Auto().choose(10_000, 20, "cpu", batch=256, element=80) == Sequential()
    assert Auto().choose(10_000, 40, "cpu", batch=1, element=1600) == Sequential()
    # With features per step (inputs >= 2: BP's loop also carries the input weights'
    # cotangents), structured Jacobians stay parallel from 256 steps up to 640 carry floats per
    # step over the batch, from 512 steps up to 1280: the IRMAS shapes (T = 259, 517, 1034;
    # F = 38, 24, 12) at B = 16 and 32, and from T = 517 on at B = 64.
    for length, batch, inputs in [(259, 16, 38), (259, 32, 38), (517, 64, 24), (1000, 16, 2)]:
        assert Auto().choose(length, 20, "cpu", batch=batch, element=80, inputs=inputs) != (
            Sequential()
        ), (length, batch, inputs)
    for length, batch, inputs in [(1000, 16, 1), (100, 16, 38), (259, 64, 38), (300, 128, 8)]:
        assert Auto().choose(length, 20, "cpu", batch=batch, element=80, inputs=inputs) == (
            Sequential()
        ), (length, batch, inputs)
    assert Auto().choose(1000, 40, "cpu", batch=1, element=1600, inputs=38) == Sequential()
    # Accelerators run the parallel scan at any batch; the backward-time choice never is BP.
    assert Auto().choose(1000, 20, "gpu", batch=256, element=80) == Blelloch()
    assert Auto().choose(1000, 20, "cpu", batch=256, element=80, jacobians=True).keeps_carries


PAPER_T = [100, 300, 1000, 3000, 10_000, 30_000]
PAPER_B = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize("element", [20, 80], ids=["rnn", "gru"])
def test_auto_on_accelerators_goes_parallel_for_the_papers_cells(element):
    """The cost model's rule, without a GPU: the paper's H = 20 grids run a parallel scan."""
    for length in PAPER_T:
        assert Auto().choose(length, 20, "gpu", batch=16, element=element) in (
            Blelloch(),
            Chunked(),
        ), length
    for batch in PAPER_B:
        assert Auto().choose(1000, 20, "gpu", batch=batch, element=element).keeps_carries, batch


def test_auto_on_accelerators_back_propagates_large_cells_and_says_why():
    assert Auto().choose(1000, 1024, "gpu", batch=256) == Sequential()
    times = Auto().predictions(1000, 1024, "gpu", batch=256)
    assert set(times) == {Sequential(), Blelloch(), Chunked()}
    assert min(times, key=times.get) == Sequential()
    # ~H times BP's arithmetic, where BP's steps are bound by their bytes (the H200's rates)
    assert times[Blelloch()] > 5 * times[Sequential()]
    small = Auto().predictions(10_000, 20, "gpu", batch=16, element=20)
    assert min(small, key=small.get) == Auto().choose(10_000, 20, "gpu", batch=16, element=20)
    # the backward-time choice never is BP
    assert Auto().choose(1000, 1024, "gpu", batch=256, jacobians=True).keeps_carries


def test_auto_sees_the_features_per_step_of_a_scan():
    """A scan's footprint counts the floating-point xs per step (here the features beside an
    integer index, which gets no cotangent), and ``Auto()`` decides with them: the GRU at
    T = 300, B = 16 runs the parallel pick with 12 features per step and BP with one."""
    cell = GRU()

    def loss(params, xs, index):
        def one(x, i):
            h, _ = bppsa.scan(
                lambda h, xi: (cell(params, h, xi[0]), None), cell.initial_state(20), (x, i)
            )
            return h.sum()

        return jax.vmap(one)(xs, index).sum()

    runs = {}
    for features in (12, 1):
        xs = jnp.ones((16, 300, features))
        index = jnp.zeros((16, 300), jnp.int32)
        params = cell.init(features, 20, key=jax.random.key(0))
        with bppsa.trace_plans() as plans:
            jax.eval_shape(bppsa.grad(loss), params, xs, index)
        runs[features] = plans[-1].method
    assert isinstance(runs[12], Blocked) and runs[1] == Sequential()


def test_auto_runs_back_propagation_for_one_unvmapped_example_of_a_thin_jacobian():
    # One example outside jax.vmap: lax.scan's steps are matrix-vector products, and the blocked
    # scan pays only where a step's Jacobian stores several floats per carry float (the GRU's
    # 4n, not the RNN's n).
    assert Auto().choose(10_000, 20, "cpu", element=20, single=True) == Sequential()
    assert isinstance(Auto().choose(10_000, 20, "cpu", element=80, single=True), Blocked)
    assert isinstance(Auto().choose(10_000, 20, "cpu", element=20), Blocked)
    assert Auto().choose(10_000, 20, "gpu", element=20, single=True) == Blelloch()
    params = GRU().init(1, 4, key=jax.random.key(0))
    rnn = bppsa.models.RNN().init(1, 4, key=jax.random.key(0))
    xs = jnp.ones((50, 1))

    def loss(cell, params, xs):
        return bppsa.scan(lambda h, x: (cell(params, h, x), None), jnp.zeros(4), xs)[0].sum()

    def unvmapped(cell):
        return lambda p: loss(cell, p, xs)

    def vmapped(cell):  # a batch of one example
        return lambda p: jax.vmap(lambda x: loss(cell, p, x), in_axes=1)(xs[:, None]).sum()

    with bppsa.trace_plans() as plans:
        for cell, p in ((bppsa.models.rnn_cell, rnn), (bppsa.models.gru_cell, params)):
            jax.eval_shape(bppsa.grad(unvmapped(cell)), p)
            jax.eval_shape(bppsa.grad(vmapped(cell)), p)
    picked = [plan.method for plan in plans]
    assert picked[0] == Sequential() and all(isinstance(m, Blocked) for m in picked[1:]), picked
