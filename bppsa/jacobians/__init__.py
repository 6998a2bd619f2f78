"""Builders of transposed Jacobians (dense and structured) for the recurrent cells."""

from bppsa._core.body import has_analytic_jacobian
from bppsa._core.capture import AnalyticJacobianWarning, transposed_jacobian
from bppsa.jacobians._cells import gru_jacobian_t, lstm_jacobian_t, rnn_jacobian_t

__all__ = [
    "AnalyticJacobianWarning",
    "gru_jacobian_t",
    "has_analytic_jacobian",
    "lstm_jacobian_t",
    "rnn_jacobian_t",
    "transposed_jacobian",
]
