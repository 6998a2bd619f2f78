"""Cells and networks as pure functions over parameter pytrees (PyTorch's layout)."""

from bppsa.models._cells import (
    GRU,
    LSTM,
    RNN,
    Cell,
    gru_cell,
    init_params,
    lstm_cell,
    rnn_cell,
)
from bppsa.models._classifier import SequenceClassifier

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "Cell",
    "SequenceClassifier",
    "gru_cell",
    "init_params",
    "lstm_cell",
    "rnn_cell",
]
