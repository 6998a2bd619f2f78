"""Scan algorithms over stacks of (transposed-Jacobian) linear maps; nothing here knows RNNs."""

from bppsa.scan._algorithms import blelloch, combine, sequential
from bppsa.scan._chunked import chunked, default_chunks
from bppsa.scan._elements import Dense, Linear, Structured
from bppsa.scan._methods import (
    METHODS,
    Auto,
    Blelloch,
    Chunked,
    Method,
    Sequential,
    ambient,
    resolve,
)

__all__ = [
    "METHODS",
    "Auto",
    "Blelloch",
    "Chunked",
    "Dense",
    "Linear",
    "Method",
    "Sequential",
    "Structured",
    "ambient",
    "blelloch",
    "chunked",
    "combine",
    "default_chunks",
    "resolve",
    "sequential",
]
