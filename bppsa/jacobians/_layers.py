"""Analytic sparse transposed Jacobians ``J^T`` of the layers of a feed-forward CNN.

For one example, a layer ``y = f(x)`` with ``x`` and ``y`` flattened in C order (NCHW per
example: index ``c * H * W + h * W + w``) has the transposed Jacobian ``A = J^T`` of shape
``(n_x, n_y)``, applied to an output cotangent as ``g_x = A @ g_y``. Each builder returns it as a
:class:`bppsa.scan.Sparse` with a stack of one map:

- the PATTERN (where the non-zeros may be) is built in NumPy from static shapes only (and, for
  pruned layers, from a concrete mask), vectorized, and cached per geometry, so that re-tracing
  is cheap and every iteration of a retraining loop shares one pattern (and one jit cache entry);
- the VALUES are traced JAX arrays gathered with static indices (no scatter), ``(1, nnz)`` when
  shared by the batch (Conv2d, Linear) or ``(1, B, nnz)`` per example (ReLU, MaxPool2d).

ReLU and MaxPool2d patterns are data independent (the full diagonal; every window slot) with 0/1
values, unlike the authors' artifact, which drops the zeros per sample: then the pattern of the
whole chain depends only on the geometry and the pruning masks. Flatten is the identity in C
order and needs no map.

Reference: Wang, Bai, Pekhimenko, "BPPSA: Scaling Back-propagation by Parallel Scan Algorithm",
MLSys 2020, section "Sparse Jacobians".
"""

from __future__ import annotations

import functools
import math
import operator
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bppsa.scan._sparse import Pattern, Sparse

_CACHE_SIZE = 32  # patterns of distinct geometries kept; VGG-11 has ~20 layers


# ---------------------------------------------------------------------------------------------
# argument checks (on static shapes only: they raise before any tracing)


def pair(name: str, value, *, minimum: int) -> tuple[int, int]:
    """``value`` (an int or a pair of ints, each ``>= minimum``) as a pair of Python ints.

    Raises:
        TypeError: not an int or a pair of ints.
        ValueError: an int below ``minimum``.
    """
    items = value if isinstance(value, tuple | list) else (value, value)
    if len(items) != 2 or not all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items
    ):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}.")
    if min(items) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}.")
    return int(items[0]), int(items[1])


def _static_mask(mask, shape: tuple[int, ...], name: str = "mask") -> np.ndarray | Array | None:
    """``None``, a concrete mask as a NumPy bool array, or a traced mask as is (with a warning).

    A mask without a static value cannot shape the pattern: the caller then keeps the full
    pattern and multiplies the values by the mask.
    """
    if mask is None:
        return None
    mask_shape = tuple(getattr(mask, "shape", np.shape(mask)))
    if mask_shape != tuple(shape):
        raise ValueError(f"{name} must have the weight's shape {tuple(shape)}, got {mask_shape}.")
    try:
        return np.asarray(mask).astype(bool)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        warnings.warn(
            f"{name} is traced (it has no static value), so the sparse pattern keeps every "
            "weight and pruned entries are stored as explicit zeros. Close over the mask as a "
            "NumPy (or concrete) array, rather than passing it as an argument of a jitted "
            "function, for the pattern to exclude pruned entries.",
            UserWarning,
            stacklevel=3,
        )
        return mask


def _mask_key(mask: np.ndarray | None) -> bytes | None:
    """A hashable cache key that determines a concrete mask of a known shape."""
    return None if mask is None else np.packbits(mask.ravel()).tobytes()


def _unpack_mask(key: bytes | None, size: int) -> np.ndarray | None:
    if key is None:
        return None
    return np.unpackbits(np.frombuffer(key, np.uint8), count=size).astype(bool)


# ---------------------------------------------------------------------------------------------
# Conv2d


