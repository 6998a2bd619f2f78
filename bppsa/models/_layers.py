"""Feed-forward layers and their :class:`Chain`, as pure functions over parameter dicts.

Layers follow PyTorch's names, layouts (NCHW activations; ``weight: (out, in, kh, kw)`` for
:class:`Conv2d`, ``(out, in)`` for :class:`Linear`) and default initialization, so parameters can
be compared with ``torch.nn``. Each layer is a small frozen dataclass (hashable, so a valid
static argument of ``jax.jit``) with ``init``, a batched forward ``__call__(params, x, mask)``,
``output_shape`` on per-example shapes, and ``transposed_jacobian(params, x, mask)`` (its
transposed Jacobian, from :mod:`bppsa.jacobians`: the one protocol by which cells and layers
declare it, a builder that takes the call's own arguments). A mask is a dict of boolean arrays
aligned with the layer's params, e.g. ``{"weight": (out, in) bool, "bias": (out,) bool}``
(:func:`bppsa.models.magnitude_prune`); the layer then uses ``param * mask`` for each masked
entry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.jacobians._layers import (
    conv2d_jacobian_t,
    linear_jacobian_t,
    maxpool2d_jacobian_t,
    pair,
    relu_jacobian_t,
)
from bppsa.scan._core.layer_scan import AUTODIFF

Params = dict[str, Array]
Mask = dict[str, Any] | None
Shape = tuple[int, ...]


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}.")
    return int(value)


def apply_mask(params, mask: Mask):
    """``params`` with each masked entry replaced by ``param * mask`` (``mask`` None or ``{}``:
    ``params`` unchanged)."""
    if not mask:
        return params
    return {**params, **{name: params[name] * m for name, m in mask.items()}}


def _uniform_params(key: Array, shapes: dict[str, Shape], fan_in: int, dtype) -> Params:
    # PyTorch's default: kaiming_uniform(a=sqrt(5)) on the weight, i.e. U(+-1/sqrt(fan_in)),
    # and the same bound for the bias.
    bound = 1.0 / math.sqrt(fan_in)
    keys = jax.random.split(key, len(shapes))
    return {
        name: jax.random.uniform(k, shape, dtype, -bound, bound)
        for k, (name, shape) in zip(keys, shapes.items())
    }


def _window_output(input_hw, kernel, stride, padding=(0, 0)) -> tuple[int, int]:
    for axis, size, k, p in zip(("height", "width"), input_hw, kernel, padding):
        if size + 2 * p < k:
            padded = f"padded {axis} {size} + 2*{p} = {size + 2 * p}" if p else f"{axis} {size}"
            raise ValueError(f"the kernel {axis} {k} is larger than the input's {padded}")
    return tuple(
        (size + 2 * p - k) // s + 1 for size, k, s, p in zip(input_hw, kernel, stride, padding)
    )


def _stored(value: int | tuple[int, int] | None) -> tuple[int, int]:
    """A window field after ``__post_init__``, which stores ints (and a default stride) as
    pairs."""
    return cast(tuple[int, int], value)


class Layer:
    """A feed-forward layer type: parameters, batched forward, shapes and transposed Jacobian.

    ``mask`` (of ``__call__`` and ``transposed_jacobian``) is None, ``{}`` or a dict of boolean
    arrays shaped like some of the params; each masked param is used as ``param * mask``.

    Subclasses implement ``param_shapes``, ``_output_shape`` (raising a bare ``ValueError``
    that says what is wrong; :meth:`output_shape` adds the layer's name), ``__call__`` and
    ``transposed_jacobian``.
    """

    def param_shapes(self) -> dict[str, Shape]:
        """The shape of each parameter (``{}``: the layer has none)."""
        return {}

    def init(self, key: Array, *, dtype=jnp.float32) -> Params:
        """Parameters in PyTorch's layout and default initialization."""
        return {}

    def output_shape(self, input_shape: Sequence[int]) -> Shape:
        """The per-example output shape for a per-example ``input_shape`` (no batch dim).

        Raises:
            ValueError: naming the layer, when the input does not fit it.
        """
        try:
            return self._output_shape(tuple(input_shape))
        except ValueError as error:
            raise ValueError(f"{self}: {error}.") from None

    def _output_shape(self, input_shape: Shape) -> Shape:
        raise NotImplementedError

    def _check_batch(self, x: Array) -> None:
        if x.ndim < 1:
            raise ValueError(f"{self}: x must have a leading batch dim, got shape {x.shape}.")
        self.output_shape(x.shape[1:])

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        """The forward on a batch ``x: (B, *input_shape)``."""
        raise NotImplementedError

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        """The transposed Jacobian of the layer at its batched INPUT ``x``, with the call's own
        arguments (``None``: an identity); a layer type without one (this default) has it
        built by autodiff in the chain's backward."""
        return AUTODIFF

    def dense_work(self, output_shape: Shape) -> int | None:
        """Multiply-adds per example of the input gradient in dense back-propagation, for a
        layer whose Jacobian pruning thins (``None`` for the others): what ``bppsa.Auto()``
        weighs against the stored entries of its sparse transposed Jacobian."""
        return None


@dataclasses.dataclass(frozen=True)
class Conv2d(Layer):
    """2-D convolution (``torch.nn.Conv2d`` with ``groups=1``, zero padding, a bias).

    ``kernel_size``, ``stride`` and ``padding`` are ints or ``(h, w)`` pairs, stored as pairs.
    Input ``(B, in_channels, H, W)``; output ``(B, out_channels, H', W')`` with
    ``H' = (H + 2 p_h - k_h) // s_h + 1``.
    """

    in_channels: int
    out_channels: int
    kernel_size: int | tuple[int, int]
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0

    def __post_init__(self):
        for name in ("in_channels", "out_channels"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        for name, minimum in (("kernel_size", 1), ("stride", 1), ("padding", 0)):
            object.__setattr__(self, name, pair(name, getattr(self, name), minimum=minimum))

    def param_shapes(self) -> dict[str, Shape]:
        kh, kw = _stored(self.kernel_size)
        return {
            "weight": (self.out_channels, self.in_channels, kh, kw),
            "bias": (self.out_channels,),
        }

    def init(self, key: Array, *, dtype=jnp.float32) -> Params:
        kh, kw = _stored(self.kernel_size)
        fan_in = self.in_channels * kh * kw
        return _uniform_params(key, self.param_shapes(), fan_in, dtype)

    def _output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise ValueError(f"expected an input of shape (C, H, W), got {input_shape}")
        if input_shape[0] != self.in_channels:
            raise ValueError(
                f"in_channels={self.in_channels} but its input has {input_shape[0]} channels"
            )
        hw = _window_output(input_shape[1:], self.kernel_size, self.stride, self.padding)
        return (self.out_channels, *hw)

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        self._check_batch(x)
        params = apply_mask(params, mask)
        (ph, pw) = _stored(self.padding)
        y = jax.lax.conv_general_dilated(
            x,
            params["weight"],
            _stored(self.stride),
            [(ph, ph), (pw, pw)],
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        return y + params["bias"][:, None, None]

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        return conv2d_jacobian_t(
            params["weight"],
            cast(tuple[int, int], tuple(x.shape[-2:])),
            stride=self.stride,
            padding=self.padding,
            mask=(mask or {}).get("weight"),
        )

    def dense_work(self, output_shape: Shape) -> int:
        return math.prod(self.param_shapes()["weight"]) * math.prod(output_shape[1:])


@dataclasses.dataclass(frozen=True)
class Linear(Layer):
    """Affine map ``y = x W^T + b`` (``torch.nn.Linear``): ``(B, in_features) -> (B,
    out_features)``."""

    in_features: int
    out_features: int

    def __post_init__(self):
        for name in ("in_features", "out_features"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))

    def param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.out_features, self.in_features), "bias": (self.out_features,)}

    def init(self, key: Array, *, dtype=jnp.float32) -> Params:
        return _uniform_params(key, self.param_shapes(), self.in_features, dtype)

    def _output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            raise ValueError(
                f"expected an input of shape ({self.in_features},), got {input_shape} "
                "(put a Flatten before it)"
            )
        if input_shape[0] != self.in_features:
            raise ValueError(
                f"in_features={self.in_features} but its input has {input_shape[0]} features"
            )
        return (self.out_features,)

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        self._check_batch(x)
        params = apply_mask(params, mask)
        return x @ params["weight"].T + params["bias"]

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        return linear_jacobian_t(params["weight"], mask=(mask or {}).get("weight"))

    def dense_work(self, output_shape: Shape) -> int:
        return math.prod(self.param_shapes()["weight"])


