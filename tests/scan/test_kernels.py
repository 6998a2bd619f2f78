"""The kernels' switches reach them through a context, never by reading a profile while they are
traced: the switches in force change the structured and sparse kernels (their values unchanged
against dense references), the default is the built-in ``Kernels()``, and a profile's parts
refuse bad values by name."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa.scan import Structured, _kernels, _precision, _profile, _spgemm, sequential
from bppsa.scan._core import profiles
from bppsa.scan._pattern import Pattern
from bppsa.scan._sparse import Sparse

# Normwise relative error max|a - b| / max|b| in float64 (x64), as tests/scan/test_sparse.py:
# sums of a few terms stay near 1e-15, a wrong entry or transposed operand errs by order 1.
TOL = 1e-12


def assert_close(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    error = np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30)
    assert error <= TOL, error


def structured(rng, n, reps=1, rows=(1,), m=3):
    return Structured(
        u=jnp.asarray(rng.normal(size=(n, reps * n))),
        d=jnp.asarray(rng.normal(size=(m, *rows, reps * n))),
        e=jnp.asarray(rng.normal(size=(m, *rows, n))),
        reps=reps,
    )


def sparse(rng, shape, density, m=1, batch=()):
    mask = rng.random(shape) < density
    mask[0, :] = False  # an empty row
    pattern = Pattern.from_coo(*np.nonzero(mask), shape)[0]
    return Sparse(jnp.asarray(rng.normal(size=(m, *batch, pattern.nnz))), pattern)


def test_the_library_context_sets_the_precision_and_the_kernels():
    precision, kernels = _precision.canonical("default"), bppsa.Kernels(small_unroll=3)
    with _kernels.library(precision, kernels):
        assert (_precision.current(), _kernels.current()) == (precision, kernels)
    assert (_precision.current(), _kernels.current()) == (_precision.HIGHEST, bppsa.Kernels())


# -- (a) the structured kernels --------------------------------------------------------------


def test_the_default_switches_are_the_built_in_ones():
    assert _kernels.current() == bppsa.Kernels()
    with _kernels.using(bppsa.Kernels(small_unroll=9)):
        with _kernels.using(None):
            assert _kernels.current() == bppsa.Kernels()
        assert _kernels.current().small_unroll == 9
    assert _kernels.current() == bppsa.Kernels()


def test_a_context_changes_the_unrolling_of_a_sequential_scan():
    rng = np.random.default_rng(0)
    small = structured(rng, 4)  # one row of 4 floats: small
    tiled = structured(rng, 4, reps=3)
    assert small.sequential_unroll((1, 4)) == 4  # today's small_unroll
    assert tiled.sequential_unroll((1, 4)) == 2  # today's tiled_one_row_unroll
    with _kernels.using(bppsa.Kernels(small_unroll=7, tiled_one_row_unroll=3)):
        assert small.sequential_unroll((1, 4)) == 7
        assert tiled.sequential_unroll((1, 4)) == 3
    with _kernels.using(bppsa.Kernels(small_unroll_rows=0)):
        assert small.sequential_unroll((1, 4)) == 1
    assert small.sequential_unroll((1, 4)) == 4  # the context is left


def traced_unroll(g_last, maps) -> int:
    # A new function each time: JAX caches a trace by the function (the context is no part of
    # its key, which is why the scan's derivative rules are keyed by the method's profile).
    jaxpr = jax.make_jaxpr(lambda g, maps: sequential(g, maps, None))(g_last, maps)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    return eqn.params["unroll"]


def test_a_sequential_scan_traced_in_a_context_unrolls_by_it(x64):
    rng = np.random.default_rng(1)
    maps = structured(rng, 4, m=10)
    g_last = jnp.asarray(rng.normal(size=(1, 4)))
    expected = sequential(g_last, maps.to_dense(), None)
    assert traced_unroll(g_last, maps) == 4
    with _kernels.using(bppsa.Kernels(small_unroll=5)):
        assert traced_unroll(g_last, maps) == 5
        assert_close(sequential(g_last, maps, None), expected)


@pytest.mark.parametrize(
    "kernels,dot,folded",
    [
        (bppsa.Kernels(), False, False),  # 3 maps x 2 rows of 4 floats: a multiply-and-sum
        (bppsa.Kernels(small_rows=5), True, True),  # too many rows now: the diagonal folded in
        (bppsa.Kernels(small_rows=5, folded_diagonal_rows=(7, 16)), True, False),  # apart
    ],
    ids=["small", "folded", "apart"],
)
def test_a_context_switches_the_structured_product_not_its_values(kernels, dot, folded, x64):
    rng = np.random.default_rng(2)
    maps = structured(rng, 4, rows=(2,))
    v = jnp.asarray(rng.normal(size=(3, 2, 4)))
    with _kernels.using(kernels):
        text = str(jax.make_jaxpr(lambda v: maps.apply(v))(v))
        actual = maps.apply(v)
    assert ("dot_general" in text) == dot
    assert ("concatenate" in text) == folded
    assert_close(actual, maps.to_dense().apply(v))


# -- (b) the SpMV ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [(), (3,)])
def test_a_context_chooses_the_spmv_and_both_match_dense(batch, x64):
    rng = np.random.default_rng(3)
    maps = sparse(rng, (7, 5), 0.4, m=2, batch=batch)
    v = jnp.asarray(rng.normal(size=(2, *batch, 5)))
    expected = maps.to_dense().apply(v)
    texts = {}
    for method in ("padded", "segment"):
        with _kernels.using(bppsa.Kernels(spmv_method=method)):
            texts[method] = str(jax.make_jaxpr(lambda v: maps.apply(v))(v))
            assert_close(maps.apply(v), expected)
            assert_close(maps.apply_to_rows(v[..., None, :])[..., 0, :], expected)
    assert "scatter-add" in texts["segment"] and "scatter-add" not in texts["padded"]
    default = str(jax.make_jaxpr(lambda v: maps.apply(v))(v))
    assert default == texts[bppsa.Kernels().spmv_method]


# -- (c) the SpGEMM's thresholds -------------------------------------------------------------


def test_the_spgemm_thresholds_are_those_in_force():
    defaults = bppsa.Kernels()
    assert _spgemm.thresholds() == (
        defaults.densify_density,
        defaults.densify_pair_ratio,
        defaults.spgemm_method,
    )
    kernels = bppsa.Kernels(densify_density=0.0, densify_pair_ratio=1.0, spgemm_method="padded")
    with _kernels.using(kernels):
        assert _spgemm.thresholds() == (0.0, 1.0, "padded")
        assert _spgemm.thresholds(density=0.5) == (0.5, 1.0, "padded")  # given ones first


def test_a_product_is_planned_by_the_switches_in_force(x64):
    # Sparse operands whose product is sparse by the defaults: dense above a density of 0.
    rng = np.random.default_rng(4)
    later, earlier = sparse(rng, (30, 30), 0.03), sparse(rng, (30, 30), 0.03)
    expected = later.then(earlier).to_dense().a
    assert later.plan(earlier).format == "sparse"
    with _kernels.using(bppsa.Kernels(densify_density=0.0)):
        assert later.plan(earlier).format == "dense"  # not the cached plan of the defaults
        product = later.then(earlier)
    assert isinstance(product, bppsa.scan.Dense)
    assert_close(product.a, expected)
    assert later.plan(earlier).format == "sparse"


# -- (d) no profile is read while the kernels are traced -------------------------------------


@pytest.fixture
def no_profile(monkeypatch):
    """Every ``get_profile`` and ``profile_of`` of bppsa's modules raises."""
    originals = (profiles.get_profile, profiles.profile_of)

    def refuse(*args, **kwargs):
        raise AssertionError("get_profile called while tracing a kernel")

    for name, module in list(sys.modules.items()):
        for original in originals:
            attribute = original.__name__
            if name.startswith("bppsa") and getattr(module, attribute, None) is original:
                monkeypatch.setattr(module, attribute, refuse)
    with pytest.raises(AssertionError, match="get_profile called"):
        bppsa.get_profile()  # the fixture itself works