def _axis_pairs(n_in: int, k: int, stride: int, pad: int) -> tuple[np.ndarray, ...]:
    """Along one spatial axis: the triples ``(h, oy, ky)`` with ``h = oy * stride + ky - pad``
    inside ``[0, n_in)``, sorted by ``(h, oy)``, and the start of each ``h``'s group."""
    n_out = (n_in + 2 * pad - k) // stride + 1
    oy, ky = np.meshgrid(np.arange(n_out), np.arange(k), indexing="ij")
    h = oy * stride + ky - pad
    inside = (h >= 0) & (h < n_in)
    h, oy, ky = h[inside], oy[inside], ky[inside]
    order = np.lexsort((oy, h))
    h, oy, ky = h[order], oy[order], ky[order]
    counts = np.bincount(h, minlength=n_in)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return oy, ky, counts, starts


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _conv_pattern(
    out_ch: int,
    in_ch: int,
    kernel: tuple[int, int],
    input_hw: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    mask_key: bytes | None,
) -> tuple[Pattern, np.ndarray, bool]:
    """The pattern of a convolution's ``J^T``, the static gather indices of its values into the
    weight transposed to ``(I, O, kh, kw)``, and whether they index its ``(I, O*kh*kw)`` rows.

    Algorithm summary: entry ``(x[i, h, w], y[o, oy, ox])`` exists iff ``h = oy*sh + ky - ph``
    and ``w = ox*sw + kx - pw`` for some kernel slot ``(ky, kx)`` (unique when it exists), with
    value ``weight[o, i, ky, kx]``. The valid ``(h, oy, ky)`` and ``(w, ox, kx)`` triples are
    listed per axis (small); the entries of one input channel are the ragged blocks ``(h, w)``
    of size ``O * count_h * count_w``, laid out block after block in row order and, inside a
    block, in ``(o, oy, ox)`` order, which is column order: the result is sorted by construction
    (no sort of the ``nnz`` entries). Input channels repeat this with a row offset.
    """
    (H, W), (kh, kw) = input_hw, kernel
    oy_of, ky_of, count_h, start_h = _axis_pairs(H, kh, stride[0], padding[0])
    ox_of, kx_of, count_w, start_w = _axis_pairs(W, kw, stride[1], padding[1])
    n_oh = (H + 2 * padding[0] - kh) // stride[0] + 1
    n_ow = (W + 2 * padding[1] - kw) // stride[1] + 1

    # The entries of input channel 0.
    per_pixel = np.outer(count_h, count_w).ravel()  # (H*W,): output pixels that see (h, w)
    sizes = out_ch * per_pixel
    block = np.repeat(np.arange(H * W), sizes)
    t = np.arange(block.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    hh, ww = block // W, block % W
    o, rest = np.divmod(t, per_pixel[block])
    a, b = np.divmod(rest, count_w[ww])
    pair_h, pair_w = start_h[hh] + a, start_w[ww] + b
    rows0 = block.astype(np.int32)
    cols0 = (o * (n_oh * n_ow) + oy_of[pair_h] * n_ow + ox_of[pair_w]).astype(np.int32)
    taps0 = (o * (kh * kw) + ky_of[pair_h] * kw + kx_of[pair_w]).astype(np.int32)

    # Every input channel: rows offset by channel, the same columns and kernel taps.
    channel = np.arange(in_ch, dtype=np.int32)[:, None]
    rows = (channel * np.int32(H * W) + rows0).ravel()
    cols = np.broadcast_to(cols0, (in_ch, cols0.size)).ravel()
    shape = (in_ch * H * W, out_ch * n_oh * n_ow)
    mask = _unpack_mask(mask_key, out_ch * in_ch * kh * kw)
    if mask is None:
        return Pattern(rows, cols, shape), taps0, True
    # Index into the (I, O, kh, kw) transposed weight; the mask is in (O, I, kh, kw) order.
    flat = (channel * np.int32(out_ch * kh * kw) + taps0).ravel()
    o_of, tap = np.divmod(taps0, kh * kw)
    keep = mask[(o_of * (in_ch * kh * kw) + tap)[None, :] + channel * (kh * kw)].ravel()
    return Pattern(rows[keep], cols[keep], shape), flat[keep], False


def conv2d_jacobian_t(
    weight: Array,
    input_hw: tuple[int, int],
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    mask=None,
) -> Sparse:
    """``J^T`` of a 2-D convolution (cross-correlation, ``groups=1``, no dilation), per example.

    The forward is ``jax.lax.conv_general_dilated(x, weight, stride, [(ph, ph), (pw, pw)],
    dimension_numbers=("NCHW", "OIHW", "NCHW"))`` (PyTorch's ``Conv2d``; the bias does not enter
    the Jacobian). The map is the same for every example, and entries that would read the
    zero padding are absent.

    Args:
        weight: ``(O, I, kh, kw)``, may be traced.
        input_hw: ``(H, W)`` of the input ``(I, H, W)``.
        stride: an int or a pair ``(sh, sw)``, each ``>= 1``.
        padding: an int or a pair ``(ph, pw)``, each ``>= 0`` (zeros, both sides).
        mask: optional boolean array of the weight's shape, False for pruned weights. When it
            is concrete (NumPy, or a concrete JAX array closed over by a jitted function) the
            pruned entries are absent from the pattern; when traced, the pattern keeps every
            weight, the values are ``weight * mask``, and a ``UserWarning`` is emitted.

    Returns:
        A :class:`~bppsa.scan.Sparse` of shape ``(I*H*W, O*OH*OW)`` with values ``(1, nnz)``.

    Raises:
        ValueError: ``weight`` not 4-D, a bad ``input_hw``, ``stride`` or ``padding``, a kernel
            larger than the padded input, or a ``mask`` of another shape.
    """
    shape = tuple(getattr(weight, "shape", np.shape(weight)))
    if len(shape) != 4:
        raise ValueError(f"weight must be 4-D (O, I, kh, kw), got shape {shape}.")
    out_ch, in_ch, kh, kw = (int(s) for s in shape)
    if min(shape) < 1:
        raise ValueError(f"weight must have non-empty dims, got shape {shape}.")
    input_hw = pair("input_hw", input_hw, minimum=1)
    stride = pair("stride", stride, minimum=1)
    padding = pair("padding", padding, minimum=0)
    padded = (input_hw[0] + 2 * padding[0], input_hw[1] + 2 * padding[1])
    if kh > padded[0] or kw > padded[1]:
        raise ValueError(
            f"the kernel {(kh, kw)} of weight is larger than the padded input {padded} "
            f"(input_hw={input_hw}, padding={padding})."
        )
    mask = _static_mask(mask, shape)
    traced_mask = mask is not None and not isinstance(mask, np.ndarray)
    key = None if mask is None or traced_mask else _mask_key(mask)
    pattern, index, tiled = _conv_pattern(out_ch, in_ch, (kh, kw), input_hw, stride, padding, key)
    weight = jnp.asarray(weight)
    if traced_mask:
        weight = weight * jnp.asarray(mask).astype(weight.dtype)
    w_t = jnp.transpose(weight, (1, 0, 2, 3))  # (I, O, kh, kw): input channel outermost
    # Unpruned: the index of one input channel's entries (nnz / I long), shared by every
    # channel's row of w_t; pruned: one index per kept entry.
    values = w_t.reshape(in_ch, -1)[:, index].reshape(-1) if tiled else w_t.reshape(-1)[index]
    return Sparse(values[None], pattern)


# ---------------------------------------------------------------------------------------------
# Linear


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _linear_pattern(
    n_out: int, n_in: int, mask_key: bytes | None
) -> tuple[Pattern, np.ndarray | None]:
    """The pattern of ``W^T: (in, out)`` and, for a mask, the indices of the kept entries of
    ``W^T`` flattened (row-major order of ``W^T`` is the pattern's order)."""
    rows = np.repeat(np.arange(n_in, dtype=np.int32), n_out)
    cols = np.tile(np.arange(n_out, dtype=np.int32), n_in)
    mask = _unpack_mask(mask_key, n_out * n_in)
    if mask is None:
        return Pattern(rows, cols, (n_in, n_out)), None
    keep = np.flatnonzero(mask.reshape(n_out, n_in).T.ravel()).astype(np.int32)
    return Pattern(rows[keep], cols[keep], (n_in, n_out)), keep


def linear_jacobian_t(weight: Array, *, mask=None) -> Sparse:
    """``J^T = W^T`` of ``y = x @ W^T + b`` (PyTorch's ``Linear``), per example.

    Args:
        weight: ``(out, in)``, may be traced.
        mask: optional boolean array of the weight's shape; pruned entries are absent from the
            pattern when it is concrete (the same rules as :func:`conv2d_jacobian_t`).

    Returns:
        A :class:`~bppsa.scan.Sparse` of shape ``(in, out)`` with values ``(1, nnz)``.
    """
    shape = tuple(getattr(weight, "shape", np.shape(weight)))
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"weight must be 2-D (out, in) and non-empty, got shape {shape}.")
    mask = _static_mask(mask, shape)
    traced_mask = mask is not None and not isinstance(mask, np.ndarray)
    key = None if mask is None or traced_mask else _mask_key(mask)
    pattern, keep = _linear_pattern(*shape, key)
    weight = jnp.asarray(weight)
    if traced_mask:
        weight = weight * jnp.asarray(mask).astype(weight.dtype)
    values = weight.T.reshape(-1)
    if keep is not None:
        values = values[keep]
    return Sparse(values[None], pattern)


