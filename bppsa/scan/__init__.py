"""Scan algorithms over stacks of (transposed-Jacobian) linear maps; nothing here knows RNNs."""

from bppsa.scan._algorithms import blelloch, combine, sequential
from bppsa.scan._chunked import chunked
from bppsa.scan._elements import Dense, Linear, Structured
from bppsa.scan._methods import METHODS, Blelloch, Chunked, Method, Sequential, ambient, resolve

__all__ = [
    "METHODS",
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
    "resolve",
    "sequential",
]
