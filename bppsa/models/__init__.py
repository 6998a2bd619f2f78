"""Cells, layers and networks as pure functions over parameter pytrees (PyTorch's layout)."""

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
from bppsa.models._chain import Chain
from bppsa.models._classifier import SequenceClassifier
from bppsa.models._diagonal_cells import (
    CIFGLSTM,
    DiagonalGRU,
    IndRNN,
    cifg_lstm_cell,
    diagonal_gru_cell,
    indrnn_cell,
)
from bppsa.models._language_model import LanguageModel
from bppsa.models._layers import Conv2d, Flatten, Layer, Linear, MaxPool2d, ReLU
from bppsa.models._pruning import Sparsity, magnitude_prune, sparsity_of
from bppsa.models._vgg import vgg11

__all__ = [
    "CIFGLSTM",
    "GRU",
    "LSTM",
    "RNN",
    "Cell",
    "Chain",
    "Conv2d",
    "DiagonalGRU",
    "Flatten",
    "IndRNN",
    "LanguageModel",
    "Layer",
    "Linear",
    "MaxPool2d",
    "ReLU",
    "SequenceClassifier",
    "Sparsity",
    "cifg_lstm_cell",
    "diagonal_gru_cell",
    "gru_cell",
    "indrnn_cell",
    "init_params",
    "lstm_cell",
    "magnitude_prune",
    "rnn_cell",
    "sparsity_of",
    "vgg11",
]