@dataclasses.dataclass(frozen=True)
class ReLU(Layer):
    """Elementwise ``max(x, 0)`` on any shape."""

    def _output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        return jax.nn.relu(x)

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        return relu_jacobian_t(x)


@dataclasses.dataclass(frozen=True)
class MaxPool2d(Layer):
    """2-D max pooling (``torch.nn.MaxPool2d`` without padding or dilation, floor mode).

    ``kernel_size`` and ``stride`` are ints or pairs, stored as pairs; ``stride`` defaults to
    ``kernel_size``. Input ``(B, C, H, W)``; output ``(B, C, (H - k_h) // s_h + 1, ...)``.
    """

    kernel_size: int | tuple[int, int]
    stride: int | tuple[int, int] | None = None

    def __post_init__(self):
        kernel = pair("kernel_size", self.kernel_size, minimum=1)
        stride = kernel if self.stride is None else pair("stride", self.stride, minimum=1)
        object.__setattr__(self, "kernel_size", kernel)
        object.__setattr__(self, "stride", stride)

    def _output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise ValueError(f"expected an input of shape (C, H, W), got {input_shape}")
        return (input_shape[0], *_window_output(input_shape[1:], self.kernel_size, self.stride))

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        self._check_batch(x)
        return jax.lax.reduce_window(
            x,
            -jnp.inf,
            jax.lax.max,
            (1, 1, *_stored(self.kernel_size)),
            (1, 1, *_stored(self.stride)),
            "VALID",
        )

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        return maxpool2d_jacobian_t(x, self.kernel_size, self.stride)


@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    """Flattens each example in C order: ``(B, C, H, W) -> (B, C*H*W)``."""

    def _output_shape(self, input_shape: Shape) -> Shape:
        if not input_shape:
            raise ValueError("expected an input of at least one dim per example, got ()")
        return (math.prod(input_shape),)

    def __call__(self, params: Params, x: Array, mask: Mask = None) -> Array:
        self._check_batch(x)
        return x.reshape(x.shape[0], math.prod(x.shape[1:]))

    def transposed_jacobian(self, params: Params, x: Array, mask: Mask = None):
        return None
