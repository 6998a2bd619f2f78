"""Backward methods: objects that own how a scan is differentiated, one file each.

A method decides, for a scan's footprint, which concrete backward runs (``concrete``; ``Auto``
is a policy that returns another method), what memory it needs (``memory``) and what it costs
(``cost``), and, for Jacobian methods, carries out the backward (``backward`` and their linear
``scan``). What runs within a memory limit is :func:`~bppsa.scan._core.methods.policy.fit`'s
choice, and :func:`bppsa.scan._core.vjp.differentiable` wires the chosen method into the scan
as a differentiable function.
:class:`Blocked` wraps any Jacobian method to run its backward in time blocks. Adding a method
is adding a file here and a name in :mod:`bppsa.scan._core.methods.resolve` if it takes no
arguments.
"""

from bppsa.scan._core.methods.auto import Auto
from bppsa.scan._core.methods.base import JacobianMethod, Method
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.resolve import FORWARDS, METHODS, resolve, resolve_forward
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.methods.sharded import Sharded

__all__ = [
    "FORWARDS",
    "METHODS",
    "Auto",
    "Blelloch",
    "Blocked",
    "Chunked",
    "JacobianMethod",
    "Method",
    "Sequential",
    "SequentialScan",
    "Sharded",
    "resolve",
    "resolve_forward",
]
