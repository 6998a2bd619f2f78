"""The lower-memory methods the memory guard offers (``Auto()`` takes the first that fits)."""

from bppsa._core.methods.blocked import Blocked
from bppsa._core.methods.chunked import Chunked
from bppsa._core.methods.sequential import Sequential

CPU_BLOCK = 1024  # steps per block of the lower-memory fallbacks

# In this order of preference: the larger (more parallel) ones first.
FALLBACKS = (
    Chunked(),
    Blocked(Chunked(), CPU_BLOCK),
    Blocked(Sequential(jacobians=True), CPU_BLOCK),
    Blocked(Sequential(jacobians=True), 256),
    Blocked(Sequential(jacobians=True), 64),
)
