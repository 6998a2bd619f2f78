"""The three quantities of a gradient, each its own compiled program and its own measurement.

- ``total``: the whole gradient, ``jax.value_and_grad`` of the loss;
- ``forward``: the forward as it runs inside the gradient, the forward of ``jax.vjp`` (the loss
  and the residuals its backward needs);
- ``backward``: the pullback of that ``jax.vjp`` applied to residuals saved once.

None is a difference of two programs: a standalone forward (the jitted loss) is not the forward
inside a gradient (on an H200 it ran slower than the forward inside either gradient, issue 33),
so ``total - forward`` is not a backward.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from experiments.timing.kernels import kernel_seconds
from experiments.timing.protocol import Clock, interleaved

QUANTITIES = ("total", "forward", "backward")


def _forward(loss: Callable[..., jax.Array]) -> Callable[..., tuple[jax.Array, Any]]:
    def forward(params, *args):
        return jax.vjp(lambda p: loss(p, *args), params)

    return forward


def _backward(pullback: Callable[[jax.Array], tuple[Any]], cotangent: jax.Array) -> Any:
    (grads,) = pullback(cotangent)
    return grads


@dataclasses.dataclass(frozen=True, eq=False)
class GradientPrograms:
    """A loss's gradient as three compiled programs, with the arguments each is timed on.

    Attributes:
        total: ``(params, *args) -> (value, grads)``, ``jax.value_and_grad(loss)``.
        forward: ``(params, *args) -> (value, pullback)``, the forward of ``jax.vjp``; the
            pullback is a pytree of the residuals, returned from the program.
        backward: ``(pullback, cotangent) -> grads``, the pullback applied to residuals.
        args: ``(params, *args)``, the arguments of ``total`` and ``forward``.
        value: the loss, from the forward call that saved ``pullback``.
        pullback: the residuals of one forward call, the argument of every ``backward`` call.
        cotangent: ones like ``value``.
        compile_seconds: ``{quantity: seconds}`` to lower and compile each program.
    """

    total: jax.stages.Compiled
    forward: jax.stages.Compiled
    backward: jax.stages.Compiled
    args: tuple[Any, ...]
    value: jax.Array
    pullback: Any
    cotangent: jax.Array
    compile_seconds: Mapping[str, float]

    @classmethod
    def from_loss(cls, loss: Callable[..., jax.Array], params: Any, *args: Any) -> GradientPrograms:
        """Compiles the three programs of ``loss``'s gradient with respect to ``params``, and
        runs the forward once to save the residuals the backward is timed on.

        Every choice the gradient depends on belongs to ``loss`` (e.g. a ``bppsa.scan`` with
        its ``method=`` bound): the backward is traced here, outside any caller's context.

        Args:
            loss: ``loss(params, *args)``, a scalar float; arrays (pytrees of them) only.
            params: what the gradient is taken with respect to (a pytree of float arrays).
            *args: the other arguments of ``loss``.

        Returns:
            The programs, ready to call (``memory_analysis()`` and the like on each).

        Raises:
            TypeError: ``loss`` is not callable.
            ValueError: ``loss`` does not return a scalar float.

        Example:
            >>> programs = GradientPrograms.from_loss(lambda w, x: jnp.sum(jnp.tanh(w * x)),
            ...                                       jnp.ones(3), jnp.arange(3.0))
            >>> grads = programs.backward(programs.pullback, programs.cotangent)
        """
        if not callable(loss):
            raise TypeError(f"loss must be callable, got {type(loss).__name__}")
        args = (params, *args)
        compile_seconds = {}

        start = time.perf_counter()
        lowered = jax.jit(_forward(loss)).lower(*args)
        value_info = lowered.out_info[0]
        if value_info.shape != () or not jnp.issubdtype(value_info.dtype, jnp.floating):
            raise ValueError(
                "loss must return a scalar float (the gradient's cotangent is ones like it), "
                f"got shape {value_info.shape} and dtype {value_info.dtype}"
            )
        forward = lowered.compile()
        compile_seconds["forward"] = time.perf_counter() - start

        start = time.perf_counter()
        total = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
        compile_seconds["total"] = time.perf_counter() - start

        value, pullback = jax.block_until_ready(forward(*args))
        cotangent = jnp.ones_like(value)
        start = time.perf_counter()
        backward = jax.jit(_backward).lower(pullback, cotangent).compile()
        compile_seconds["backward"] = time.perf_counter() - start
        return cls(total, forward, backward, args, value, pullback, cotangent, compile_seconds)

    def calls(self) -> dict[str, Callable[[], Any]]:
        """``{"total": ..., "forward": ..., "backward": ...}``, each program bound to its
        arguments."""
        return {
            "total": functools.partial(self.total, *self.args),
            "forward": functools.partial(self.forward, *self.args),
            "backward": functools.partial(self.backward, self.pullback, self.cotangent),
        }

    def backward_kernel_ms(self, repeats: int = 3) -> float | None:
        """The device's kernel time of one backward call in milliseconds, the cross-check of
        the pullback timed alone (:func:`experiments.timing.kernels.kernel_seconds`); ``None`` on a
        CPU, which has no device kernels, or where the profile has none."""
        if jax.default_backend() == "cpu":
            return None
        seconds = kernel_seconds(self.backward, self.pullback, self.cotangent, repeats=repeats)
        return None if seconds is None else 1e3 * seconds


def time_gradients(
    programs: Mapping[str, GradientPrograms],
    rounds: int,
    *,
    others: Mapping[str, Callable[[], Any]] | None = None,
    seconds: float | None = None,
    min_rounds: int = 1,
    clock: Clock = time.perf_counter,
) -> dict[str, dict[str, list[float]]]:
    """Seconds of the three quantities of every gradient, all interleaved in the same rounds
    (:func:`experiments.timing.interleaved`: each timed call right after an untimed call of itself).

    Args:
        programs: ``{method name: its programs}``.
        rounds: the most rounds to run.
        others: calls without arguments timed in the same rounds (a standalone forward, a
            sequential chain, ...), by names distinct from those of ``programs``.
        seconds, min_rounds, clock: as in :func:`experiments.timing.interleaved`.

    Returns:
        ``{name: {quantity: [seconds of each round]}}``: for each of ``programs`` the
        quantities ``"total"``, ``"forward"`` and ``"backward"``; for each of ``others`` one
        quantity named as the call. Each entry is what :func:`experiments.timing.ms_fields` takes.

    Raises:
        ValueError: a name is both in ``programs`` and in ``others``.
    """
    others = others or {}
    if shared := sorted(set(programs) & set(others)):
        raise ValueError(f"names in both programs and others: {shared}")
    calls: dict[tuple[str, str], Callable[[], Any]] = {
        (name, quantity): call
        for name, program in programs.items()
        for quantity, call in program.calls().items()
    }
    calls |= {(name, name): call for name, call in others.items()}
    times = interleaved(calls, rounds, seconds=seconds, min_rounds=min_rounds, clock=clock)
    out: dict[str, dict[str, list[float]]] = {}
    for (name, quantity), ts in times.items():
        out.setdefault(name, {})[quantity] = ts
    return out
