"""Builders of transposed Jacobians: dense and structured for the recurrent cells, sparse with
static patterns for the layers of feed-forward networks.

Your own cell gets an analytic Jacobian the same way the cells of :mod:`bppsa.models` do: decorate
it with :func:`transposed_jacobian` and a builder that returns one step's ``J^T`` as a
:class:`bppsa.scan.Dense` matrix or a :class:`bppsa.scan.Structured` map
(``u @ diag(d) @ [I; ...; I] + diag(e)``); :func:`has_analytic_jacobian` says whether a scan's
body will use it, and :class:`AnalyticJacobianWarning` why one was not used.
"""

from bppsa.jacobians._cells import gru_jacobian_t, lstm_jacobian_t, rnn_jacobian_t
from bppsa.jacobians._diagonal_cells import (
    cifg_lstm_jacobian_t,
    diagonal_gru_jacobian_t,
    indrnn_jacobian_t,
)
from bppsa.jacobians._layers import (
    conv2d_jacobian_t,
    identity_jacobian_t,
    linear_jacobian_t,
    maxpool2d_jacobian_t,
    relu_jacobian_t,
    sparsity,
)
from bppsa.scan._core.body import has_analytic_jacobian
from bppsa.scan._core.capture import AnalyticJacobianWarning, transposed_jacobian

__all__ = [
    "AnalyticJacobianWarning",
    "cifg_lstm_jacobian_t",
    "conv2d_jacobian_t",
    "diagonal_gru_jacobian_t",
    "gru_jacobian_t",
    "has_analytic_jacobian",
    "identity_jacobian_t",
    "indrnn_jacobian_t",
    "linear_jacobian_t",
    "lstm_jacobian_t",
    "maxpool2d_jacobian_t",
    "relu_jacobian_t",
    "rnn_jacobian_t",
    "sparsity",
    "transposed_jacobian",
]
