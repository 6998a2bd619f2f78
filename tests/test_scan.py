"""bppsa.grad through bppsa.scan equals jax.grad through jax.lax.scan (back-propagation).

Every check differentiates in the parameters, the inputs ``xs`` and a non-zero initial state,
and asserts the path it exercised: the concrete method that ran (forward and backward) and that
the cells' analytic Jacobians were used.
"""

import jax
import pytest

import bppsa
from bppsa.models import GRU, LSTM, RNN
from bppsa.scan import resolve
from tests.helpers import assert_path, assert_trees_close, cell_loss, cell_problem, spread

CELLS = {"rnn": RNN(), "rnn_relu": RNN("relu"), "gru": GRU(), "lstm": LSTM()}
METHODS = [
    "blelloch",
    bppsa.Chunked(),
    bppsa.Chunked(4),
    bppsa.SequentialScan(),
    "sequential",
]


# Floats one step's analytic Jacobian keeps per example (what Auto() weighs): the RNN's
# W^T diag(d) keeps d, the GRU's three gate scales and diag(z), the LSTM's a dense (2H, 2H).
JACOBIAN_FLOATS = {"rnn": lambda h: h, "gru": lambda h: 4 * h, "lstm": lambda h: 4 * h * h}
ARGNUMS = (0, 1, 3)  # params, xs, init


def check_cell(cell, method, length, batch, hidden, dtype, where, runs=None):
    """``runs``: the concrete method expected to run (default: ``method`` itself)."""
    params, xs, heads, init = cell_problem(cell, length, batch, hidden, dtype)
    args = (params, xs, heads, init)
    expected = jax.jit(jax.grad(cell_loss(cell, jax.lax.scan, where), argnums=ARGNUMS))(*args)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(
            bppsa.grad(cell_loss(cell, bppsa.scan, where), argnums=ARGNUMS, method=method)
        )(*args)
    assert_path(plans, resolve(method) if runs is None else runs)
    assert_trees_close(actual, expected, dtype)


# Both places a cotangent can enter (the final carry; every y_t) over lengths that are not powers
# of two; the slow grid below crosses everything with everything. The default suite runs a
# covering part of each product of cases (tests.helpers.spread), ``-m slow`` all of it.
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


@pytest.mark.parametrize("length,where,cell", spread(LENGTHS_AND_LOSSES, ["rnn", "gru", "lstm"]))
def test_cells_match_back_propagation(cell, length, where, dtype):
    check_cell(CELLS[cell], "blelloch", length, 16, 20, dtype, where)


@pytest.mark.parametrize(
    "cell,method,length,where",
    spread(
        ["rnn", "gru", "lstm"],
        [bppsa.Chunked(), bppsa.Chunked(7)],
        [(1, "last"), (17, "every"), (100, "last")],
        crossed=2,
    ),
)
def test_chunked_matches_back_propagation(cell, method, length, where, dtype):
    check_cell(CELLS[cell], method, length, 16, 20, dtype, where)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_sequential_scan_of_jacobians(cell, dtype):
    check_cell(CELLS[cell], bppsa.SequentialScan(), 17, 16, 20, dtype, "every")


@pytest.mark.parametrize("cell,hidden,batch", spread(list(CELLS), [(1, 1), (64, 1), (1, 16)]))
def test_hidden_and_batch_sizes(cell, hidden, batch, dtype):
    check_cell(CELLS[cell], "blelloch", 17, batch, hidden, dtype, "every")


@pytest.mark.parametrize(
    "method,length,where,cell",
    spread(
        [bppsa.Blocked(bppsa.Chunked(1), 16), bppsa.Blocked(bppsa.Chunked(3), 7)],
        [(17, "every"), (64, "last")],
        ["rnn", "gru", "lstm"],
        crossed=2,
    ),
)
def test_time_blocks_match_back_propagation(cell, method, length, where, dtype):
    """Blocks that divide T and that do not (a shorter first block)."""
    check_cell(CELLS[cell], method, length, 4, 8, dtype, where)


@pytest.mark.parametrize("cell,method", spread(["rnn", "gru", "lstm"], ["blelloch", "chunked"]))
def test_long_sequences(cell, method, dtype):
    check_cell(CELLS[cell], method, 1000, 16, 20, dtype, "last")


# Batches and sizes at which Auto() keeps a Jacobian method on every backend (on CPUs it runs
# plain back-propagation above 4096 carry floats per step over the batch for structured
# Jacobians, above 1024 Jacobian floats for dense ones).
AUTO_CASES = {"rnn": (16, 20), "gru": (4, 20), "lstm": (2, 10)}


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_long_sequences_with_auto(cell, dtype):
    batch, hidden = AUTO_CASES[cell]
    element = JACOBIAN_FLOATS[cell](hidden)
    runs = bppsa.Auto().choose(1000, hidden, batch=batch, element=element)
    assert runs.keeps_carries  # else this would compare lax.scan with itself
    check_cell(CELLS[cell], "auto", 1000, batch, hidden, dtype, "last", runs=runs)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_auto_back_propagates_where_it_says(cell):
    """Large batches: Auto() runs what choose() says (plain BP on CPUs), still BP's gradients."""
    batch, hidden = {"gru": 256, "lstm": 16}[cell], 20
    element = JACOBIAN_FLOATS[cell](hidden)
    runs = bppsa.Auto().choose(100, hidden, batch=batch, element=element)
    assert not runs.keeps_carries
    check_cell(CELLS[cell], "auto", 100, batch, hidden, "float32", "every", runs=runs)


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
