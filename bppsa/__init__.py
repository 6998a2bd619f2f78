"""bppsa: back-propagation as a parallel scan (BPPSA, MLSys 2020) for JAX.

Public API: :func:`scan` (a drop-in for ``jax.lax.scan`` with a parallel backward pass; also the
subpackage of scan algorithms, see :mod:`bppsa.scan`), :func:`grad` and :func:`value_and_grad`
(``jax.grad`` with the backward method chosen in one place), the methods :class:`Blelloch`,
:class:`Blocked`, :class:`Chunked`, :class:`FusedSequential`, :class:`Sequential`,
:class:`SequentialScan` and :class:`Sharded` (subclasses of :class:`Method`) and the policy
:class:`Auto` that chooses among them (a :class:`Policy`), the forward passes :class:`Newton`
(with :class:`NewtonInfo`), :class:`Fused`, :class:`Pipelined` (across devices, with
``Sharded``) and the forward's policy :class:`AutoForward`, the memory guard's
:func:`estimate_memory` and :class:`MemoryLimitError`, :func:`trace_plans` (what each traced
scan decided), :class:`FallbackWarning` (an explicit request that runs by another route), the
measured constants of each backend (:class:`Profile`, made of :class:`Rates`, :class:`Rules`
and :class:`Kernels`, whose :class:`FusedProgram` sizes bound the fused loops;
:func:`get_profile`, :func:`set_profile`) and
:class:`AnalyticJacobianWarning`.
"""

from typing import TYPE_CHECKING

from bppsa import jacobians, models

if TYPE_CHECKING:  # bppsa.scan is the function, with the names of the subpackage bppsa.scan
    from bppsa.scan import _ScanModule

    scan: _ScanModule
else:
    from bppsa.scan import function as scan
from bppsa.jacobians import AnalyticJacobianWarning
from bppsa.scan._core.api import estimate_memory
from bppsa.scan._core.auto_forward import AutoForward
from bppsa.scan._core.fallback import FallbackWarning
from bppsa.scan._core.fused import Fused
from bppsa.scan._core.grad import grad, value_and_grad
from bppsa.scan._core.memory import MemoryLimitError
from bppsa.scan._core.methods import (
    Auto,
    Blelloch,
    Blocked,
    Chunked,
    FusedSequential,
    Method,
    Policy,
    Sequential,
    SequentialScan,
    Sharded,
)
from bppsa.scan._core.methods.sharded import Pipelined
from bppsa.scan._core.newton import Newton, NewtonInfo
from bppsa.scan._core.plans import ScanPlan, trace_plans
from bppsa.scan._core.profiles import get_profile, set_profile
from bppsa.scan._profile import FusedProgram, Kernels, Profile, Rates, Rules

__version__ = "0.1.0"

__all__ = [
    "AnalyticJacobianWarning",
    "Auto",
    "AutoForward",
    "Blelloch",
    "Blocked",
    "Chunked",
    "FallbackWarning",
    "Fused",
    "FusedProgram",
    "FusedSequential",
    "Kernels",
    "MemoryLimitError",
    "Method",
    "Newton",
    "NewtonInfo",
    "Pipelined",
    "Policy",
    "Profile",
    "Rates",
    "Rules",
    "ScanPlan",
    "Sequential",
    "SequentialScan",
    "Sharded",
    "estimate_memory",
    "get_profile",
    "grad",
    "jacobians",
    "models",
    "scan",
    "set_profile",
    "trace_plans",
    "value_and_grad",
]
