"""A stacked recurrent language model over tokens (e.g. characters): embedding, ``L`` residual
blocks of [RMSNorm -> recurrent cell over the sequence; RMSNorm -> GELU MLP], final RMSNorm,
linear head.

Each block's recurrence is ONE :func:`bppsa.scan` over the time axis, so the method of its
backward (``bppsa.Sequential()``: back-propagation; ``bppsa.Blelloch()``, ``bppsa.Auto()``, ...)
and its forward (``"sequential"`` or ``bppsa.Newton()``) are chosen per call, or by an enclosing
:func:`bppsa.grad`. The blocks are a pre-norm residual stack as in Transformers, with the cell in
place of attention; ParaRNN's language models (Danieli et al., arXiv 2510.21450) wrap the cell in
more (input and output projections, a short causal convolution, an output gate), left out here.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from jax import Array

from bppsa.models._cells import Cell
from bppsa.models._diagonal_cells import DiagonalGRU
from bppsa.scan._core.api import scan

EPS = 1e-6  # of RMSNorm


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """Next-token logits of one sequence of integer tokens; batch by ``jax.vmap``.

    Attributes:
        vocab_size: ``V``, the number of tokens.
        width: ``H``, the size of the residual stream and of every cell's hidden state.
        layers: ``L``, residual blocks.
        cell: the cell type of every block, a :class:`bppsa.models.Cell` (default
            :class:`DiagonalGRU`; also :class:`CIFGLSTM`, :class:`IndRNN`, :class:`GRU`,
            :class:`LSTM`, ...), stepped with input and hidden size ``H``.
        expansion: the MLP's hidden size is ``expansion * H``.

    Parameters (:meth:`init`)::

        {"embedding": (V, H),
         "blocks": [  # L of them
             {"cell_norm": (H,), "cell": <the cell's parameters, input and hidden size H>,
              "mlp_norm": (H,), "mlp": {"weight_in": (E*H, H), "bias_in": (E*H,),
                                        "weight_out": (H, E*H), "bias_out": (H,)}}],
         "norm": (H,),
         "head": {"weight": (V, H), "bias": (V,)}}

    Each block maps the residual stream ``s: (T, H)`` to
    ``s + cell_outputs(rmsnorm(s))``, then ``s + mlp(rmsnorm(s))`` with
    ``mlp(v) = W_out gelu(W_in v + b_in) + b_out``; the cell starts from its zero state.

    Example::

        model = LanguageModel(vocab_size=65, width=128, layers=2, cell=CIFGLSTM())
        params = model.init(key=jax.random.key(0))
        tokens = jnp.zeros((8, 256), jnp.int32)  # (B, T)

        def batch_loss(params, tokens):
            losses = jax.vmap(model.loss, in_axes=(None, 0, 0))(
                params, tokens[:, :-1], tokens[:, 1:])
            return losses.mean()

        grads = bppsa.grad(batch_loss, method=bppsa.Blelloch())(params, tokens)
    """

    vocab_size: int
    width: int
    layers: int
    cell: Cell = dataclasses.field(default_factory=DiagonalGRU)
    expansion: int = 4

    def __post_init__(self):
        for name in ("vocab_size", "width", "layers", "expansion"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if not isinstance(self.cell, Cell):
            raise TypeError(f"cell must be a bppsa.models.Cell, got {self.cell!r}.")

    # -- parameters -----------------------------------------------------------------------------

    def init(self, *, key: Array, dtype=jnp.float32) -> dict:
        """Embedding ``N(0, 1)`` (rows of RMS 1, what the norms expect), norm scales 1, the cells'
        own initialization, linear layers like PyTorch's ``nn.Linear``
        (``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``)."""
        h, hidden = self.width, self.expansion * self.width
        k_embed, k_head, *k_blocks = jax.random.split(key, 2 + self.layers)
        blocks = []
        for k in k_blocks:
            k_cell, k_in, k_out = jax.random.split(k, 3)
            w_in, b_in = _linear(k_in, hidden, h, dtype)
            w_out, b_out = _linear(k_out, h, hidden, dtype)
            blocks.append(
                {
                    "cell_norm": jnp.ones((h,), dtype),
                    "cell": self.cell.init(h, h, key=k_cell, dtype=dtype),
                    "mlp_norm": jnp.ones((h,), dtype),
                    "mlp": {
                        "weight_in": w_in,
                        "bias_in": b_in,
                        "weight_out": w_out,
                        "bias_out": b_out,
                    },
                }
            )
        w_head, b_head = _linear(k_head, self.vocab_size, h, dtype)
        return {
            "embedding": jax.random.normal(k_embed, (self.vocab_size, h), dtype),
            "blocks": blocks,
            "norm": jnp.ones((h,), dtype),
            "head": {"weight": w_head, "bias": b_head},
        }

    # -- the whole sequence ---------------------------------------------------------------------

    def logits(self, params: dict, tokens: Array, *, method=None, forward=None) -> Array:
        """Logits ``(T, V)`` of the next token after each of ``tokens: (T,)`` (integers).

        Args:
            params: as :meth:`init` returns.
            tokens: ``(T,)`` integers in ``[0, V)``; one sequence (``jax.vmap`` for a batch).
            method: the backward method of every block's :func:`bppsa.scan` (``None``: that of
                the enclosing :func:`bppsa.grad`, else ``bppsa.Auto()``).
            forward: the forward pass of every block's scan (``None``: that of the enclosing
                :func:`bppsa.grad`, else ``"sequential"``; ``bppsa.Newton()`` for Newton).
        """
        self._check_tokens(tokens, "tokens")
        stream = params["embedding"][tokens]
        for block in params["blocks"]:
            cell_params = block["cell"]

            def body(state, x, cell_params=cell_params):
                state = self.cell(cell_params, state, x)
                return state, self.cell.output(state)

            inputs = _rms_norm(stream, block["cell_norm"])
            state0 = self.cell.initial_state(self.width, stream.dtype)
            _, outputs = scan(body, state0, inputs, method=method, forward=forward)
            stream = stream + outputs
            stream = stream + _mlp(block["mlp"], _rms_norm(stream, block["mlp_norm"]))
        return self._head(params, stream)

    def loss(
        self, params: dict, tokens: Array, targets: Array, *, method=None, forward=None
    ) -> Array:
        """Mean cross-entropy (nats) of ``targets: (T,)`` under :meth:`logits` of ``tokens``."""
        self._check_tokens(targets, "targets")
        if targets.shape != tokens.shape:
            raise ValueError(
                f"targets must have the shape of tokens {tokens.shape}, got {targets.shape}."
            )
        logits = self.logits(params, tokens, method=method, forward=forward)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def bits_per_character(
        self, params: dict, tokens: Array, targets: Array, *, method=None, forward=None
    ) -> Array:
        """:meth:`loss` in bits per token (``/ ln 2``): bits per character for characters."""
        loss = self.loss(params, tokens, targets, method=method, forward=forward)
        return loss / math.log(2.0)

    # -- one step at a time ---------------------------------------------------------------------

    def initial_states(self, dtype=jnp.float32) -> list:
        """Every block's zero cell state (of one sequence)."""
        return [self.cell.initial_state(self.width, dtype) for _ in range(self.layers)]

    def step(self, params: dict, states: list, token: Array) -> tuple[list, Array]:
        """One token: ``(states, token: ()) -> (new states, logits (V,))``; :meth:`logits` is
        this step scanned over the sequence from :meth:`initial_states`."""
        stream = params["embedding"][token]
        new_states = []
        for block, state in zip(params["blocks"], states, strict=True):
            state = self.cell(block["cell"], state, _rms_norm(stream, block["cell_norm"]))
            new_states.append(state)
            stream = stream + self.cell.output(state)
            stream = stream + _mlp(block["mlp"], _rms_norm(stream, block["mlp_norm"]))
        return new_states, self._head(params, stream)

    def generate(
        self, params: dict, prompt: Array, length: int, *, key: Array, temperature: float = 1.0
    ) -> Array:
        """``length`` tokens sampled after ``prompt: (P,)`` (``P >= 1``), ``(length,)``.

        Each token is drawn from ``softmax(logits / temperature)`` (``temperature=0``: the most
        likely token), with a key split from ``key`` per step: the same key gives the same text.
        ``length`` and ``temperature`` are Python numbers (static under ``jax.jit``).
        """
        self._check_tokens(prompt, "prompt")
        if prompt.shape[0] < 1:
            raise ValueError("prompt must hold at least one token.")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be a non-negative int, got {length!r}.")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}.")
        dtype = params["embedding"].dtype
        states, logits = jax.lax.scan(
            lambda states, token: self.step(params, states, token),
            self.initial_states(dtype),
            prompt,
        )

        def sample(carry, step_key):
            states, logits = carry
            if temperature == 0:
                token = jnp.argmax(logits)
            else:
                token = jax.random.categorical(step_key, logits / temperature)
            return self.step(params, states, token), token

        _, tokens = jax.lax.scan(sample, (states, logits[-1]), jax.random.split(key, length))
        return tokens

    # -- parts ----------------------------------------------------------------------------------

    def _head(self, params: dict, stream: Array) -> Array:
        head = params["head"]
        return _rms_norm(stream, params["norm"]) @ head["weight"].T + head["bias"]

    @staticmethod
    def _check_tokens(tokens: Array, name: str) -> None:
        if tokens.ndim != 1 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"{name} must be integers of shape (T,) for one sequence (jax.vmap for a "
                f"batch), got {tokens.dtype} of shape {tokens.shape}."
            )


def _rms_norm(x: Array, scale: Array) -> Array:
    """``x / rms(x) * scale`` over the last axis (Zhang & Sennrich, 2019)."""
    return x * jax.lax.rsqrt(jnp.mean(x**2, axis=-1, keepdims=True) + EPS) * scale


def _mlp(params: dict, x: Array) -> Array:
    hidden = jax.nn.gelu(x @ params["weight_in"].T + params["bias_in"], approximate=False)
    return hidden @ params["weight_out"].T + params["bias_out"]


def _linear(key: Array, out_size: int, in_size: int, dtype) -> tuple[Array, Array]:
    bound = 1.0 / math.sqrt(in_size)
    k_w, k_b = jax.random.split(key)
    weight = jax.random.uniform(k_w, (out_size, in_size), dtype, -bound, bound)
    return weight, jax.random.uniform(k_b, (out_size,), dtype, -bound, bound)