# ---------------------------------------------------------------------------------------------
# ReLU, Flatten


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _diagonal(n: int) -> Pattern:
    return Pattern.diagonal(n)


def _require_float(x, name: str) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got {jnp.result_type(x)}.")


def relu_jacobian_t(x: Array) -> Sparse:
    """``J^T = diag(relu'(x))`` of ``jax.nn.relu``, one per example, on the FULL diagonal.

    The slope is 1 where ``x > 0`` and 0 elsewhere, at ``x == 0`` (and NaN) included: the
    derivative ``jax.grad(jax.nn.relu)`` uses. Zeros are stored, so that the pattern does not
    depend on the data.

    Args:
        x: ``(B, *shape)``, the ReLU's input; ``n = prod(shape)``.

    Returns:
        A :class:`~bppsa.scan.Sparse` of shape ``(n, n)`` with values ``(1, B, n)``.
    """
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if len(shape) < 1:
        raise ValueError(f"x must have a batch axis, (B, *shape), got shape {shape}.")
    _require_float(x, "x")
    x = jnp.asarray(x)
    n = math.prod(shape[1:])
    slope = (x > 0).astype(x.dtype).reshape(shape[0], n)
    return Sparse(slope[None], _diagonal(n))


def identity_jacobian_t(n: int, dtype=jnp.float32) -> Sparse:
    """``J^T = I_n`` (Flatten in C order, or any reshape), shared by the batch: values
    ``(1, n)`` of ones."""
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    return Sparse(jnp.ones((1, n), dtype), _diagonal(n))


