"""bppsa: back-propagation as a parallel scan (BPPSA, MLSys 2020) for JAX.

Public API: :func:`scan` (a drop-in for ``jax.lax.scan`` with a parallel backward pass),
:func:`grad` and :func:`value_and_grad` (``jax.grad`` with the backward method chosen in one
place), and the methods :class:`Blelloch` and :class:`Sequential`.
"""

# The subpackage ``bppsa.scan`` (scan algorithms) is imported first: the function ``scan``
# below then takes its name as an attribute of ``bppsa``. ``from bppsa.scan import ...`` still
# reaches the subpackage through ``sys.modules``.
from bppsa import jacobians, models, scan
from bppsa._grad import grad, value_and_grad
from bppsa._scan import scan  # noqa: F811
from bppsa.scan import Auto, Blelloch, Chunked, Method, Sequential

__version__ = "0.1.0"

__all__ = [
    "Auto",
    "Blelloch",
    "Chunked",
    "Method",
    "Sequential",
    "grad",
    "jacobians",
    "models",
    "scan",
    "value_and_grad",
]
