"""TF32 emulated on the CPU: rounded products for the user's cells, a patch that rounds bppsa's
own products, and a float32 addition that rounds toward zero.

TF32 (NVIDIA's tensor cores; JAX's default float32 matmul precision on recent NVIDIA GPUs) rounds
each product's float32 operands to a 10-bit mantissa and accumulates the products in float32.
Here a TF32 product ``a @ b`` is ``round(a) @ round(b)`` at full float32 precision, ``round =
jax.lax.reduce_precision(., exponent_bits=8, mantissa_bits=10)``: a product of two 11-bit
significands is exact in float32, so only the operands' rounding and the float32 accumulation
remain (the accumulation order differs from a tensor core's). float64 is never rounded.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax import lax

from bppsa.jacobians import transposed_jacobian
from bppsa.scan import Structured, _precision

HIGHEST = lax.Precision.HIGHEST


def tf32(x: jax.Array) -> jax.Array:
    """``x`` rounded to TF32's 10-bit mantissa (to nearest) if it is float32, else ``x``."""
    if x.dtype != jnp.float32:
        return x
    return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)


def _full(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


@jax.custom_vjp
def _tf32_matmul(a, b):
    return _full(tf32(a), tf32(b))


def _tf32_matmul_fwd(a, b):
    a, b = tf32(a), tf32(b)
    return _full(a, b), (a, b)


def _tf32_matmul_bwd(saved, g):
    # XLA's transposes of a TF32 dot are TF32 dots: the cotangent is rounded BEFORE each product
    # (reduce_precision's own transpose would round each product's result instead).
    return jax.vjp(_full, *saved)[1](tf32(g))


_tf32_matmul.defvjp(_tf32_matmul_fwd, _tf32_matmul_bwd)


def user_matmul(a: jax.Array, b: jax.Array, rounded: bool) -> jax.Array:
    """The user's ``a @ b``: TF32 (the product and both products of its VJP) if ``rounded`` and
    both operands are float32, else full precision. Its derivative is straight through the
    rounding, as JAX's transpose of a TF32 dot. Reverse mode only (a ``custom_vjp``)."""
    if rounded and a.dtype == b.dtype == jnp.float32:
        return _tf32_matmul(a, b)
    return _full(a, b)


# The cells of bppsa.models (PyTorch's formulas and parameter layout) with their products
# through user_matmul, and bppsa.jacobians' analytic Jacobians recomputed the same way: on a GPU
# the builder's pre-activations are the user's products (traced in the user's scope).


def _pre_activations(params, h, x, rounded):
    gi = user_matmul(x, params["weight_ih"].T, rounded) + params["bias_ih"]
    gh = user_matmul(h, params["weight_hh"].T, rounded) + params["bias_hh"]
    return gi, gh


def _gru_gates(params, h, x, rounded):
    gi, gh = _pre_activations(params, h, x, rounded)
    i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
    r, z = jax.nn.sigmoid(i_r + h_r), jax.nn.sigmoid(i_z + h_z)
    return r, z, jnp.tanh(i_n + r * h_n), h_n


def _rnn_jacobian_t(params, h, x, rounded=False):
    gi, gh = _pre_activations(params, h, x, rounded)
    return Structured(u=params["weight_hh"].T, d=1 - jnp.tanh(gi + gh) ** 2)


def _gru_jacobian_t(params, h, x, rounded=False):
    r, z, n, h_n = _gru_gates(params, h, x, rounded)
    dn = (1 - z) * (1 - n**2)
    a, b, c = (h - n) * z * (1 - z), dn * r, dn * h_n * r * (1 - r)
    return Structured(u=params["weight_hh"].T, d=jnp.concatenate([c, a, b], -1), e=z, reps=3)


@transposed_jacobian(_rnn_jacobian_t)
def _rnn_cell(params, h, x, rounded=False):
    gi, gh = _pre_activations(params, h, x, rounded)
    return jnp.tanh(gi + gh)


@transposed_jacobian(_gru_jacobian_t)
def _gru_cell(params, h, x, rounded=False):
    _, z, n, _ = _gru_gates(params, h, x, rounded)
    return (1 - z) * n + z * h


_KINDS = {"rnn": (_rnn_cell, _rnn_jacobian_t), "gru": (_gru_cell, _gru_jacobian_t)}


@dataclasses.dataclass(frozen=True)
class EmulatedCell:
    """The RNN or GRU cell of :mod:`bppsa.models` (``kind``) whose products are TF32 if
    ``rounded``; its analytic transposed Jacobian is used by ``bppsa.scan``."""

    kind: str
    rounded: bool = False

    def initial_state(self, hidden_size: int, dtype=jnp.float32):
        return jnp.zeros((hidden_size,), dtype)

    def __call__(self, params, h, x):
        return _KINDS[self.kind][0](params, h, x, rounded=self.rounded)

    def jacobian_t(self, params, h, x) -> Structured:
        return _KINDS[self.kind][1](params, h, x, rounded=self.rounded)


@contextlib.contextmanager
def library_tf32(enabled: bool = True) -> Iterator[None]:
    """Within the block, bppsa's own products (``bppsa.scan._precision.matmul`` and ``einsum``,
    which the scan's modules call through the module) round both operands to TF32.

    JAX's tracing caches are cleared on entry and exit, so that no program traced with the other
    helpers is reused; the helpers are restored however the block ends.
    """
    if not enabled:
        yield
        return
    saved = _precision.matmul, _precision.einsum

    def matmul(a, b):
        return jnp.matmul(tf32(a), tf32(b), precision=_precision.current())

    def einsum(subscripts, *operands):
        return jnp.einsum(subscripts, *map(tf32, operands), precision=_precision.current())

    jax.clear_caches()
    _precision.matmul, _precision.einsum = matmul, einsum
    try:
        yield
    finally:
        _precision.matmul, _precision.einsum = saved
        jax.clear_caches()


def add_toward_zero(a: jax.Array, b: jax.Array) -> jax.Array:
    """float32 ``a + b`` rounded toward zero instead of to nearest (a truncating accumulator,
    as reported for tensor cores' float32 accumulation): the nearest sum, moved one ulp toward
    zero where it lies farther from zero than the exact sum (TwoSum's exact error says which)."""
    s = a + b
    b_part = s - a
    error = (a - (s - b_part)) + (b - b_part)  # s + error == a + b exactly
    return jnp.where(error * s < 0, jnp.nextafter(s, jnp.zeros_like(s)), s)