# ---------------------------------------------------------------------------------------------
# MaxPool2d


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _maxpool_pattern(
    channels: int, input_hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int]
) -> tuple[Pattern, np.ndarray, np.ndarray, np.ndarray]:
    """The pattern over every window slot, the input index of each slot (slot order
    ``(c, oy, ox, ky, kx)``), and per pattern entry its output index and slot in the window."""
    (H, W), (kh, kw), (sh, sw) = input_hw, kernel, stride
    n_oh, n_ow = (H - kh) // sh + 1, (W - kw) // sw + 1
    c, oy, ox, ky, kx = np.meshgrid(
        np.arange(channels),
        np.arange(n_oh),
        np.arange(n_ow),
        np.arange(kh),
        np.arange(kw),
        indexing="ij",
    )
    rows = (c * (H * W) + (oy * sh + ky) * W + (ox * sw + kx)).ravel()
    cols = (c * (n_oh * n_ow) + oy * n_ow + ox).ravel()
    pattern, order = Pattern.from_coo(rows, cols, (channels * H * W, channels * n_oh * n_ow))
    slot = np.tile(np.arange(kh * kw, dtype=np.int32), cols.size // (kh * kw))[order]
    return pattern, rows.astype(np.int32), pattern.cols, slot


def _first_max_slot(windows: Array) -> Array:
    """``windows: (..., K) -> (...)`` int32: the slot that the gradient of ``reduce_window``
    max routes the cotangent to.

    JAX differentiates it with XLA's ``select_and_scatter_add(select=ge)``: scanning the window
    in row-major order, the selected slot is kept while ``selected >= current``, so among equal
    maxima the FIRST wins (and a NaN loses to whatever follows it). The fold below is that rule
    to the letter; ``jnp.argmax`` would differ on NaNs.
    """
    best = windows[..., 0]
    index = jnp.zeros(best.shape, jnp.int32)
    for k in range(1, windows.shape[-1]):
        current = windows[..., k]
        keep = best >= current
        best = jnp.where(keep, best, current)
        index = jnp.where(keep, index, k)
    return index


def maxpool2d_jacobian_t(
    x: Array, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None
) -> Sparse:
    """``J^T`` of a 2-D max pooling (PyTorch's ``MaxPool2d``: no padding, floor mode), per
    example, over EVERY window slot.

    The forward is ``jax.lax.reduce_window(x, -inf, jax.lax.max, (1, 1, kh, kw), (1, 1, sh, sw),
    "VALID")``. Entry ``(input index, output index)`` exists for each slot of each window (the
    pattern depends only on the geometry); its value is 1 where the gradient of that forward
    routes the output's cotangent (the first maximum of the window in row-major order, on ties)
    and 0 elsewhere. Overlapping windows (``stride < kernel_size``) are fine: an input position
    then has one entry per window that contains it.

    Args:
        x: ``(B, C, H, W)``, the pool's input.
        kernel_size: an int or a pair ``(kh, kw)``.
        stride: an int or a pair; defaults to ``kernel_size``.

    Returns:
        A :class:`~bppsa.scan.Sparse` of shape ``(C*H*W, C*OH*OW)`` with values ``(1, B, nnz)``.
    """
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if len(shape) != 4:
        raise ValueError(f"x must be 4-D (B, C, H, W), got shape {shape}.")
    _require_float(x, "x")
    kernel = pair("kernel_size", kernel_size, minimum=1)
    stride = kernel if stride is None else pair("stride", stride, minimum=1)
    batch, channels, H, W = shape
    if kernel[0] > H or kernel[1] > W:
        raise ValueError(f"kernel_size {kernel} is larger than the input {(H, W)}.")
    pattern, slot_input, entry_output, entry_slot = _maxpool_pattern(
        channels, (H, W), kernel, stride
    )
    x = jnp.asarray(x)
    windows = x.reshape(batch, -1)[:, slot_input].reshape(batch, -1, kernel[0] * kernel[1])
    chosen = _first_max_slot(windows)  # (B, C*OH*OW)
    values = (chosen[:, entry_output] == entry_slot).astype(x.dtype)
    return Sparse(values[None], pattern)


# ---------------------------------------------------------------------------------------------


def sparsity(jac_t: Sparse) -> float:
    """The fraction of guaranteed zeros of a map: ``1 - nnz / (n_rows * n_cols)`` of its pattern
    (stored zeros, such as a ReLU's zero slopes, count as non-zeros)."""
    n_rows, n_cols = jac_t.pattern.shape
    return 1.0 - jac_t.pattern.nnz / (n_rows * n_cols)
