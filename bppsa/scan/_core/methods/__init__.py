"""Backward methods and the policies that choose them, one file each.

A method (:class:`Method`) is its linear ``scan`` over the steps' transposed Jacobians, its
``memory`` and its ``cost``, and declares what it supports (:class:`Supports`); plain
back-propagation (:class:`Sequential`) is the one method that scans no Jacobians. A policy
(:class:`Policy`; ``Auto`` is the library's, by :class:`CostModel` or :class:`MeasuredRules`
as the profile says) chooses the method of each scan and chain of
layers, within a memory limit (:mod:`~bppsa.scan._core.methods.policy`), and
:func:`bppsa.scan._core.vjp.differentiable` wires the chosen method into the scan as a
differentiable function. :class:`Blocked` runs any Jacobian method's backward in time blocks,
:class:`Sharded` across devices. Adding a method is adding a file here and its class to the
exports and the names below.
"""

from bppsa.scan._core.methods.auto import Auto, CostModel, MeasuredRules
from bppsa.scan._core.methods.base import Method, Supports, require
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.fused_sequential import FusedSequential
from bppsa.scan._core.methods.policy import Fixed, Policy, as_policy
from bppsa.scan._core.methods.resolve import METHODS, names, resolve
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.methods.sharded import Sharded

METHODS.update(
    names(Auto, Blelloch, Blocked, Chunked, FusedSequential, Sequential, SequentialScan, Sharded)
)

__all__ = [
    "METHODS",
    "Auto",
    "Blelloch",
    "Blocked",
    "Chunked",
    "CostModel",
    "Fixed",
    "FusedSequential",
    "MeasuredRules",
    "Method",
    "Policy",
    "Sequential",
    "SequentialScan",
    "Sharded",
    "Supports",
    "as_policy",
    "require",
    "resolve",
]
