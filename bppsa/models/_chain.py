"""A feed-forward network as a chain of layers, whose backward is a scan over the layers.

:class:`Chain` holds the layers of :mod:`bppsa.models._layers` or a user's own callables,
validates parameters, masks and shapes before anything is traced, and differentiates its
:meth:`Chain.apply` with the backward method of the enclosing :func:`bppsa.grad` (see
:mod:`bppsa.scan._core.layer_scan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.models._layers import (
    Layer,
    Mask,
    Params,
    Shape,
    apply_mask,
)
from bppsa.scan._core import layer_scan

__all__ = ["Chain", "call_layer"]


def call_layer(layer, params: Params, x: Array, mask: Mask = None) -> Array:
    """One layer's forward on a batch."""
    return layer(*_arguments(layer, params, x, mask))


def layer_jacobian_t(layer, params: Params, x: Array, mask: Mask = None):
    """A layer's transposed Jacobian at its batched input ``x``, by the one protocol of cells
    and layers: the layer's ``transposed_jacobian`` builder (a :class:`Layer`'s method; a
    callable's attached with :func:`bppsa.jacobians.transposed_jacobian`) called with the
    call's own arguments; ``AUTODIFF`` for a layer without one."""
    builder = getattr(layer, "transposed_jacobian", None)
    if builder is None:
        return layer_scan.AUTODIFF
    return builder(*_arguments(layer, params, x, mask))


def _arguments(layer, params: Params, x: Array, mask: Mask) -> tuple:
    """The arguments of a layer's call, and so of its builder: a :class:`Layer` applies its own
    mask, a plain callable gets ``apply_mask(params, mask)``."""
    return (params, x, mask) if isinstance(layer, Layer) else (apply_mask(params, mask), x)


def _name(layer) -> str:
    if isinstance(layer, Layer):
        return type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


