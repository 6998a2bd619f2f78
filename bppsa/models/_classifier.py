"""The paper's sequence classifier: a recurrence over the sequence, a linear head on the last
hidden state, cross-entropy."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax import Array

from bppsa.models._cells import RNN, Cell
from bppsa.scan._core.api import scan


@dataclasses.dataclass(frozen=True)
class SequenceClassifier:
    """``logits = head(cell^T(h_0, x_1..x_T))``, with parameters as a dict pytree.

    Attributes:
        input_size, hidden_size, num_classes: layer sizes (the paper's RNN: 1, 20, 10).
        cell: a cell type from :mod:`bppsa.models` (default tanh ``RNN()``).

    Example:
        >>> model = SequenceClassifier(1, 20, 10)
        >>> params = model.init(key=jax.random.key(0))
        >>> xs, labels = jnp.ones((4, 100, 1)), jnp.array([0, 1, 2, 3])  # (B, T, 1), (B,)
        >>> grads = bppsa.grad(model.loss)(params, xs, labels)
        >>> grads["cell"]["weight_hh"].shape
        (20, 20)
    """

    input_size: int
    hidden_size: int
    num_classes: int
    cell: Cell = dataclasses.field(default_factory=RNN)

    def init(self, *, key: Array, dtype=jnp.float32) -> dict:
        """Cell parameters in PyTorch's layout, and a head initialized like ``nn.Linear``."""
        k_cell, k_w, k_b = jax.random.split(key, 3)
        bound = 1.0 / jnp.sqrt(self.hidden_size)
        shape_w = (self.num_classes, self.hidden_size)
        return {
            "cell": self.cell.init(self.input_size, self.hidden_size, key=k_cell, dtype=dtype),
            "head": {
                "weight": jax.random.uniform(k_w, shape_w, dtype, -bound, bound),
                "bias": jax.random.uniform(k_b, (self.num_classes,), dtype, -bound, bound),
            },
        }

    def logits(self, params: dict, xs: Array) -> Array:
        """Logits ``(num_classes,)`` of one sequence ``xs: (T, input_size)``."""
        if xs.ndim != 2 or xs.shape[-1] != self.input_size:
            raise ValueError(
                f"xs must have shape (T, {self.input_size}) for one sequence (vmap for a "
                f"batch), got {xs.shape}."
            )
        cell_params = params["cell"]
        state0 = self.cell.initial_state(self.hidden_size, xs.dtype)
        state, _ = scan(lambda s, x: (self.cell(cell_params, s, x), None), state0, xs)
        head = params["head"]
        return head["weight"] @ self.cell.output(state) + head["bias"]

    def loss(self, params: dict, xs: Array, labels: Array) -> Array:
        """Mean cross-entropy over a batch: ``xs: (B, T, input_size)``, ``labels: (B,)``."""
        if xs.ndim != 3 or labels.shape != xs.shape[:1]:
            raise ValueError(
                f"xs must be (B, T, {self.input_size}) and labels (B,); got {xs.shape} and "
                f"{labels.shape}."
            )
        logits = jax.vmap(self.logits, in_axes=(None, 0))(params, xs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
