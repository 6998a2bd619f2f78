"""Magnitude pruning: boolean masks that keep the largest-magnitude weights.

Masks are concrete NumPy arrays (not traced values), so the sparsity patterns of the pruned
layers' transposed Jacobians are static.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SCOPES = ("global", "layer")


class Sparsity(NamedTuple):
    """Fraction of weights pruned by a list of masks.

    Attributes:
        per_layer: for each layer the fraction of its ``"weight"`` entries that are masked out,
            or None for a layer without a weight mask.
        overall: masked-out weights over all weights of the masked layers (0.0 if none).
    """

    per_layer: list[float | None]
    overall: float


def _weights(params: Sequence) -> list[np.ndarray | None]:
    if not isinstance(params, list | tuple):
        raise TypeError(
            f"params must be a list with one dict per layer (Chain.init), got "
            f"{type(params).__name__}."
        )
    weights: list[np.ndarray | None] = []
    for i, p in enumerate(params):
        if not isinstance(p, dict) or "weight" not in p:
            weights.append(None)
            continue
        try:
            w = np.asarray(p["weight"])
        except Exception as error:  # a tracer
            raise TypeError(
                f"params[{i}]['weight'] must be concrete (masks are static), got "
                f"{type(p['weight']).__name__}; prune outside jax.jit."
            ) from error
        if not np.issubdtype(w.dtype, np.floating) or not np.all(np.isfinite(w)):
            raise ValueError(f"params[{i}]['weight'] must be finite floating-point numbers.")
        weights.append(w)
    return weights


def _keep_largest(magnitudes: np.ndarray, sparsity: float) -> np.ndarray:
    """A boolean mask of ``magnitudes`` (1-D) that removes exactly ``round(sparsity * n)`` of
    the smallest; ties go by position (the earlier entry is removed first)."""
    removed = round(sparsity * magnitudes.size)
    order = np.argsort(magnitudes, kind="stable")
    keep = np.ones(magnitudes.size, bool)
    keep[order[:removed]] = False
    return keep


def magnitude_prune(params: Sequence, sparsity: float, *, scope: str = "global") -> list[dict]:
    """Masks that remove the smallest-magnitude weights (unstructured magnitude pruning).

    Exactly ``round(sparsity * n)`` weights are removed, as ``torch.nn.utils.prune`` counts, of
    the ``n`` weights in scope; equal magnitudes are removed in a fixed order (layer order, then
    C order within a weight), so the count is exact and the masks deterministic. Only entries
    named ``"weight"`` are pruned; biases never are.

    Args:
        params: one params dict per layer (e.g. :meth:`Chain.init`), with concrete values.
        sparsity: the fraction of weights removed, in ``[0, 1)``.
        scope: ``"global"``: one magnitude threshold over the weights of all layers;
            ``"layer"``: each layer's weights pruned by ``sparsity`` on their own.

    Returns:
        A list aligned with ``params``: ``{"weight": bool mask, "bias": all True, ...}`` (every
        other entry all True) for each dict with a ``"weight"``, ``{}`` for the rest. The masks
        are NumPy bool arrays of the params' shapes, for ``Chain.apply(..., masks=...)``.

    Example:
        >>> from bppsa.models import Chain, Conv2d, Flatten, Linear, ReLU
        >>> chain = Chain([Conv2d(3, 8, 3), ReLU(), Flatten(), Linear(8 * 6 * 6, 10)])
        >>> masks = magnitude_prune(chain.init(jax.random.key(0)), 0.9)
        >>> round(sparsity_of(masks).overall, 3)
        0.9
    """
    if not isinstance(sparsity, numbers.Real) or isinstance(sparsity, bool):
        raise TypeError(f"sparsity must be a real number in [0, 1), got {sparsity!r}.")
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}.")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}.")
    weights = _weights(params)
    present = [w for w in weights if w is not None]
    if scope == "global" and present:
        magnitudes = np.concatenate([np.abs(w, dtype=np.float64).ravel() for w in present])
        keep = np.split(_keep_largest(magnitudes, sparsity), np.cumsum([w.size for w in present]))
        kept = iter(k.reshape(w.shape) for k, w in zip(keep, present))
        weight_masks = [None if w is None else next(kept) for w in weights]
    else:
        weight_masks = [
            None
            if w is None
            else _keep_largest(np.abs(w, dtype=np.float64).ravel(), sparsity).reshape(w.shape)
            for w in weights
        ]
    return [
        {}
        if mask is None
        else {
            name: mask if name == "weight" else np.ones(np.shape(value), bool)
            for name, value in p.items()
        }
        for p, mask in zip(params, weight_masks)
    ]


def sparsity_of(masks: Sequence) -> Sparsity:
    """The fraction of weights each layer's mask removes, and overall (biases not counted)."""
    if not isinstance(masks, list | tuple):
        raise TypeError(f"masks must be a list with one entry per layer, got {type(masks)}.")
    per_layer: list[float | None] = []
    removed, total = 0, 0
    for mask in masks:
        weight = (mask or {}).get("weight")
        if weight is None:
            per_layer.append(None)
            continue
        weight = np.asarray(weight, bool)
        layer_removed = int(weight.size - np.count_nonzero(weight))
        per_layer.append(layer_removed / weight.size if weight.size else 0.0)
        removed += layer_removed
        total += weight.size
    return Sparsity(per_layer, removed / total if total else 0.0)
