"""The memory guard, the cost model and Auto() with Jacobians that keep a structure: they count
``n k`` floats per step, products of ``n k^2`` flops, and choose accordingly."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.scan._core import cost

H, T, B = 4096, 16384, 8


def indrnn(params, h, x):  # a user's diagonal cell, plain jnp
    return jax.nn.relu(params["w"] @ x + params["u"] * h + params["b"])


def dense_rnn(params, h, x):  # the same with a full recurrent matrix
    return jax.nn.relu(params["w"] @ x + params["r"] @ h + params["b"])


def shapes(hidden, inputs=8):
    spec = jax.ShapeDtypeStruct
    return {
        "w": spec((hidden, inputs), jnp.float32),
        "u": spec((hidden,), jnp.float32),
        "r": spec((hidden, hidden), jnp.float32),
        "b": spec((hidden,), jnp.float32),
    }


def estimate(cell, hidden, length, method, batch):
    params = {k: jnp.zeros(s.shape, s.dtype) for k, s in shapes(hidden).items()}
    xs = jax.ShapeDtypeStruct((length, 8), jnp.float32)
    init = jax.ShapeDtypeStruct((hidden,), jnp.float32)

    def body(h, x):
        return cell(params, h, x), None

    return bppsa.estimate_memory(body, init, xs, method=method, batch=batch)


def test_the_memory_guard_counts_n_floats_per_step_for_a_diagonal_cell():
    diagonal = estimate(indrnn, H, T, "blelloch", B)
    dense = estimate(dense_rnn, H, T, "blelloch", B)
    # Dense: ~T B n^2 floats of products (tens of TB); diagonal: a few floats per carry float.
    assert dense > 1e13
    per_carry_float = diagonal / (4 * T * B * H)
    assert 1 <= per_carry_float <= 20, per_carry_float
    assert diagonal < dense / 1000


def test_the_cost_model_counts_products_of_width_k():
    dense = cost.footprint_of(1000, 256, 16)
    diagonal = cost.footprint_of(1000, 256, 16, element=256, width=1)
    blocks = cost.footprint_of(1000, 256, 16, element=512, width=2)
    assert (dense.dense, diagonal.dense, blocks.dense) == (256 * 256, 256, 512)
    footprints = {"dense": dense, "diagonal": diagonal, "blocks": blocks}
    scan = {name: cost.blelloch_scan(fp, 1000).flops for name, fp in footprints.items()}
    assert scan["dense"] == pytest.approx(2 * 1000 * 16 * 256**2 * 256 + 4 * 1000 * 16 * 256**2)
    assert scan["diagonal"] == pytest.approx(2 * 1000 * 16 * 256 * 1 + 4 * 1000 * 16 * 256)
    assert scan["blocks"] == pytest.approx(2 * 1000 * 16 * 512 * 2 + 4 * 1000 * 16 * 512)
    # Chunked's aggregates keep the structure: a map and its offset, not n + 1 dense rows.
    assert (dense.aggregate, diagonal.aggregate, blocks.aggregate) == (256 * 256, 512, 768)
    chunked = {name: cost.chunked_scan(fp, 1000, 30) for name, fp in footprints.items()}
    assert chunked["diagonal"].flops < chunked["dense"].flops / 100
    composed = (1000 - 34) * 16 * 256  # the maps of chunks 1..29 through their aggregates
    assert chunked["diagonal"].flops == pytest.approx(
        2 * composed * 2
        + 2 * 1000 * 16 * 256
        + cost.blelloch_scan(dataclasses.replace(diagonal, length=30), 30).flops
    )


@pytest.mark.parametrize("hidden", [256, 1024, 4096])
def test_on_accelerators_the_parallel_backward_is_predicted_to_pay_for_structured_cells(hidden):
    auto = bppsa.Auto()
    for length, batch in ((1000, 16), (4096, 8), (16384, 1)):
        diagonal = auto.choose(length, hidden, "gpu", batch=batch, element=hidden, width=1)
        lstm = auto.choose(length, 2 * hidden, "gpu", batch=batch, element=4 * hidden, width=2)
        assert diagonal == lstm == bppsa.Blelloch(), (length, batch)
    # Dense Jacobians of that width: back-propagation (about n times the arithmetic).
    assert auto.choose(1000, 4096, "gpu", batch=16) == bppsa.Sequential()


def test_on_cpus_auto_scans_structured_maps_in_cache_sized_blocks():
    profile = bppsa.get_profile("cpu")
    auto = bppsa.Auto(profile=profile)
    chosen = auto.choose(4096, 1024, "cpu", batch=4, element=1024, width=1)
    assert isinstance(chosen, bppsa.Blocked) and chosen.method == bppsa.SequentialScan()
    budget = profile.rules.structured_block_work
    assert chosen.block * 4 * 1024 <= budget < 2 * chosen.block * 4 * 1024
    # One example outside jax.vmap keeps back-propagation (its steps are cheap there).
    single = auto.choose(4096, 1024, "cpu", element=1024, width=1, single=True)
    assert single == bppsa.Sequential()
    # Dense maps keep today's rule.
    assert auto.choose(4096, 1024, "cpu", batch=4) == bppsa.Sequential()


def test_a_scan_of_a_diagonal_cell_runs_what_auto_chose_for_its_structure():
    params = {k: jnp.ones(s.shape, s.dtype) * 0.1 for k, s in shapes(64).items()}
    xs = jnp.ones((4, 300, 8))

    def loss(params, xs):
        def one(x):
            return bppsa.scan(lambda h, x: (indrnn(params, h, x), None), jnp.zeros(64), x)[0]

        return jax.vmap(one)(xs).sum()

    with bppsa.trace_plans() as plans:
        jax.grad(loss)(params, xs)
    (plan,) = plans
    assert plan.jacobians == "autodiff, diagonal" and plan.dense_because is None
    expected = bppsa.Auto().choose(300, 64, batch=4, element=64, width=1)
    assert plan.backward == expected and isinstance(expected.method, bppsa.SequentialScan)


def sequential_blocks(steps):
    return bppsa.Blocked(bppsa.SequentialScan(), steps)


# Auto()'s CPU rule, point by point. Its profile's values are spelled out here, so that a changed
# threshold fails the test that names it.
CPU = bppsa.get_profile("cpu")


def test_the_cpu_profile_holds_the_values_these_picks_assume():
    assert CPU.measured_rules
    rules = CPU.rules
    assert (rules.structured_block_work, rules.structured_block_steps) == (2**19, (16, 8192))
    assert (rules.block_work, rules.block_steps) == (2**20, (64, 8192))
    assert (rules.parallel_work, rules.single_element) == (1024, 2.0)
    assert (rules.long, rules.parallel_state) == (2048, 4096)
    assert (rules.inputs, rules.inputs_length, rules.inputs_state) == (2, 256, (640, 1280))


@pytest.mark.parametrize(
    "size,element,width,batch,steps",
    [
        # 2^19 Jacobian floats per block over the batch, as a power of two within 16..8192
        (1024, 1024, 1, 4, 128),  # 2^19 / 4096
        (1000, 1000, 1, 3, 128),  # 2^19 / 3000 = 174
        (4096, 4096, 1, 4, 32),  # below the 64 steps of dense Jacobians' blocks
        (4096, 4096, 1, 8, 16),  # exactly the lowest
        (4096, 4096, 1, 16, 16),  # 8, raised to the lowest
        (2048, 4096, 2, 4, 32),  # blocks of 2: n k floats per step
        (36, 36 * 12, 12, 2, 512),  # blocks of 12: 2^19 / 864 = 606
        (20, 20, 1, 1, 8192),  # 2^19 / 20 = 26214, capped
        (64, 64 * 32, 32, 4, 64),  # blocks of half the carry still keep their structure
    ],
)
def test_on_cpus_structured_maps_are_scanned_in_blocks_of_a_fixed_budget(
    size, element, width, batch, steps
):
    auto = bppsa.Auto(profile=CPU)
    long = CPU.rules.long
    for length in (17, long - 1, long, long + 1, 5 * long):  # T plays no part
        chosen = auto.choose(length, size, "cpu", batch=batch, element=element, width=width)
        assert chosen == sequential_blocks(steps), (length, chosen)
        parallel = auto.choose(
            length, size, "cpu", batch=batch, element=element, width=width, jacobians=True
        )
        assert parallel == chosen


def test_on_cpus_maps_as_wide_as_the_carry_are_dense():
    """``width == n``: products are dense, whatever the element stores."""
    auto = bppsa.Auto(profile=CPU)
    assert auto.choose(4096, 64, "cpu", batch=8, element=64 * 64, width=64) == bppsa.Sequential()
    wide = auto.choose(4096, 64, "cpu", batch=8, element=64 * 64, width=64, jacobians=True)
    assert wide == sequential_blocks(64)  # the dense budget, 2^20 / 32768 = 32, raised to 64
    # Blocks of half the carry keep their structure: the structured budget and lower bound.
    half = auto.choose(4096, 64, "cpu", batch=8, element=64 * 32, width=32)
    assert half == sequential_blocks(32)  # 2^19 / 16384


def test_on_cpus_one_example_outside_vmap_scans_maps_of_two_floats_per_carry_float():
    auto = bppsa.Auto(profile=CPU)
    n = 1024
    # Blocks of 2 store 2 n floats: exactly the profile's single_element per carry float.
    pairs = auto.choose(4096, n, "cpu", element=2 * n, width=2, single=True)
    assert pairs == sequential_blocks(256)  # 2^19 / 2048
    assert auto.choose(4096, n, "cpu", element=n, width=1, single=True) == bppsa.Sequential()
    assert auto.choose(4096, n, "cpu", element=2 * n - 1, width=2, single=True) == (
        bppsa.Sequential()
    )
    assert auto.choose(4096, n, "cpu", element=n, width=1) == sequential_blocks(512)


@pytest.mark.parametrize(
    "length,batch,inputs,dense_products,blocks_of_4",
    [
        # From `long` steps on, maps whose products are dense (a GRU's 4 n floats, say) are
        # scanned up to parallel_state carry floats over the batch.
        (2048, 32, 0, sequential_blocks(64), sequential_blocks(32)),  # 32 x 128: at the limit
        (2047, 32, 0, bppsa.Sequential(), sequential_blocks(32)),  # one step short
        (2048, 33, 0, bppsa.Sequential(), sequential_blocks(16)),  # 4224 carry floats
        (100_000, 32, 0, sequential_blocks(64), sequential_blocks(32)),
        # Shorter scans with inputs: up to 640 carry floats from 256 steps, 1280 from 512.
        (256, 5, 2, sequential_blocks(256), sequential_blocks(128)),  # 640
        (256, 6, 2, bppsa.Sequential(), sequential_blocks(128)),  # 768
        (255, 5, 2, bppsa.Sequential(), sequential_blocks(128)),
        (256, 5, 1, bppsa.Sequential(), sequential_blocks(128)),  # too few inputs
        (512, 10, 2, sequential_blocks(128), sequential_blocks(64)),  # 1280
        (511, 10, 2, bppsa.Sequential(), sequential_blocks(64)),
        (512, 11, 2, bppsa.Sequential(), sequential_blocks(64)),  # 1408
    ],
)
def test_on_cpus_maps_with_dense_products_are_scanned_by_length_and_batch(
    length, batch, inputs, dense_products, blocks_of_4
):
    """``n = 128``, ``4 n`` floats per step (more than parallel_work over the batch); the same
    floats as ``4 x 4`` blocks keep their structure and are scanned at every length."""
    auto = bppsa.Auto(profile=CPU)
    options = dict(batch=batch, element=4 * 128, inputs=inputs)
    assert auto.choose(length, 128, "cpu", **options) == dense_products
    assert auto.choose(length, 128, "cpu", **options, width=4) == blocks_of_4


def block_pairs(params, h, x):  # a user's cell of 2 x 2 blocks over units (2i, 2i + 1)
    pairs = jnp.einsum("gij,gj->gi", params["a"], h.reshape(-1, 2)).reshape(h.shape)
    return jnp.tanh(pairs + params["w"] @ x)


@pytest.mark.parametrize(
    "cell,batch,jacobians,backward",
    [
        (block_pairs, 256, "autodiff, block-diagonal k=2", sequential_blocks(16)),
        (block_pairs, 128, "autodiff, block-diagonal k=2", sequential_blocks(32)),
        (indrnn, 256, "autodiff, diagonal", sequential_blocks(32)),
        (dense_rnn, 256, "autodiff", bppsa.Sequential()),
    ],
    ids=["pairs-256", "pairs-128", "diagonal", "dense"],
)
def test_a_traced_scan_runs_the_pick_for_its_structure_and_batch(cell, batch, jacobians, backward):
    """From the Jacobians the scan finds in the cell: ``n k`` floats per step, blocks of
    ``2^19 / (B n k)`` steps (under 64); dense Jacobians keep back-propagation."""
    hidden, length = 64, CPU.rules.long
    params = {k: jnp.zeros(s.shape, s.dtype) for k, s in shapes(hidden).items()}
    params["a"] = jnp.zeros((hidden // 2, 2, 2))
    xs = jax.ShapeDtypeStruct((batch, length, 8), jnp.float32)

    def loss(params, xs):
        def one(x):
            return bppsa.scan(lambda h, x: (cell(params, h, x), None), jnp.zeros(hidden), x)[0]

        return jax.vmap(one)(xs).sum()

    with bppsa.trace_plans() as plans:
        jax.eval_shape(jax.grad(loss), params, xs)
    (plan,) = plans
    assert (plan.jacobians, plan.length, plan.batch) == (jacobians, length, batch)
    assert plan.method == backward
    if backward != bppsa.Sequential():
        assert plan.backward == backward
