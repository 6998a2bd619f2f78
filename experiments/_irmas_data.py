"""IRMAS features in memory, with a deterministic batch order for exact resume.

The batch of training iteration ``i`` is a function of ``(seed, i)`` only: epoch
``e = i // batches_per_epoch`` visits the clips in the order of a permutation drawn from
``numpy.random.default_rng([seed, e])``, in ``len // batch`` batches (the last, incomplete one
is dropped so that every batch has the same shape and one compiled step serves them all).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np

from bppsa.data import irmas


@dataclasses.dataclass(frozen=True, eq=False)
class Clips:
    """The features of one variant, and their batches.

    Attributes:
        features: what :func:`bppsa.data.irmas.load` returned.
        seed: the epoch orders are functions of it.
    """

    features: irmas.IrmasFeatures
    seed: int = 0

    def __len__(self) -> int:
        return len(self.features)

    @property
    def frames(self) -> int:
        return self.features.xs.shape[1]

    @property
    def num_features(self) -> int:
        return self.features.xs.shape[2]

    def batches_per_epoch(self, batch: int) -> int:
        if batch > len(self):
            raise ValueError(f"batch size {batch} exceeds the {len(self)} usable clips.")
        return len(self) // batch

    def indices(self, iteration: int, batch: int) -> np.ndarray:
        """Clip indices of the batch of ``iteration``."""
        epoch, position = divmod(iteration, self.batches_per_epoch(batch))
        order = _epoch_order(self.seed, len(self), epoch)
        return order[position * batch : (position + 1) * batch]

    def batch(self, iteration: int, batch: int) -> tuple[Any, Any]:
        """``(xs: (B, T, F) float32, labels: (B,) int32)`` of ``iteration``, on the device."""
        idx = self.indices(iteration, batch)
        return jnp.asarray(self.features.xs[idx]), jnp.asarray(self.features.labels[idx])

    def batches(self, batch: int, start: int = 0) -> Iterator[tuple[Any, Any]]:
        """The batches of iterations ``start, start + 1, ...``."""
        iteration = start
        while True:
            yield self.batch(iteration, batch)
            iteration += 1

    def identity(self) -> dict[str, Any]:
        """What identifies the data of a run (a resumed run must see the same)."""
        data = self.features
        digest = hashlib.sha256(data.xs.tobytes())
        digest.update(data.labels.tobytes())
        return dict(
            variant=data.variant.name,
            frames=self.frames,
            features=self.num_features,
            clips=len(self),
            skipped=len(data.skipped),
            synthetic=data.synthetic,
            features_sha256=digest.hexdigest()[:16],
        )


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, size: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(size)


def load_clips(
    root: str | os.PathLike,
    variant: str,
    *,
    seed: int,
    cache_dir: str | os.PathLike | None,
    workers: int = 1,
    strict: bool = False,
    progress: bool = True,
) -> Clips:
    """The features of ``variant`` under ``root`` (computed once, then read from the cache)."""
    features = irmas.load(
        root,
        variant,
        strict=strict,
        cache=cache_dir is not None,
        cache_dir=cache_dir,
        workers=workers,
        progress=progress,
    )
    return Clips(features, seed)
