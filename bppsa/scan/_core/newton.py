"""``bppsa.Newton()``: the forward pass solved by Newton iterations, each a parallel linear scan.

Algorithm summary (the parallel-in-time forward of DEER, Lim et al., ICLR 2024, with the
quasi-Newton variant of Gonzalez et al., NeurIPS 2024, made certified). The trajectory
``h_1, ..., h_T`` of ``h_t = f(h_{t-1}, x_t)`` is the root of the residual
``r_t = h_t - f(h_{t-1}, x_t)``. One Newton step linearizes every step at the current iterate
``h^k`` and solves the LINEAR recurrence

    ``h^{k+1}_t = J_t h^{k+1}_{t-1} + (f(h^k_{t-1}, x_t) - J_t h^k_{t-1})``,
    ``J_t = d f / d h (h^k_{t-1}, x_t)``,

with the known ``h_0`` as its leftmost element: a scan over affine maps, run forward in time by
the linear scan of Newton's ``solver`` (default: what ``bppsa.Auto()`` picks for a scan over
these Jacobians on the device, e.g. the modified Blelloch scan in ``2 ceil(log2(T + 1))``
levels on a GPU), whatever method the backward runs.
With ``quasi=True`` only the diagonal of ``J_t`` is used (elementwise products: cheap, but
linear instead of quadratic convergence). The first iterate is every step taken from ``h_0``,
``f(h_0, x_t)``, evaluated in parallel. In exact arithmetic, ``k`` iterations make the first
``k`` states exact, whatever the cell; on contractive cells convergence is much faster.

Certified: after every iteration, the residual of EVERY step is checked against ``tol`` relative
to the size of the states (see :class:`Newton`); the iterations stop when all steps pass, when
the number of leading steps that pass stops growing (rounding or divergence: chaotic cells,
overflow, NaN), or at ``max_iterations``. The leading steps that pass are kept and the rest of
the trajectory is computed sequentially from the end of that prefix, so the result is never an
unconverged trajectory: at worst it is ``lax.scan``'s, after the iterations tried.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from bppsa.scan import _algorithms
from bppsa.scan._core.forward import Forward, run_sequentially
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods import Method, Policy, as_policy, resolve
from bppsa.scan._profile import Profile

# Default tolerance, in units of the dtype's machine epsilon, of every step's residual relative
# to the size of the states (|r_t| <= tol (|f_t| + mean_t |f_t|), elementwise). Measured with
# benchmarks/newton.py (the paper's RNN and GRU, T = 100-100k): the converged iterates end with
# largest residuals of 1e-6 to 7e-6 in float32 (8-58 eps) and 1e-15 to 1.4e-14 in float64, so a
# tolerance of a few eps would send most scans to the fallback, while 64 eps (7.6e-6 in float32,
# 1.4e-14 in float64) stays at the rounding level of one step.
TOL_EPS = 64.0
# Default iteration limit: T iterations make every step exact in exact arithmetic, and
# MAX_ITERATIONS bounds them. Measured (benchmarks/newton.py): 2-5 iterations for the paper's
# RNN at initialization and its GRU, up to 41 for the RNN after a short training (float32,
# T = 30k, B = 16); expansive cells stall (and fall back) after 22-39.
MAX_ITERATIONS = 64


class NewtonInfo(NamedTuple):
    """What a Newton forward did (the argument of :class:`Newton`'s ``callback``).

    Attributes:
        iterations: Newton iterations run (linear scans solved).
        converged: whether every step's residual met the tolerance.
        prefix: how many leading steps met it (``length`` when converged).
        fallback_steps: steps computed sequentially after the prefix (0 when converged).
        residual: the largest residual of the last iterate, relative to the tolerance's scale,
            over the steps that met it (<= ``tol``).
        length: ``T``.
    """

    iterations: Any
    converged: Any
    prefix: Any
    fallback_steps: Any
    residual: Any
    length: Any


@dataclasses.dataclass(frozen=True)
class Newton(Forward):
    """The forward pass as Newton iterations on the whole trajectory, each a parallel scan.

    Use it as ``forward=bppsa.Newton()`` (or ``forward="newton"``) in :func:`bppsa.scan`,
    :func:`bppsa.grad` or :func:`bppsa.value_and_grad`. The trajectory is certified: every
    step's residual ``h_t - f(h_{t-1}, x_t)`` is within ``tol`` (elementwise, relative to
    ``|f(h_{t-1}, x_t)|`` plus the mean size of that state component over the trajectory), and
    when the iterations do not get there (an expansive or chaotic cell, a NaN), the steps after
    the converged prefix are computed sequentially; the result is then as accurate as
    ``lax.scan``'s. Gradients are the usual backward of the backward method on that trajectory
    (with full Jacobians, also when ``quasi=True``); the Jacobians of the evaluation that
    certified the trajectory are handed to it (``share_jacobians``), so that it does not form
    them again. See :mod:`bppsa.scan._core.newton`.

    Args:
        max_iterations: iteration limit (``None``: ``min(64, T)``; ``T`` iterations make every
            step exact in exact arithmetic).
        tol: residual tolerance relative to the states (``None``: 64 x the dtype's epsilon).
        quasi: use only the diagonals of the Jacobians (elementwise scans: cheaper iterations,
            more of them). For a cell whose Jacobians are dense, the diagonals come from its
            element-aligned paths, ``O(n)`` per step instead of forming ``n x n`` Jacobians
            (exact for Elman, GRU and LSTM cells, an approximation the certificate tolerates
            elsewhere: :mod:`bppsa.scan._core.diagonal_paths`).
        solver: the method whose linear scan solves each iteration's recurrence, or a policy
            that picks it per scan (a method name works too); ``None``: ``bppsa.Auto()``'s
            pick for a scan over these Jacobians on the default device (a parallel scan on
            accelerators, time blocks of the sequential one on CPUs). Independent of the
            backward's ``method``.
        callback: called as ``callback(info)`` with a :class:`NewtonInfo` of NumPy values every
            time the forward runs (through ``jax.debug.callback``, so also under ``jax.jit``).
        share_jacobians: keep the steps' Jacobians at the final trajectory (formed by the
            evaluation that certified it; for steps after an unconverged prefix, by the
            sequential continuation) for a backward that takes them whole (``Blelloch``,
            ``Chunked``, ``SequentialScan``): one evaluation of the Jacobians fewer, for
            holding them from the forward to the backward, and one more stack of them during
            the iterations (shared only where the scan's memory limit allows that).
            ``False``: the backward forms them.

    Example:
        >>> w = 0.5 * jnp.eye(3)
        >>> cell = lambda h, x: (jnp.tanh(w @ h + x), h)
        >>> xs = jnp.ones((1000, 3))
        >>> h, _ = bppsa.scan(cell, jnp.zeros(3), xs, forward=bppsa.Newton())
        >>> h_ref, _ = jax.lax.scan(cell, jnp.zeros(3), xs)
        >>> bool(jnp.allclose(h, h_ref, rtol=1e-6))
        True
    """

    max_iterations: int | None = None
    tol: float | None = None
    quasi: bool = False
    callback: Callable[[NewtonInfo], Any] | None = dataclasses.field(default=None, repr=False)
    solver: Method | Policy | None = None
    share_jacobians: bool = True
    name: ClassVar[str] = "newton"

    def __post_init__(self):
        it = self.max_iterations
        if it is not None and (isinstance(it, bool) or not isinstance(it, int) or it < 1):
            raise ValueError(f"Newton: max_iterations must be a positive int or None, got {it!r}.")
        tol = self.tol
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, int | float)):
            raise TypeError(f"Newton: tol must be a number or None, got {type(tol).__name__}.")
        if tol is not None and not tol > 0:
            raise ValueError(f"Newton: tol must be positive, got {tol!r}.")
        if not isinstance(self.quasi, bool):
            raise TypeError(f"Newton: quasi must be a bool, got {type(self.quasi).__name__}.")
        if not isinstance(self.share_jacobians, bool):
            kind = type(self.share_jacobians).__name__
            raise TypeError(f"Newton: share_jacobians must be a bool, got {kind}.")
        if self.callback is not None and not callable(self.callback):
            raise TypeError("Newton: callback must be callable or None.")
        if self.solver is not None:
            object.__setattr__(self, "solver", resolve(self.solver, argname="Newton: solver"))

    def solver_for(
        self,
        fp: Footprint,
        policy: Policy,
        profile: Profile,
        limit: float | None = math.inf,
    ) -> Method:
        """The method that solves the linear recurrences of a scan of footprint ``fp`` (its
        Jacobians'; diagonal ones with ``quasi``) within ``limit`` bytes: this Newton's
        ``solver``, else ``policy``'s pick by ``profile`` (asked by the scan's decision,
        :mod:`bppsa.scan._core.decision`).

        Raises:
            MemoryLimitError: no solver fits ``limit``.
        """
        if self.quasi:
            fp = dataclasses.replace(fp, element=fp.size, dense=fp.size, width=1)
        policy = as_policy(self.solver if self.solver is not None else policy)
        return policy.scan_method(fp, limit, profile=profile, jacobians=True)

    def iterations(self, length: int) -> int:
        """The iteration limit for ``length`` steps."""
        if self.max_iterations is not None:
            return self.max_iterations
        return max(1, min(MAX_ITERATIONS, length))

    def tolerance(self, dtype) -> float:
        return self.tol if self.tol is not None else TOL_EPS * float(jnp.finfo(dtype).eps)

    def iterates(self, problem) -> bool:
        """Whether this forward runs its iterations on ``problem`` (a real carry with entries,
        over steps); elsewhere it runs ``lax.scan``, or refuses a carry with integer leaves."""
        layout = problem.layout
        return problem.length > 0 and problem.differentiable_carry and all(layout.float_mask)

    def forms_jacobians(self, problem) -> bool:
        return self.iterates(problem)

    def shares_jacobians(self, problem) -> bool:
        # quasi-Newton on a dense autodiff cell forms only the diagonals (cheap_diagonals)
        return self.share_jacobians and self.iterates(problem) and not self.cheap_diagonals(problem)

    def cheap_diagonals(self, problem) -> bool:
        """Whether the iterations form only the diagonals of the Jacobians (``quasi`` on a
        cell whose Jacobians are dense: see :mod:`bppsa.scan._core.diagonal_paths`)."""
        return self.quasi and problem.quasi_structure is not None

    def resolved(self, problem, fp, policy, profile):
        """With its solver, where unset, picked by the scan's ``policy`` (its footprint differs
        with ``quasi``), independent of the backward's method; picked by the decision so that
        the plan shows it."""
        if isinstance(self.solver, Method) or not self.iterates(problem):
            return self
        return dataclasses.replace(self, solver=self.solver_for(fp, policy, profile))

    def __call__(self, problem, consts, init, xs, *, keep, prepared=None):
        return self._run(problem, consts, init, xs, keep=keep, jacobians=False)

    def with_jacobians(self, problem, consts, init, xs):
        return self._run(problem, consts, init, xs, keep=True, jacobians=True)

    def _run(self, problem, consts, init, xs, *, keep, jacobians):
        length, layout = problem.length, problem.layout
        if not all(layout.float_mask):
            raise TypeError(
                "bppsa.scan: forward=Newton() solves for the carry as real numbers; this carry "
                "has integer or boolean leaves. Use forward='sequential' (lax.scan)."
            )
        if not self.iterates(problem):
            if jacobians:
                raise ValueError("Newton: no Jacobians to share for a scan without a carry.")
            return run_sequentially(problem.body.step, consts, init, xs, length, keep)
        solver = self.solver
        if not isinstance(solver, Method) or not solver.keeps_carries:
            raise ValueError(  # the scan's decision picks one (bppsa.scan._core.decision)
                f"Newton: the forward runs with a solver that scans the Jacobians, got {solver!r}."
            )
        states, info, ys, jac_t = self.solve(problem, consts, init, xs, solver, jacobians)
        before = _unpack(layout, init, _shifted(layout.pack(init), states))
        if self.callback is not None:
            jax.debug.callback(self.callback, info)
        carry = layout.unpack_into(states[-1], init)
        if jacobians:
            return carry, (ys, before, jac_t)
        return carry, ((ys, before) if keep else ys)

    def solve(
        self, problem, consts, init, xs, method=None, jacobians=False
    ) -> tuple[jax.Array, NewtonInfo, Any, Any]:
        """The certified trajectory: ``(states, info, ys, jac_t)``, ``states[t]`` the packed
        carry after step ``t``, ``(T, *batch, n)``, the steps' outputs along it and, with
        ``jacobians``, their transposed Jacobians (else ``None``); each iteration's linear
        recurrence solved by ``method.forward_scan`` (a Jacobian method; ``None``: the modified
        Blelloch scan).

        The outputs and Jacobians come from the evaluation that certified the trajectory (and,
        for the steps after a converged prefix, from the sequential continuation): no
        evaluation of the steps after the last check."""
        layout, length = problem.layout, problem.length
        all_steps = problem.all_steps(quasi=self.quasi)
        h0 = layout.pack(init)
        tol = self.tolerance(layout.dtype)
        limit = self.iterations(length)

        def evaluate(states):
            """What the next iteration and the certificate need of ``states``: ``(f, maps,
            before, prefix, worst, ys, jac_t)``, ``f`` every step taken from its iterate
            ``before``, ``maps`` the Jacobians the next iteration's scan takes (their diagonals
            with ``quasi``), ``prefix`` the leading steps within the tolerance and ``worst``
            their largest residual."""
            before = _shifted(h0, states)
            (after, ys), jac_t = all_steps(consts, _unpack(layout, init, before), xs)
            f = layout.pack(after, stacked=True)
            scale = jnp.abs(f) + jnp.mean(jnp.abs(f), axis=0)
            ratio = jnp.abs(states - f) / jnp.where(scale > 0, scale, 1.0)
            ratio = jnp.where((states == f) & jnp.isfinite(f), 0.0, ratio)
            ok = jnp.all(ratio <= tol, axis=tuple(range(1, ratio.ndim)))
            prefix = jnp.where(jnp.all(ok), length, jnp.argmin(ok)).astype(jnp.int32)
            worst = jnp.max(jnp.where(ok.reshape(-1, *[1] * (ratio.ndim - 1)), ratio, 0.0))
            maps_t = jac_t.diagonal() if self.quasi else jac_t
            return f, maps_t, before, prefix, worst, ys, (jac_t if jacobians else None)

        def newton_step(states, f, maps_t, before):
            offsets = f - maps_t.transpose().apply(before)
            if method is None:
                new = _algorithms.blelloch(h0, maps_t.transpose().flip(), offsets[::-1])[::-1]
            else:
                new = method.forward_scan(h0, maps_t, offsets)
            new = new[1:]
            # Non-finite values (products of long spans of Jacobians that overflow, NaN inputs)
            # keep the previous iterate's, so that the next linearization is finite again.
            return jnp.where(jnp.isfinite(new), new, states)

        def cond(state):
            return ~state[2]

        def body(state):
            k, states, _, last_prefix, _, _, _ = state
            f, maps, before, prefix, worst, ys, jac_t = evaluate(states)
            stop = (prefix == length) | (prefix <= last_prefix) | (k >= limit)
            states = lax.cond(stop, lambda: states, lambda: newton_step(states, f, maps, before))
            # On a stop the states stay, and ``ys`` and ``jac_t`` are theirs.
            return k + jnp.where(stop, 0, 1), states, stop, prefix, worst, ys, jac_t

        # Every step taken from h_0 in parallel, f(h_0, x_t): measured (benchmarks/newton.py,
        # B = 16, float32) to save one iteration against h_0 itself for the RNN (3 -> 2 at
        # initialization; after training 8.0 -> 7.9 at T = 1k, 12.4 -> 10.8 at 10k), the same
        # for the GRU (3), for one evaluation of the steps instead of an iteration's scan.
        # (No Jacobians: the loop's first evaluation forms them at this guess; the loop state
        # starts with zeros in their place.)
        starts = _unpack(layout, init, jnp.broadcast_to(h0, (length, *h0.shape)))
        (after, ys), _ = problem.all_steps(jacobians=False)(consts, starts, xs)
        guess = layout.pack(after, stacked=True)
        jac_t = None
        if jacobians:
            shapes = jax.eval_shape(all_steps, consts, starts, xs)[1]
            jac_t = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
        zero = jnp.zeros((), h0.dtype)
        start = (jnp.int32(0), guess, jnp.bool_(False), jnp.int32(-1), zero, ys, jac_t)
        k, states, _, prefix, worst, ys, jac_t = lax.while_loop(cond, body, start)
        states, ys, jac_t = _continue_sequentially(
            problem, consts, init, xs, states, ys, jac_t, prefix
        )
        info = NewtonInfo(
            iterations=k,
            converged=prefix == length,
            prefix=prefix,
            fallback_steps=length - prefix,
            residual=worst,
            length=jnp.int32(length),
        )
        return states, info, ys, jac_t


def _shifted(h0, states):
    """The packed carries entering every step: ``[h_0, states[:-1]]``."""
    return jnp.concatenate([h0[None], states[:-1]], axis=0)


def _unpack(layout, init, packed):
    """Packed stacked carries as a stacked carry pytree (every leaf is float, see Newton)."""
    return layout.unpack(packed, init, stacked=True)


def _continue_sequentially(problem, consts, init, xs, states, ys, jac_t, prefix):
    """``(states, ys, jac_t)`` with the steps from ``prefix`` on (their outputs and, unless
    ``jac_t`` is ``None``, their Jacobians) computed by the step itself, one after the other
    (none when ``prefix == T``)."""
    layout, step = problem.layout, problem.body.step
    h0 = layout.pack(init)
    one_step = problem.all_steps() if jac_t is not None else None

    def cond(state):
        return state[0] < problem.length

    def body(state):
        t, h, states, ys, jac_t = state
        x = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, t, keepdims=False), xs)
        carry = layout.unpack_into(h, init)
        if jac_t is None:
            new, y, *_ = step(carry, x, *consts)
        else:  # the step with its Jacobian, as a stack of one
            one = jax.tree.map(lambda a: a[None], (carry, x))
            (new, y), jac = one_step(consts, *one)
            new, y = jax.tree.map(lambda a: a[0], (new, y))
            jac_t = jac_t.with_per_step(
                **{
                    name: lax.dynamic_update_slice_in_dim(old, jac.per_step()[name], t, axis=0)
                    for name, old in jac_t.per_step().items()
                    if old is not None
                }
            )
        h = layout.pack(new)
        ys = jax.tree.map(lambda a, v: lax.dynamic_update_index_in_dim(a, v, t, axis=0), ys, y)
        return t + 1, h, lax.dynamic_update_index_in_dim(states, h, t, axis=0), ys, jac_t

    h_start = jnp.where(prefix > 0, states[jnp.maximum(prefix - 1, 0)], h0)
    _, _, states, ys, jac_t = lax.while_loop(cond, body, (prefix, h_start, states, ys, jac_t))
    return states, ys, jac_t
