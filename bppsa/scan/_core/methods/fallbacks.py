"""The lower-memory methods the memory guard offers (``Auto()`` takes the first that fits)."""

from __future__ import annotations

from bppsa.scan._core.methods.base import Method
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._profile import Profile


def fallbacks(profile: Profile) -> tuple[Method, ...]:
    """The lower-memory methods in order of preference, the larger (more parallel) ones first,
    in blocks of ``profile.rules.fallback_block`` steps."""
    block = profile.rules.fallback_block
    return (
        Chunked(),
        Blocked(Chunked(), block),
        Blocked(SequentialScan(), block),
        Blocked(SequentialScan(), 256),
        Blocked(SequentialScan(), 64),
    )
