"""The record of a labelled image data set, shared by the CIFAR-10 and the digits readers.

:class:`ImageSet` holds the ``(N, 3, 32, 32)`` images and labels of one split and draws its
deterministic training batches; the checks of ``split`` and ``dtype`` are what
:mod:`bppsa.data.cifar10` and :mod:`bppsa.data.digits` share when they build one, and
:func:`standardize` the per-channel standardization. :class:`ImageSet` is re-exported as
``bppsa.data.ImageSet`` and ``bppsa.data.cifar10.ImageSet``.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np

SPLITS = ("train", "test")

__all__ = ["SPLITS", "ImageSet", "standardize"]


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


def _float_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype, which must be floating (float16/32/64, bfloat16)."""
    try:
        chosen = np.dtype(dtype)
    except TypeError:
        chosen = None
    if chosen is None or not jnp.issubdtype(chosen, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype such as np.float32, got {dtype!r}.")
    return chosen


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return split


@dataclasses.dataclass(frozen=True, eq=False)
class ImageSet:
    """Labelled 3x32x32 images of one split, and their batches.

    The batch of training ``iteration`` is a function of ``(seed, iteration)`` only: epoch
    ``e = iteration // batches_per_epoch`` visits the images in the order of the permutation
    ``numpy.random.default_rng([seed, e])`` draws, in ``len // batch_size`` batches (the last,
    incomplete one is dropped so that every batch has the same shape and one compiled step
    serves them all); a resumed run sees exactly the batches it would have seen.

    Attributes:
        images: ``(N, 3, 32, 32)`` floating, NCHW.
        labels: ``(N,)`` int32, indices into ``class_names``.
        class_names: the name of each label.
        name: the data set, ``"cifar10"`` or ``"digits"``, for results and figures.
        split: ``"train"`` or ``"test"``.
        synthetic: True for a fixture of :mod:`bppsa.data.cifar10_fixture` (NOT CIFAR-10).
        mean, std: per channel, what was subtracted and divided by after scaling the pixels to
            ``[0, 1]``; ``None`` when the images were not standardized.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    name: str
    split: str
    synthetic: bool = False
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def batches_per_epoch(self, batch_size: int) -> int:
        """Full batches of ``batch_size`` in one pass over the images."""
        _check_int("batch_size", batch_size, 1)
        if batch_size > len(self):
            raise ValueError(
                f"batch_size={batch_size} is larger than the {self.name} {self.split} split "
                f"({len(self)} images)."
            )
        return len(self) // batch_size

    def batch_indices(
        self, iteration: int, batch_size: int, *, seed: int = 0, shuffle: bool = True
    ) -> np.ndarray:
        """Indices ``(batch_size,)`` of the images of training ``iteration`` (counted from 0)."""
        _check_int("iteration", iteration, 0)
        _check_int("seed", seed, 0)
        epoch, position = divmod(iteration, self.batches_per_epoch(batch_size))
        positions = np.arange(position * batch_size, (position + 1) * batch_size)
        if not shuffle:
            return positions
        return np.random.default_rng([seed, epoch]).permutation(len(self))[positions]

    def batch(
        self, iteration: int, batch_size: int, *, seed: int = 0, shuffle: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(images: (B, 3, 32, 32), labels: (B,) int32)`` of ``iteration``, NumPy arrays."""
        indices = self.batch_indices(iteration, batch_size, seed=seed, shuffle=shuffle)
        return self.images[indices], self.labels[indices]

    def batches(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        start: int = 0,
        stop: int | None = None,
        shuffle: bool = True,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The batches of iterations ``start, start + 1, ...`` up to ``stop`` (exclusive;
        ``None`` runs forever), each gathered when the iterator reaches it."""
        self.batches_per_epoch(batch_size)
        _check_int("start", start, 0)
        if stop is not None:
            _check_int("stop", stop, start)
        iterations = itertools.count(start) if stop is None else range(start, stop)
        for iteration in iterations:
            yield self.batch(iteration, batch_size, seed=seed, shuffle=shuffle)


def standardize(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """``(images - mean) / std`` per channel of NCHW ``images``, in place, and returned."""
    images -= np.asarray(mean, images.dtype)[:, None, None]
    images /= np.asarray(std, images.dtype)[:, None, None]
    return images
