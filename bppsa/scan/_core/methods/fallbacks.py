"""The lower-memory methods the memory guard offers (``Auto()`` takes the first that fits)."""

from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.sequential_scan import SequentialScan

CPU_BLOCK = 1024  # steps per block of the lower-memory fallbacks

# In this order of preference: the larger (more parallel) ones first.
FALLBACKS = (
    Chunked(),
    Blocked(Chunked(), CPU_BLOCK),
    Blocked(SequentialScan(), CPU_BLOCK),
    Blocked(SequentialScan(), 256),
    Blocked(SequentialScan(), 64),
)