def _callable_output_shape(layer, params, input_shape: Shape, batch: int, dtype) -> Shape:
    x = jax.ShapeDtypeStruct((batch, *input_shape), dtype)
    try:
        y = jax.eval_shape(layer, params, x)
    except Exception as error:
        raise ValueError(
            f"it fails on an input of shape {x.shape}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(y, jax.ShapeDtypeStruct) or y.shape[:1] != (batch,):
        raise ValueError(
            f"a layer must return one array with the batch dim first; on an input of shape "
            f"{x.shape} it returned {y}"
        )
    return tuple(y.shape[1:])


@dataclasses.dataclass(frozen=True)
class Chain:
    """A feed-forward network ``layers[-1](... layers[0](x))``, with one params dict per layer.

    Layers are the types of this module, or a plain callable ``layer(params, x) -> y`` on a
    batch (a user's own layer: :meth:`init` gives ``{}`` for it, its output shape comes from
    ``jax.eval_shape``; its transposed Jacobian is built by autodiff unless it declares one
    with :func:`bppsa.jacobians.transposed_jacobian`, the protocol of the layer types too).

    Example:
        >>> from bppsa.models import Conv2d, Flatten, Linear, ReLU
        >>> chain = Chain([Conv2d(3, 8, 3, padding=1), ReLU(), Flatten(), Linear(8 * 32 * 32, 10)])
        >>> params = chain.init(jax.random.key(0))
        >>> chain.apply(params, jnp.ones((4, 3, 32, 32))).shape
        (4, 10)
    """

    layers: Sequence  # any sequence of layers; stored as a tuple

    def __post_init__(self):
        layers = tuple(self.layers)
        if not layers:
            raise ValueError("a Chain needs at least one layer.")
        for i, layer in enumerate(layers):
            if not callable(layer):
                raise TypeError(
                    f"layer {i} must be a Layer or a callable layer(params, x) -> y, got "
                    f"{type(layer).__name__}."
                )
        object.__setattr__(self, "layers", layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator:
        return iter(self.layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Chain(self.layers[index])
        return self.layers[index]

    # -- what the scan over the layers asks of the chain (bppsa.scan._core.layer_scan) ----------

    call_layer = staticmethod(call_layer)
    layer_jacobian_t = staticmethod(layer_jacobian_t)

    @staticmethod
    def dense_work(layer, output_shape: Shape) -> int | None:
        """See :meth:`Layer.dense_work` (``None`` for a plain callable)."""
        return layer.dense_work(output_shape) if isinstance(layer, Layer) else None

    def init(self, key: Array, *, dtype=jnp.float32) -> list:
        """One params dict per layer (layer ``i`` from ``jax.random.split(key, len(chain))[i]``;
        ``{}`` for layers without parameters and for plain callables)."""
        keys = jax.random.split(key, len(self))
        return [
            layer.init(k, dtype=dtype) if isinstance(layer, Layer) else {}
            for k, layer in zip(keys, self.layers)
        ]

    def forward(self, params: Sequence, x: Array, *, masks: Sequence | None = None) -> Array:
        """The plain forward on a batch ``x: (B, *input_shape)`` (JAX's autodiff of it is the
        reference backward)."""
        self._check_lengths(params, masks)
        masks = [None] * len(self) if masks is None else masks
        for layer, p, m in zip(self.layers, params, masks):
            x = call_layer(layer, p, x, m)
        return x

    def apply(self, params: Sequence, x: Array, *, masks: Sequence | None = None) -> Array:
        """The forward, whose backward runs as a scan over the layers' transposed Jacobians.

        Everything is validated first (:meth:`validate`), before anything is traced.

        Args:
            params: one params dict per layer (:meth:`init`).
            x: a batch ``(B, *input_shape)``.
            masks: None, or one entry per layer: None/``{}`` (no mask) or a dict of boolean
                arrays shaped like that layer's params (:func:`bppsa.models.magnitude_prune`).

        Returns:
            The output ``(B, *output_shape)``.
        """
        self.validate(params, x, masks=masks)
        return layer_scan.apply(self, params, x, masks)

    def transposed_jacobians(
        self, params: Sequence, x: Array, *, masks: Sequence | None = None
    ) -> list:
        """Every layer's transposed Jacobian at its input for the batch ``x``: the elements the
        backward scans (``None`` for an identity such as :class:`Flatten`).

        The library's layers give :class:`bppsa.scan.Sparse` maps with static patterns (from
        the geometry and, for concrete masks, the pruning); a plain callable layer a dense
        :class:`bppsa.scan.Dense` one by autodiff. Under ``jax.eval_shape`` only the patterns
        are built, which is how the FLOPs and memory of a scan over the layers are analysed
        without running it.
        """
        self.validate(params, x, masks=masks)
        return layer_scan.layer_maps_at(self, params, x, masks)

    def estimate_memory(
        self, params: Sequence, x: Array, *, masks: Sequence | None = None, method=None
    ) -> int:
        """Estimated peak bytes of :meth:`apply`'s forward and backward under ``method``
        (default ``bppsa.Auto()``): the layers' inputs, their transposed Jacobians and the
        products the scan over the layers forms (the model of the memory guard). ``params``
        and ``x`` may be ``jax.ShapeDtypeStruct``; nothing runs."""
        self.validate(params, x, masks=masks)
        return layer_scan.estimate_memory(self, params, x, masks=masks, method=method)

    def shapes(self, input_shape: Sequence[int], params: Sequence | None = None) -> list[Shape]:
        """The per-example input shape of each layer, and the final output shape last.

        ``params`` is only needed by plain callable layers that read their params' shapes
        (they are evaluated with ``jax.eval_shape`` on a batch of 1; default ``{}``).
        """
        if params is not None:
            self._check_lengths(params, None)
        return self._propagate(tuple(input_shape), params, batch=1, dtype=jnp.float32)

    def validate(self, params: Sequence, x: Array, *, masks: Sequence | None = None) -> list[Shape]:
        """Checks params, masks and ``x`` against the layers, without tracing the chain.

        Returns:
            :meth:`shapes` of ``x``'s per-example shape.

        Raises:
            ValueError, TypeError: naming the layer by index and type.
        """
        self._check_lengths(params, masks)
        for i, layer in enumerate(self.layers):
            self._check_params(i, layer, params[i])
        if masks is not None:
            for i in range(len(self)):
                self._check_mask(i, params[i], masks[i])
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"x must be an array, got {type(x).__name__}.")
        if x.ndim < 1:
            raise ValueError(f"x must be a batch (B, *input_shape), got shape {x.shape}.")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"x must have a floating dtype, got {x.dtype}.")
        return self._propagate(tuple(x.shape[1:]), params, batch=x.shape[0], dtype=x.dtype)

    def _where(self, i: int) -> str:
        return f"layer {i} ({_name(self.layers[i])})"

    def _check_lengths(self, params, masks) -> None:
        for name, value in (("params", params), ("masks", masks)):
            if value is None and name == "masks":
                continue
            if not isinstance(value, list | tuple):
                raise TypeError(
                    f"{name} must be a list with one entry per layer, got {type(value).__name__}."
                )
            if len(value) != len(self):
                raise ValueError(
                    f"{name} has {len(value)} entries but the chain has {len(self)} layers."
                )

    def _check_params(self, i: int, layer, params) -> None:
        if not isinstance(layer, Layer):
            return  # a user's layer: any pytree
        expected = layer.param_shapes()
        if not isinstance(params, dict):
            raise TypeError(
                f"{self._where(i)}: params must be a dict with keys {sorted(expected)}, got "
                f"{type(params).__name__}."
            )
        if set(params) != set(expected):
            raise ValueError(
                f"{self._where(i)}: params has keys {sorted(params)} but {sorted(expected)} "
                "were expected."
            )
        for name, shape in expected.items():
            actual = getattr(params[name], "shape", None)
            if actual is None or tuple(actual) != shape:
                raise ValueError(
                    f"{self._where(i)}: params[{name!r}] has shape {actual} but {shape} was "
                    "expected."
                )

    def _check_mask(self, i: int, params, mask) -> None:
        if mask is None or (isinstance(mask, dict) and not mask):
            return
        where = f"{self._where(i)}: masks[{i}]"
        if not isinstance(mask, dict):
            raise TypeError(f"{where} must be None or a dict of boolean arrays, got {mask!r}.")
        for name, m in mask.items():
            if not isinstance(params, dict) or name not in params:
                keys = sorted(params) if isinstance(params, dict) else []
                raise ValueError(f"{where} masks {name!r}, which is not one of its params {keys}.")
            if not hasattr(m, "shape") or np.dtype(m.dtype) != np.bool_:
                raise TypeError(f"{where}[{name!r}] must be a boolean array, got {m!r}.")
            if tuple(m.shape) != tuple(params[name].shape):
                raise ValueError(
                    f"{where}[{name!r}] has shape {tuple(m.shape)} but its params[{name!r}] has "
                    f"shape {tuple(params[name].shape)}."
                )

    def _propagate(self, input_shape: Shape, params, *, batch: int, dtype) -> list[Shape]:
        shapes = [input_shape]
        for i, layer in enumerate(self.layers):
            try:
                if isinstance(layer, Layer):
                    shape = layer._output_shape(shapes[-1])
                else:
                    p = {} if params is None else params[i]
                    shape = _callable_output_shape(layer, p, shapes[-1], batch, dtype)
            except ValueError as error:
                first = f" (the chain's input has per-example shape {shapes[0]})" if i == 0 else ""
                raise ValueError(f"{self._where(i)}: {error}{first}.") from None
            shapes.append(shape)
        return shapes
