"""bppsa: back-propagation as a parallel scan (BPPSA, MLSys 2020) for JAX.

Public API: :func:`scan` (a drop-in for ``jax.lax.scan`` with a parallel backward pass),
:func:`grad` and :func:`value_and_grad` (``jax.grad`` with the backward method chosen in one
place), the methods :class:`Auto`, :class:`Blelloch`, :class:`Chunked` and :class:`Sequential`,
and the memory guard's :func:`estimate_memory` and :class:`MemoryLimitError`.
"""

# The subpackage ``bppsa.scan`` (scan algorithms) is imported first: the function ``scan``
# below then takes its name as an attribute of ``bppsa``. ``from bppsa.scan import ...`` still
# reaches the subpackage through ``sys.modules``.
from bppsa import jacobians, models, scan
from bppsa._grad import grad, value_and_grad
from bppsa._memory import MemoryLimitError
from bppsa._scan import estimate_memory, scan  # noqa: F811
from bppsa.scan import Auto, Blelloch, Chunked, Method, Sequential

__version__ = "0.1.0"

__all__ = [
    "Auto",
    "Blelloch",
    "Chunked",
    "MemoryLimitError",
    "Method",
    "Sequential",
    "estimate_memory",
    "grad",
    "jacobians",
    "models",
    "scan",
    "value_and_grad",
]
