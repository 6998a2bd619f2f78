"""The pruned VGG-11 of experiment 3: the network at an input size and width, its pruning, its
backward methods by name, its data, and its loss (public ``bppsa`` API only).

Sizes: at 32x32 and full width the network is :func:`bppsa.models.vgg11`. A smaller input
``S = 32 / 2^k`` leaves out the LAST ``k`` max-poolings (so the classifier still sees
``512 x 1 x 1``), and ``width_divisor`` divides every convolution's width; both exist only to
make quick runs and tests small, and every result records them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

import bppsa
from bppsa.models import Chain, Conv2d, Flatten, Linear, MaxPool2d, ReLU, magnitude_prune, vgg11
from experiments import methods

# The widths of bppsa.models.vgg11 ("M": a 2x2 max pooling), for the reduced variants.
VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
INPUT_SIZES = (1, 2, 4, 8, 16, 32)
NUM_CLASSES = 10
DATA = ("digits", "cifar10", "fixture")
SCOPES = ("layer", "global")


def parse_method(name: str) -> bppsa.Method:
    """The method object of a name of :data:`experiments.methods.OVER_LAYERS`: ``bp``
    (``Sequential()``: JAX's dense backward), ``bppsa`` (``Auto()``), ``blelloch`` (the full
    modified Blelloch scan over the layers), ``blelloch-K`` (``Blelloch(levels=K)``: K parallel
    levels, a linear scan between) and ``sequential-jacobians`` (``SequentialScan()``:
    the sequential sparse chain).

    Raises:
        ValueError: an unknown name, or a method that has no backward over layers.
    """
    return methods.parse_method(name, methods.OVER_LAYERS)


def describe(name: str) -> str:
    return repr(parse_method(name))


def vgg11_chain(input_size: int = 32, width_divisor: int = 1, num_classes: int = NUM_CLASSES):
    """VGG-11 for ``(B, 3, input_size, input_size)`` inputs (see the module docstring).

    Raises:
        ValueError: an input size that is not one of :data:`INPUT_SIZES`, or a width divisor
            that is not a positive power of two up to 64.
    """
    if input_size not in INPUT_SIZES:
        raise ValueError(f"input size must be one of {INPUT_SIZES}, got {input_size!r}.")
    if width_divisor not in (1, 2, 4, 8, 16, 32, 64):
        raise ValueError(f"width divisor must be a power of two up to 64, got {width_divisor!r}.")
    if (input_size, width_divisor) == (32, 1):
        return vgg11(num_classes=num_classes)
    dropped = round(math.log2(32 // input_size))
    pools = [i for i, width in enumerate(VGG11) if width == "M"]
    skip = set(pools[len(pools) - dropped :])
    layers, channels = [], 3
    for i, width in enumerate(VGG11):
        if width == "M":
            if i not in skip:
                layers.append(MaxPool2d(2))
            continue
        layers += [Conv2d(channels, width // width_divisor, 3, padding=1), ReLU()]
        channels = width // width_divisor
    return Chain([*layers, Flatten(), Linear(channels, num_classes)])


def net_name(input_size: int, width_divisor: int) -> str:
    width = "" if width_divisor == 1 else f", widths / {width_divisor}"
    pools = (
        "" if input_size == 32 else f", last {round(math.log2(32 // input_size))} pools left out"
    )
    return f"VGG-11 at {input_size}x{input_size}{width}{pools}"


def init_params(chain: Chain, seed: int) -> list:
    """Parameters of ``chain`` from ``jax.random.key(seed)`` (PyTorch's default init)."""
    return jax.block_until_ready(chain.init(jax.random.key(seed)))


def prune(params: list, sparsity: float, scope: str) -> tuple[list, list]:
    """Magnitude-pruning masks (NumPy, concrete) and the params with pruned weights zeroed."""
    masks = magnitude_prune(params, sparsity, scope=scope)
    pruned = [
        {name: value * mask[name] if mask else value for name, value in p.items()}
        for p, mask in zip(params, masks)
    ]
    return pruned, masks


def empty_layers(chain: Chain, masks: list) -> list[int]:
    """Indices of the layers whose weights the masks remove entirely (a disconnected net)."""
    return [
        i for i, m in enumerate(masks) if m and "weight" in m and not np.asarray(m["weight"]).any()
    ]


def loss_fn(chain: Chain, masks: list | None) -> Callable[..., Any]:
    """``loss(params, images, labels)``: mean cross-entropy of ``chain.apply`` with the masks
    closed over (concrete: the pruned entries are absent from the Jacobians' patterns)."""

    def loss(params, images, labels):
        logits = chain.apply(params, images, masks=masks)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss


@dataclasses.dataclass(frozen=True)
class Images:
    """One split of a data set at the experiment's input size."""

    images: np.ndarray  # (N, 3, S, S)
    labels: np.ndarray  # (N,) int32
    name: str
    synthetic: bool
    image_set: Any  # the bppsa.data.cifar10.ImageSet it came from (batches, sizes)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, iteration: int, batch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.image_set.batch_indices(iteration, batch_size, seed=seed)
        return self.images[index], self.labels[index]

    def describe(self) -> str:
        note = " (SYNTHETIC fixture, NOT CIFAR-10)" if self.synthetic else ""
        return f"{self.name}{note}, {len(self)} images of shape {self.images.shape[1:]}"


def load_images(data: str, split: str, *, root=None, input_size: int = 32, seed: int = 0):
    """A split of ``digits`` (scikit-learn's bundled digits, real), ``cifar10`` (the real set
    under ``root``) or ``fixture`` (a synthetic set in CIFAR-10's layout under ``root``), block
    averaged down to ``input_size`` (exact for the digits, whose 32x32 images are 4x4 blocks).
    """
    if data == "digits":
        from bppsa.data import digits

        image_set = digits.load(split, seed=seed)
    elif data in ("cifar10", "fixture"):
        from bppsa.data import cifar10

        image_set = cifar10.load(root, split)
    else:
        raise ValueError(f"data must be one of {DATA}, got {data!r}.")
    return Images(
        images=downsample(image_set.images, input_size),
        labels=image_set.labels,
        name=image_set.name,
        synthetic=bool(image_set.synthetic),
        image_set=image_set,
    )


def downsample(images: np.ndarray, size: int) -> np.ndarray:
    """``(N, C, 32, 32) -> (N, C, size, size)`` by the mean of each block."""
    n, c, h = images.shape[:3]
    if h == size:
        return images
    f = h // size
    return images.reshape(n, c, size, f, size, f).mean(axis=(3, 5)).astype(images.dtype)
