"""Scan algorithms over stacks of (transposed-Jacobian) linear maps; nothing here knows RNNs."""

from bppsa.scan._algorithms import blelloch, combine, sequential
from bppsa.scan._elements import Dense, Linear, Structured
from bppsa.scan._methods import METHODS, Blelloch, Method, Sequential, ambient, resolve

__all__ = [
    "METHODS",
    "Blelloch",
    "Dense",
    "Linear",
    "Method",
    "Sequential",
    "Structured",
    "ambient",
    "blelloch",
    "combine",
    "resolve",
    "sequential",
]
