"""scikit-learn's bundled 8x8 handwritten digits as 3x32x32 images: a small real data set for the
CIFAR-10 VGG-11 that needs no download.

Source: :func:`sklearn.datasets.load_digits`, which ships inside scikit-learn: 1797 greyscale
8x8 images with pixel values ``0..16`` and ten classes ``"0"`` ... ``"9"`` (about 180 each), the
test part of the UCI *Optical Recognition of Handwritten Digits* data set (Alpaydin & Kaynak,
1998). It needs the ``digits`` extra (``pip install -e '.[digits]'``: scikit-learn).

Conversion (:func:`load`), to the input of the CIFAR-10 VGG-11: the values are divided by 16
(so they lie in ``[0, 1]``, multiples of 1/16), upsampled by nearest neighbour to 32x32 (every
pixel becomes a 4x4 block: ``np.repeat``, no interpolation, so nothing is invented between
pixels) and copied into the three channels. With ``normalize=True`` they are then standardized
with the mean and standard deviation of all pixels of the training split (one value for all
three channels; the test split is standardized with the same, so it is never looked at), and
:attr:`ImageSet.mean`/:attr:`ImageSet.std` record them.

Split (:func:`split_indices`): stratified and deterministic. For each class in turn one
permutation of its images is drawn from ``numpy.random.default_rng(seed)`` and its first
``round(test_fraction * count)`` images form the test split; both splits keep the original
order of the images.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from bppsa.data._images import ImageSet, _check_split, _float_dtype

NAME = "digits"
CLASS_NAMES = tuple(str(digit) for digit in range(10))
NUM_IMAGES = 1797
SOURCE_SIDE = 8  # the images of scikit-learn are 8x8
SCALE = 4  # nearest-neighbour upsampling factor: 8x8 -> 32x32
MAX_VALUE = 16  # pixel values are 0..16

__all__ = ["CLASS_NAMES", "MAX_VALUE", "NAME", "NUM_IMAGES", "SCALE", "load", "split_indices"]


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's images ``(1797, 8, 8)`` uint8 and labels ``(1797,)`` int32, read-only."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "bppsa.data.digits reads the digits data set that ships with scikit-learn, which is "
            "not installed: pip install -e '.[digits]' (or pip install 'scikit-learn>=1.3')."
        ) from error
    bunch = load_digits()
    images = np.asarray(bunch.images).astype(np.uint8)
    labels = np.asarray(bunch.target).astype(np.int32)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def split_indices(
    labels: np.ndarray, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split of ``range(len(labels))``: ``(train, test)`` indices, each sorted.

    Args:
        labels: ``(N,)`` integer class of each item.
        test_fraction: fraction of each class that goes to the test split, in ``(0, 1)``.
        seed: the split is a function of ``(labels, test_fraction, seed)`` only.
    """
    fraction = test_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
        raise ValueError(f"test_fraction must be a number in (0, 1), got {fraction!r}.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}.")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    test = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        test.append(rng.permutation(members)[: round(fraction * len(members))])
    test = np.sort(np.concatenate(test))
    train = np.setdiff1d(np.arange(len(labels)), test)
    if not len(test) or not len(train):
        raise ValueError(
            f"test_fraction={fraction!r} leaves a split empty; both the train and the test split "
            "need at least one image."
        )
    return train, test


def _upsample(images: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``(n, 8, 8)`` values ``0..16`` -> ``(n, 3, 32, 32)`` in ``[0, 1]``, nearest neighbour."""
    scaled = images.astype(dtype) / dtype.type(MAX_VALUE)
    big = scaled.repeat(SCALE, axis=1).repeat(SCALE, axis=2)
    return np.repeat(big[:, None], 3, axis=1)


def load(
    split: str = "train",
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    dtype=np.float32,
    normalize: bool = True,
) -> ImageSet:
    """One split of scikit-learn's digits as ``(N, 3, 32, 32)`` images (see the module doc).

    Args:
        split: ``"train"`` or ``"test"``.
        test_fraction: fraction of each class in the test split.
        seed: the split is a function of ``(test_fraction, seed)``.
        dtype: floating dtype of the images.
        normalize: standardize with the training split's mean and standard deviation;
            otherwise the values are in ``[0, 1]``.

    Returns:
        An :class:`~bppsa.data.ImageSet` named ``"digits"``, in the original order.

    Raises:
        ImportError: scikit-learn (the ``digits`` extra) is not installed.
    """
    _check_split(split)
    chosen = _float_dtype(dtype)
    images, labels = _digits()
    train, test = split_indices(labels, test_fraction=test_fraction, seed=seed)
    work = np.dtype(np.float32) if chosen.itemsize < 4 else chosen
    chosen_images = _upsample(images[train if split == "train" else test], work)
    mean = std = None
    if normalize:
        # Nearest upsampling repeats every pixel 16 times, so the 8x8 pixels have the same
        # statistics as the 32x32 images.
        pixels = images[train].astype(np.float64) / MAX_VALUE
        mean, std = (float(pixels.mean()),) * 3, (float(pixels.std()),) * 3
        chosen_images = (chosen_images - work.type(mean[0])) / work.type(std[0])
    return ImageSet(
        images=chosen_images.astype(chosen, copy=False),
        labels=labels[train if split == "train" else test].copy(),
        class_names=CLASS_NAMES,
        name=NAME,
        split=split,
        mean=mean,
        std=std,
    )
