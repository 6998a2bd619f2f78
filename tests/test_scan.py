"""bppsa.grad through bppsa.scan equals jax.grad through jax.lax.scan (back-propagation)."""

import jax
import pytest

import bppsa
from bppsa.models import GRU, LSTM, RNN
from tests.helpers import assert_trees_close, cell_loss, cell_problem

CELLS = {"rnn": RNN(), "rnn_relu": RNN("relu"), "gru": GRU(), "lstm": LSTM()}
METHODS = [
    "blelloch",
    bppsa.Chunked(),
    bppsa.Chunked(4),
    bppsa.Sequential(jacobians=True),
    "sequential",
]


def check_cell(cell, method, length, batch, hidden, dtype, where):
    params, xs, heads = cell_problem(cell, length, batch, hidden, dtype)
    expected = jax.jit(jax.grad(cell_loss(cell, jax.lax.scan, where)))(params, xs, heads)
    actual = jax.jit(bppsa.grad(cell_loss(cell, bppsa.scan, where), method=method))(
        params, xs, heads
    )
    assert_trees_close(actual, expected, dtype)


# Both places a cotangent can enter (the final carry; every y_t) over lengths that are not powers
# of two; the slow grid below crosses everything with everything.
LENGTHS_AND_LOSSES = [
    (1, "last"),
    (2, "every"),
    (3, "last"),
    (5, "every"),
    (8, "last"),
    (17, "every"),
    (100, "last"),
    (100, "every"),
]


@pytest.mark.parametrize("length,where", LENGTHS_AND_LOSSES)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_cells_match_back_propagation(cell, length, where, dtype):
    check_cell(CELLS[cell], "blelloch", length, 16, 20, dtype, where)


@pytest.mark.parametrize("length,where", [(1, "last"), (17, "every"), (100, "last")])
@pytest.mark.parametrize("method", [bppsa.Chunked(), bppsa.Chunked(7)], ids=str)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_chunked_matches_back_propagation(cell, method, length, where, dtype):
    check_cell(CELLS[cell], method, length, 16, 20, dtype, where)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_sequential_scan_of_jacobians(cell, dtype):
    check_cell(CELLS[cell], bppsa.Sequential(jacobians=True), 17, 16, 20, dtype, "every")


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden,batch", [(1, 1), (64, 1), (1, 16)])
def test_hidden_and_batch_sizes(cell, hidden, batch, dtype):
    check_cell(CELLS[cell], "blelloch", 17, batch, hidden, dtype, "every")


@pytest.mark.parametrize("length,where", [(17, "every"), (64, "last")])
@pytest.mark.parametrize("method", [bppsa.Chunked(1, block=16), bppsa.Chunked(3, block=7)], ids=str)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_time_blocks_match_back_propagation(cell, method, length, where, dtype):
    """Blocks that divide T and that do not (a shorter first block)."""
    check_cell(CELLS[cell], method, length, 4, 8, dtype, where)


@pytest.mark.parametrize("method", ["blelloch", "chunked", "auto"])
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_long_sequences(cell, method, dtype):
    check_cell(CELLS[cell], method, 1000, 16, 20, dtype, "last")


def test_plain_sequential_is_lax_scan(dtype):
    check_cell(RNN(), "sequential", 17, 4, 8, dtype, "every")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["last", "every"])
@pytest.mark.parametrize("length", [1, 2, 3, 5, 8, 17, 100, 1000])
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("hidden", [1, 20, 64])
@pytest.mark.parametrize("method", METHODS, ids=str)
@pytest.mark.parametrize("cell", CELLS)
def test_exhaustive_grid(cell, method, hidden, batch, length, where, dtype):
    check_cell(CELLS[cell], method, length, batch, hidden, dtype, where)