def test_tracing_the_kernels_reads_no_profile(no_profile):
    rng = np.random.default_rng(5)
    for reps, rows in ((1, (1,)), (1, (2,)), (3, (1,)), (1, (20,))):
        maps = structured(rng, 4, reps=reps, rows=rows, m=5)
        g = jnp.ones((*rows, 4))
        jax.make_jaxpr(maps.apply)(jnp.ones((5, *rows, 4)))
        jax.make_jaxpr(lambda g, maps: sequential(g, maps, None))(g, maps)
    later, earlier = sparse(rng, (9, 9), 0.3), sparse(rng, (9, 9), 0.3)
    jax.make_jaxpr(later.apply)(jnp.ones((1, 9)))
    jax.make_jaxpr(later.apply_to_rows)(jnp.ones((1, 2, 9)))
    jax.make_jaxpr(lambda a, b: a.then(b))(later, earlier)
    _spgemm.product_plan(later.pattern, earlier.pattern)


# -- (e) a profile's parts refuse bad values by name -----------------------------------------


RATES = bppsa.Rates(flops=1e12, bandwidth=1e11, step_latency=1e-5)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: bppsa.Rates(0.0, 1.0, 1.0), "Rates: flops must be a positive number"),
        (lambda: bppsa.Rates(1.0, -1.0, 1.0), "Rates: bandwidth must be a positive number"),
        (lambda: bppsa.Rates(1.0, 1.0, True), "Rates: step_latency must be a positive number"),
        (lambda: bppsa.Rules(block_work=-1), "Rules: block_work must be a non-negative integer"),
        (lambda: bppsa.Rules(fallback_block=0), "Rules: fallback_block must be a positive"),
        (lambda: bppsa.Rules(single_element="2"), "Rules: single_element must be a non-neg"),
        (lambda: bppsa.Rules(block_steps=(64, 8)), r"Rules: block_steps must be a pair"),
        (lambda: bppsa.Rules(structured_block_steps=(0, 8)), "Rules: structured_block_steps"),
        (lambda: bppsa.Rules(inputs_state=640), "Rules: inputs_state must be a pair"),
        (lambda: bppsa.Kernels(small_unroll=0), "Kernels: small_unroll must be a positive"),
        (lambda: bppsa.Kernels(small_rows=-1), "Kernels: small_rows must be a non-negative"),
        (lambda: bppsa.Kernels(densify_density=-0.1), "Kernels: densify_density must be"),
        (lambda: bppsa.Kernels(folded_diagonal_rows=(16, 2)), "Kernels: folded_diagonal_rows"),
        (lambda: bppsa.Kernels(spgemm_method="dense"), "Kernels: spgemm_method must be 'auto'"),
        (lambda: bppsa.Kernels(spmv_method="bucketed"), "Kernels: spmv_method must be 'padded'"),
    ],
)
def test_bad_values_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "arguments,match",
    [
        (dict(name=1, rates=RATES), r"Profile: name must be a str, got int"),
        (dict(name="x", rates=(1e12, 1e11, 1e-5)), r"Profile: rates must be a bppsa\.Rates"),
        (dict(name="x", rates=RATES, measured_rules=1), r"Profile: measured_rules must be a bool"),
        (dict(name="x", rates=RATES, rules=bppsa.Kernels()), r"Profile: rules must be a bppsa\.R"),
        (dict(name="x", rates=RATES, kernels=bppsa.Rules()), r"Profile: kernels must be a bppsa"),
    ],
)
def test_a_profile_refuses_parts_of_the_wrong_type(arguments, match):
    with pytest.raises(TypeError, match=match):
        bppsa.Profile(**arguments)


def test_a_context_refuses_anything_but_kernels():
    refused = r"kernels must be a bppsa\.Kernels or None, got Profile"
    with pytest.raises(TypeError, match=refused), _kernels.using(bppsa.get_profile("cpu")):
        pass
    assert _kernels.current() == bppsa.Kernels()


def test_profiles_are_hashable_and_keep_the_measured_numbers():
    cpu, gpu = _profile.CPU, _profile.GPU
    assert cpu.rates == bppsa.Rates(flops=31.2e9, bandwidth=84.0e9, step_latency=41.2e-9)
    assert cpu.measured_rules and not gpu.measured_rules
    assert cpu.rules == gpu.rules == bppsa.Rules()
    # The GPU keeps the CPU's kernels, but for the kernel lab's estimates of a fused step.
    assert cpu.kernels == bppsa.Kernels()
    assert gpu.kernels == dataclasses.replace(cpu.kernels, fused_programs=_profile.SM90_PROGRAMS)
    assert [dataclasses.replace(p, step_latency=None) for p in gpu.kernels.fused_programs] == list(
        cpu.kernels.fused_programs
    )
    assert len({cpu, gpu, bppsa.Profile(cpu.name, cpu.rates, measured_rules=True)}) == 2
