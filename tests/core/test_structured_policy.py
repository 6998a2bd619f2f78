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
    assert chosen.block * 4 * 1024 <= profile.structured_block_work < 2 * chosen.block * 4 * 1024
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
