"""The TF32 emulation benchmark: it rounds what it says, its patch of bppsa's products takes
effect and is undone, and its result file has the fields the report reads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import _tf32
from benchmarks import tf32_emulation as tf32e
from bppsa.models import GRU, RNN
from bppsa.scan import _precision
from paper_figures.result_files.files import read_json


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf32") / "tf32.json"
    argv = ["--lengths", "9", "--batch", "2", "--cells", "rnn", "--no-h200"]
    originals = _precision.matmul, _precision.einsum
    payload = tf32e.main(argv, out=out)
    return payload, read_json(out), originals


def test_rounding_keeps_10_mantissa_bits_of_float32_only():
    x = jnp.float32(1 + 2**-10 + 2**-12)
    assert _tf32.tf32(x) == jnp.float32(1 + 2**-10)
    with jax.enable_x64(True):
        y = jnp.asarray(1 + 2**-12, jnp.float64)
        assert _tf32.tf32(y) == y


def test_the_cells_products_round_their_cotangent_before_the_transposes():
    a, b = jnp.ones((1, 2)), jnp.ones((2, 1))
    g = jnp.full((1, 1), 1 + 2**-12, jnp.float32)  # rounded to 1 by TF32
    grad_a = jax.vjp(lambda a: _tf32.user_matmul(a, b, rounded=True), a)[1](g)[0]
    np.testing.assert_array_equal(grad_a, jnp.ones((1, 2)))
    exact = jax.vjp(lambda a: _tf32.user_matmul(a, b, rounded=False), a)[1](g)[0]
    np.testing.assert_array_equal(exact, g @ b.T)


@pytest.mark.parametrize("kind, cell", [("rnn", RNN()), ("gru", GRU())])
def test_unrounded_cells_are_the_librarys(kind, cell):
    params = cell.init(3, 5, key=jax.random.key(0))
    h, x = jax.random.normal(jax.random.key(1), (2, 5)), jnp.ones((2, 3))
    emulated = _tf32.EmulatedCell(kind)
    np.testing.assert_allclose(emulated(params, h, x), cell(params, h, x), rtol=1e-6)
    rounded = _tf32.EmulatedCell(kind, rounded=True)(params, h, x)
    assert 0 < float(jnp.max(jnp.abs(rounded - cell(params, h, x)))) < 1e-2


def test_add_toward_zero_truncates_where_to_nearest_rounds_away():
    one, tiny = jnp.float32(1), jnp.float32(2**-24 + 2**-30)  # 1 + tiny rounds up to nearest
    assert one + tiny == jnp.nextafter(one, jnp.float32(2))
    add = jax.jit(_tf32.add_toward_zero)
    assert add(one, tiny) == one
    assert add(-one, -tiny) == -one
    assert add(one, jnp.float32(2**-23)) == one + jnp.float32(2**-23)  # exact sums stay


def test_accumulating_bp_with_plain_adds_is_bp():
    cell = _tf32.EmulatedCell("gru")
    params, xs = tf32e.h200_problem("gru", 7, 3)
    bp = jax.grad(lambda p: tf32e.h200_loss(cell, jax.lax.scan, p, xs))(params)
    written_out = tf32e.accumulating_bp(cell, params, xs)
    assert tf32e.frobenius(written_out, bp) < 1e-6


def test_library_tf32_makes_bppsas_error_larger_and_bp_unchanged(run):
    payload, _, _ = run
    settings = payload["rows"][0]["settings"]
    none, library = settings["none"]["end_to_end"], settings["library"]["end_to_end"]
    assert library["blelloch"]["median"] > 10 * none["blelloch"]["median"]
    assert library["bp"] == none["bp"]  # BP forms no product of bppsa's


def test_the_patch_is_undone(run):
    _, _, originals = run
    assert (_precision.matmul, _precision.einsum) == originals
    with _tf32.library_tf32():
        assert _precision.matmul is not originals[0]
    assert (_precision.matmul, _precision.einsum) == originals


def test_the_result_file_has_the_fields(run):
    _, saved, _ = run
    for field in ("jax", "machine", "command", "settings", "methods", "emulation", "rows"):
        assert field in saved
    assert set(saved["settings"]) == {"none", "cell", "library", "both"}
    row = saved["rows"][0]
    assert (row["cell"], row["length"], row["batch"]) == ("rnn", 9, 2)
    for result in row["settings"].values():
        for key in ("end_to_end", "backward_only", "vs_bp_end_to_end", "vs_bp_backward_only"):
            assert {"median", "max", "nonfinite"} <= set(next(iter(result[key].values())))
