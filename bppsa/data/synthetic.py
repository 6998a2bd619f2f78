"""The paper's synthetic data: Bernoulli bitstreams whose class is their bit probability.

Sample ``i`` of a :class:`Bitstreams` dataset is a length-``T`` bitstream of i.i.d.
Bernoulli(``p_k``) bits with label ``k`` drawn uniformly from ``0..C-1`` and
``p_k = (k + 1/2) / C``, i.e. ``p_k = 0.05 + 0.1 k`` for the paper's ``C = 10`` classes (Wang,
Bai & Pekhimenko, *BPPSA*, MLSys 2020, Sec. 5.1; the authors' artifact draws the labels
uniformly too). Every sample is a pure function of ``(seed, i)``, so nothing is stored: a batch
is generated when it is asked for, and the batch of any training iteration can be regenerated
exactly (which makes resuming an interrupted run deterministic).

The first ``int(train_fraction * num_samples)`` samples form the training split and the rest the
test split; since samples are i.i.d. this is a random split. The training order is a fresh
permutation of the split in every epoch (a function of ``(seed, epoch)``); an epoch has
``size // batch_size`` batches (the last, incomplete one is dropped so that every batch has the
same shape and a compiled step is reused).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

SPLITS = ("train", "test")
# Random streams of a seed: samples use ``fold_in(key(seed), SAMPLE_STREAM)``, so that a user
# of the same seed for something else (e.g. the model's initialization, stream 0) draws
# independent numbers; epoch orders use their own NumPy stream.
SAMPLE_STREAM = 1
_SHUFFLE_STREAM = 2


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


@functools.partial(jax.jit, static_argnames=("length", "num_classes"))
def _generate(seed: Array, indices: Array, *, length: int, num_classes: int):
    """Bits ``(n, length, 1)`` float32 and labels ``(n,)`` int32 of the samples ``indices``."""
    base = jax.random.fold_in(jax.random.key(seed), SAMPLE_STREAM)

    def one(index):
        k_label, k_bits = jax.random.split(jax.random.fold_in(base, index))
        label = jax.random.randint(k_label, (), 0, num_classes)
        probability = (label + 0.5) / num_classes
        bits = jax.random.uniform(k_bits, (length, 1)) < probability
        return bits.astype(jnp.float32), label.astype(jnp.int32)

    return jax.vmap(one)(indices)


@functools.lru_cache(maxsize=8)
def _epoch_order(seed: int, size: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(size)``: the order of one epoch (kept for the epoch's batches).

    Drawn on the host with NumPy (no compilation per split size), from ``(seed, epoch)``."""
    return np.random.default_rng([seed, _SHUFFLE_STREAM, epoch]).permutation(size)


@dataclasses.dataclass(frozen=True)
class Bitstreams:
    """The paper's synthetic bitstream dataset, generated on the fly from ``seed``.

    Attributes:
        length: bits per sample ``T``.
        num_samples: samples in both splits together (the paper: 50,000).
        train_fraction: fraction of the samples in the training split (the paper: 0.64).
        num_classes: classes ``C``; class ``k`` has bit probability ``(k + 1/2) / C``.
        seed: the samples and the epoch orders are functions of it.

    Example:
        >>> data = Bitstreams(length=1000)
        >>> xs, labels = data.batch("train", iteration=0, batch_size=16)
        >>> xs.shape, labels.shape
        ((16, 1000, 1), (16,))
    """

    length: int
    num_samples: int = 50_000
    train_fraction: float = 0.64
    num_classes: int = 10
    seed: int = 0

    def __post_init__(self):
        _check_int("length", self.length, 1)
        _check_int("num_samples", self.num_samples, 2)
        _check_int("num_classes", self.num_classes, 2)
        _check_int("seed", self.seed, 0)
        if self.seed >= 2**32:
            raise ValueError(f"seed must be < 2**32, got {self.seed}.")
        fraction = self.train_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
            raise ValueError(f"train_fraction must be a number in (0, 1), got {fraction!r}.")
        train = int(fraction * self.num_samples)
        if not 0 < train < self.num_samples:
            raise ValueError(
                f"train_fraction={fraction!r} of num_samples={self.num_samples} leaves a split "
                "empty; both the train and the test split need at least one sample."
            )

    @property
    def probabilities(self) -> np.ndarray:
        """Bit probability of each class, ``(num_classes,)``."""
        return (np.arange(self.num_classes) + 0.5) / self.num_classes

    def size(self, split: str) -> int:
        """Number of samples in ``split`` (``"train"`` or ``"test"``)."""
        train = int(self.train_fraction * self.num_samples)
        return train if self._split(split) == "train" else self.num_samples - train

    def samples(self, indices) -> tuple[Array, Array]:
        """Bits ``(n, T, 1)`` float32 and labels ``(n,)`` int32 of samples ``indices: (n,)``.

        ``indices`` count over both splits (``0 <= i < num_samples``; the test split starts at
        ``size("train")``).
        """
        indices = np.asarray(indices)
        if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
            raise ValueError(f"indices must be a 1-D integer array, got {indices!r}.")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_samples):
            raise ValueError(
                f"indices must lie in [0, {self.num_samples}), got values from "
                f"{indices.min()} to {indices.max()}."
            )
        return _generate(
            np.uint32(self.seed),
            indices.astype(np.int32),
            length=self.length,
            num_classes=self.num_classes,
        )

    def batches_per_epoch(self, split: str, batch_size: int) -> int:
        """Full batches of ``batch_size`` in one pass over ``split``."""
        self._check_batch_size(split, batch_size)
        return self.size(split) // batch_size

    def batch(
        self, split: str, iteration: int, batch_size: int, *, shuffle: bool = True
    ) -> tuple[Array, Array]:
        """The batch of training ``iteration`` (counted from 0 over all epochs).

        With ``shuffle`` the samples of epoch ``e = iteration // batches_per_epoch`` come in a
        permutation that depends on ``(seed, e)`` only; without it, in index order.
        """
        _check_int("iteration", iteration, 0)
        per_epoch = self.batches_per_epoch(split, batch_size)
        epoch, position = divmod(iteration, per_epoch)
        positions = np.arange(position * batch_size, (position + 1) * batch_size)
        if shuffle:
            positions = _epoch_order(self.seed, self.size(split), epoch)[positions]
        offset = 0 if self._split(split) == "train" else self.size("train")
        return self.samples(positions + offset)

    def batches(
        self,
        split: str,
        batch_size: int,
        *,
        start: int = 0,
        stop: int | None = None,
        shuffle: bool = True,
    ) -> Iterator[tuple[Array, Array]]:
        """Batches of iterations ``start, start + 1, ...`` up to ``stop`` (exclusive; ``None``
        runs forever), each generated only when the iterator reaches it."""
        self._check_batch_size(split, batch_size)
        _check_int("start", start, 0)
        if stop is not None:
            _check_int("stop", stop, start)
        iterations = itertools.count(start) if stop is None else range(start, stop)
        for iteration in iterations:
            yield self.batch(split, iteration, batch_size, shuffle=shuffle)

    def _split(self, split: str) -> str:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        return split

    def _check_batch_size(self, split: str, batch_size: int) -> None:
        _check_int("batch_size", batch_size, 1)
        if batch_size > self.size(split):
            raise ValueError(
                f"batch_size={batch_size} is larger than the {split} split "
                f"({self.size(split)} samples)."
            )
