"""``bppsa.scan``: the function, and the subpackage of scan algorithms behind it.

``bppsa.scan(f, init, xs, ...)`` is the drop-in for ``jax.lax.scan`` (its signature and
docstring are those of :func:`bppsa.scan._core.api.scan`). The subpackage holds
what the scans are written against, which knows elements and an operator and nothing about
recurrent cells:

* elements: :class:`MapStack` (the interface), :class:`Dense`, :class:`Structured`,
  :class:`Diagonal`, :class:`BlockDiagonal` (with :func:`block_grouping`), and
  :class:`Sparse` (a static :class:`Pattern` with traced values; its products with
  :func:`product_plan`'s report and :func:`compose`);
* algorithms: :func:`combine` (the one operator), :func:`sequential`, :func:`blelloch`,
  :func:`chunked`, :func:`aggregate` (a whole stack composed into one map), and over chains
  of maps that differ in shape (layers): :func:`chain_scan`, with :func:`chain_plan` and
  :func:`chain_memory` (every product it forms, without running it);
* the backward methods, re-exported: :class:`Auto`, :class:`Blelloch`, :class:`Blocked`,
  :class:`Chunked`, :class:`FusedSequential`, :class:`Sequential`, :class:`SequentialScan`,
  :class:`Sharded`,
  :class:`Method`, the policies :class:`CostModel` and :class:`MeasuredRules` that ``Auto``
  chooses by, and :func:`resolve` for names.

So ``import bppsa.scan as s; s.Blelloch`` and ``from bppsa.scan import Blelloch`` both work,
and ``s(f, init, xs)`` scans: the attribute ``bppsa.scan`` of the package is the function,
whose attributes are this module's namespace (:data:`function`), so that ``help(bppsa.scan)``
shows the function; this module (``sys.modules["bppsa.scan"]``) can be called as well.
"""

import inspect as _inspect
import sys as _sys
import types as _types

from bppsa.scan._algorithms import aggregate, apply, blelloch, combine, sequential
from bppsa.scan._blocks import BlockDiagonal, block_grouping
from bppsa.scan._chain import ChainRow, chain_memory, chain_plan, chain_scan
from bppsa.scan._chunked import chunked, default_chunks
from bppsa.scan._core.api import scan as _scan
from bppsa.scan._core.methods import (
    METHODS,
    Auto,
    Blelloch,
    Blocked,
    Chunked,
    CostModel,
    FusedSequential,
    MeasuredRules,
    Method,
    Policy,
    Sequential,
    SequentialScan,
    Sharded,
    Supports,
    resolve,
)
from bppsa.scan._elements import Dense, Diagonal, MapStack, Structured, concat
from bppsa.scan._sparse import Pattern, ProductPlan, Sparse, compose, product_plan

__all__ = [
    "METHODS",
    "Auto",
    "Blelloch",
    "BlockDiagonal",
    "Blocked",
    "ChainRow",
    "Chunked",
    "CostModel",
    "Dense",
    "Diagonal",
    "FusedSequential",
    "MapStack",
    "MeasuredRules",
    "Method",
    "Pattern",
    "Policy",
    "ProductPlan",
    "Sequential",
    "SequentialScan",
    "Sharded",
    "Sparse",
    "Structured",
    "Supports",
    "aggregate",
    "apply",
    "blelloch",
    "block_grouping",
    "chain_memory",
    "chain_plan",
    "chain_scan",
    "chunked",
    "combine",
    "compose",
    "concat",
    "default_chunks",
    "product_plan",
    "resolve",
    "sequential",
]


class _ScanModule(_types.ModuleType):
    """The module ``bppsa.scan``, callable as the function ``bppsa.scan``.

    To type checkers (``bppsa/__init__.py`` declares ``scan`` with this type), this class is
    what ``bppsa.scan`` is: the function's signature, and the names of ``__all__``, which it
    lists again as class attributes (functions as static methods; ``tests/test_public_api.py``
    keeps the two lists equal).
    """

    __call__ = staticmethod(_scan)

    METHODS = METHODS
    Auto = Auto
    Blelloch = Blelloch
    BlockDiagonal = BlockDiagonal
    Blocked = Blocked
    ChainRow = ChainRow
    Chunked = Chunked
    CostModel = CostModel
    Dense = Dense
    Diagonal = Diagonal
    FusedSequential = FusedSequential
    MapStack = MapStack
    MeasuredRules = MeasuredRules
    Method = Method
    Pattern = Pattern
    Policy = Policy
    ProductPlan = ProductPlan
    Sequential = Sequential
    SequentialScan = SequentialScan
    Sharded = Sharded
    Sparse = Sparse
    Structured = Structured
    Supports = Supports
    aggregate = staticmethod(aggregate)
    apply = staticmethod(apply)
    blelloch = staticmethod(blelloch)
    block_grouping = staticmethod(block_grouping)
    chain_memory = staticmethod(chain_memory)
    chain_plan = staticmethod(chain_plan)
    chain_scan = staticmethod(chain_scan)
    chunked = staticmethod(chunked)
    combine = staticmethod(combine)
    compose = staticmethod(compose)
    concat = staticmethod(concat)
    default_chunks = staticmethod(default_chunks)
    product_plan = staticmethod(product_plan)
    resolve = staticmethod(resolve)
    sequential = staticmethod(sequential)


__signature__ = _inspect.signature(_scan)
_sys.modules[__name__].__class__ = _ScanModule


# A copy of the function (its code, defaults and docstring: no frame of its own in tracebacks)
function = _types.FunctionType(
    _scan.__code__, _scan.__globals__, _scan.__name__, _scan.__defaults__, _scan.__closure__
)
function.__kwdefaults__ = _scan.__kwdefaults__
function.__doc__, function.__annotations__ = _scan.__doc__, _scan.__annotations__
function.__qualname__, function.__module__ = _scan.__qualname__, __name__


# What ``bppsa.scan`` is: the function (so that ``help`` and ``pydoc`` document it, which they
# never do for a module) whose attributes are this subpackage's namespace itself, the same dict:
# its public names, its private modules, and the submodules imported later.
function.__dict__ = globals()
