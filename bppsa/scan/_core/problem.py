"""A scan prepared once for its forward and backward passes: checked, traced, measured.

:func:`prepare` does everything :func:`bppsa.scan` and :func:`bppsa.estimate_memory` share: it
checks the arguments (those ``lax.scan`` rejects, in its words), traces the body once
(:mod:`bppsa.scan._core.body`), promotes weakly typed initial carries as ``lax.scan`` does, and
reads
the ``jax.vmap`` batch the scan is traced under. The resulting :class:`Problem` is what the
methods see; its :attr:`Problem.footprint` is what ``Auto()`` and the memory guard weigh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bppsa.scan._core import arguments, tracing
from bppsa.scan._core.body import Body, trace_body
from bppsa.scan._core.carry import BatchedLayout, Layout, is_float, unstacked
from bppsa.scan._core.diagonal_paths import diagonal
from bppsa.scan._core.jaxprs import rules
from bppsa.scan._core.memory import Footprint, footprint
from bppsa.scan._core.stacked import steps_with_jacobians
from bppsa.scan._core.structure import Structure, carry_structure


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """One scan, as the backward methods see it.

    Attributes:
        body: the traced body (its step, hoisted constants and Jacobian kind).
        init: the (promoted) initial carry as shapes.
        length: ``T``.
        reverse: whether the scan runs from the end of ``xs`` (the methods see it flipped).
        batch: examples served at once through ``jax.vmap`` (read from the traces, or given).
        unroll: steps of the sequential forward's ``lax.scan`` unrolled per iteration, as in
            ``jax.lax.scan`` (plain back-propagation's backward transposes that loop).
        batched: whether the arrays the backward sees hold the batch themselves, on an axis
            after the step axis (``(T, B, ...)`` carries and ``xs``, ``(B, n)`` cotangents; see
            :meth:`batched_problem`). ``init``, ``xs`` and the footprint stay those of one
            example.
    """

    body: Body
    init: Any
    xs: Any
    length: int
    reverse: bool
    batch: int
    unroll: int | bool = 1
    batched: bool = False
    vmapped: bool = True  # whether a jax.vmap batches the scan (of size 1 too)
    # compare inferred structured Jacobians with the step at run time: True densely at a few
    # steps, None at one step on two vectors (the default), False not at all
    check_structure: bool | None = None

    def batched_problem(self) -> Problem:
        """This scan for a whole batch at once: the steps are vmapped over the examples (with
        the consts shared) inside the evaluation of all steps, so that the VJP's products for
        the shared parameters contract over steps and examples together."""
        return dataclasses.replace(self, batched=True)

    @functools.cached_property
    def example_layout(self) -> Layout:
        """How one example's carry packs into the vector the backward scan propagates."""
        return Layout.of(self.init, concat_last=self.body.analytic)

    @functools.cached_property
    def layout(self) -> Layout | BatchedLayout:
        """How the carry the backward sees packs into vectors (a batch of them if batched)."""
        return BatchedLayout(self.example_layout) if self.batched else self.example_layout

    @property
    def differentiable_carry(self) -> bool:
        """Whether the carry has float leaves with entries (else there is nothing to scan)."""
        return any(math.prod(shape) for shape in self.layout.shapes)

    def keeping_carries(self) -> Problem:
        """The same scan with the carry that entered each step as a second output of the step:
        ``ys -> (ys, carries_before)`` (what an outer derivative of the kept carries needs)."""
        return dataclasses.replace(self, body=self.body.keeping_carries())

    @functools.cached_property
    def structure(self) -> Structure | None:
        """The structure of an autodiff body's step Jacobians, found in its jaxpr (``None`` for
        analytic Jacobians, whose builder chose their element)."""
        if self.body.analytic:
            return None
        return self._carry_structure()

    def _carry_structure(self, transform: Callable = lambda carry_map: carry_map) -> Structure:
        """:func:`carry_structure` of the step's carry map (after ``transform``), at the
        shapes of one step."""

        def carry_map(carry, x, *consts):
            return transform(lambda c: self.body.step(c, x, *consts)[0])(carry)

        return carry_structure(carry_map, self.init, *self._step_shapes())

    def _step_shapes(self) -> tuple:
        """``(x, *consts)`` of one step, as shapes."""
        x = jax.tree.map(unstacked, self.xs)
        consts = [jax.ShapeDtypeStruct(jnp.shape(c), jnp.result_type(c)) for c in self.body.consts]
        return (x, *consts)

    @functools.cached_property
    def opaque_rules(self) -> tuple[str, ...]:
        """The ``jax.custom_vjp`` functions whose inputs the step's carry may reach (their
        names; :func:`bppsa.scan._core.jaxprs.rules.opaque_rules`): only back-propagation applies
        their backwards exactly unless the user says they are linear."""
        return rules.opaque_rules(
            lambda carry, x, *consts: self.body.step(carry, x, *consts)[:2],
            self.init,
            *self._step_shapes(),
        )

    @property
    def jacobians(self) -> str:
        """How the Jacobians are built, and in what structure: ``"analytic"``,
        ``"autodiff"`` (dense), or with a structure, e.g. ``"autodiff, diagonal"``,
        ``"analytic, block-diagonal k=2"``."""
        structure = self.footprint.structure
        return self.body.jacobians if structure is None else f"{self.body.jacobians}, {structure}"

    @property
    def dense_because(self) -> str | None:
        """Why an autodiff body's Jacobians are dense (``None`` otherwise)."""
        if self.structure is None or self.structure.kind != "dense":  # analytic or structured
            return None
        return self.structure.reason

    @functools.cached_property
    def quasi_structure(self) -> Structure | None:
        """For an autodiff body with dense Jacobians: the structure of the derivative of its
        element-aligned paths (:mod:`bppsa.scan._core.diagonal_paths`), if diagonal or
        block-diagonal; then quasi-Newton gets the diagonals of the Jacobians from a VJP per
        colour of that. ``None`` elsewhere (analytic or structured Jacobians are cheap to form
        whole; a derivative that moves elements gets the dense one's diagonal)."""
        if self.structure is None or self.structure.kind != "dense":  # analytic or structured
            return None
        structure = self._carry_structure(diagonal)
        return None if structure.kind == "dense" else structure

    def all_steps(self, jacobians: bool = True, quasi: bool = False) -> Callable:
        """``(consts, carries_before, xs) -> ((carries_after, ys), jac_t)`` over all steps
        (``jac_t`` ``None`` without ``jacobians``; with ``quasi``, only their diagonals where
        :attr:`quasi_structure` gives them cheaply, else whole)."""
        structure = self.structure
        if structure is not None and structure.kind == "dense":
            structure = None
        return steps_with_jacobians(
            self.body.step,
            self.example_layout,
            self.body.analytic,
            batched=self.batched,
            structure=structure,
            check=self.check_structure,
            reverse=self.reverse,
            jacobians=jacobians,
            diagonal=self.quasi_structure if quasi and jacobians else None,
        )

    @functools.cached_property
    def footprint(self) -> Footprint:
        """The scan's footprint, from the shapes of its stacked Jacobians."""
        if self.batched:
            return dataclasses.replace(self, batched=False).footprint
        layout = self.layout
        carries = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct((self.length, *a.shape), a.dtype), self.init
        )
        xs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.xs)
        _, jac_t = jax.eval_shape(self.all_steps(), self.body.consts, carries, xs)
        return footprint(
            jac_t,
            state=sum(math.prod(shape) for shape in layout.shapes),
            length=self.length,
            itemsize=jnp.dtype(layout.dtype).itemsize,
            batch=self.batch,
            vmapped=self.vmapped,
            inputs=sum(math.prod(a.shape[1:]) for a in jax.tree.leaves(self.xs) if is_float(a)),
            complex_leaves=tuple(
                f"{a.dtype.name}{list(a.shape)}" for a in arguments.complex_leaves(self.init)
            ),
        )


def prepare(
    f: Callable,
    init: Any,
    xs: Any,
    length: int | None,
    *,
    reverse: bool,
    batch: int | None,
    unroll: int | bool = 1,
    check_structure: bool | None = None,
) -> tuple[Problem, Any]:
    """Checks a scan's arguments and traces its body once (``check_structure``: see
    :mod:`bppsa.scan._core.structure_check`; ``None``: the default, sampled check).

    Returns:
        ``(problem, init)``, with ``init`` promoted to the carry's dtypes (weak types).

    Raises:
        TypeError, ValueError: for arguments ``lax.scan`` rejects, in its words.
    """
    if not callable(f):
        raise TypeError(f"bppsa.scan: f argument should be a callable, got {type(f).__name__}.")
    length = arguments.check_arguments(init, xs, length)
    unroll = arguments.check_unroll(unroll)
    arguments.check_like_lax_scan(lambda c, x: (c, None), init, xs, length, reverse)
    num_steps = arguments.num_steps(xs, length)
    x_example = jax.tree.map(unstacked, xs)
    body = trace_body(f, init, x_example)
    carry_out, _ = arguments.check_like_lax_scan(body.plain, init, xs, length, reverse)
    promoted = arguments.promote_weak_types(init, carry_out)
    if _avals(promoted) != _avals(init):  # a weakly typed init: trace again, as lax.scan does
        body = trace_body(f, promoted, x_example)
    vmapped = tracing.under_vmap((init, xs))
    if batch is None:
        batch = tracing.vmapped_batch_size((init, xs))
    problem = Problem(
        body=body,
        init=jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), a.dtype), promoted),
        xs=jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), xs),
        length=num_steps,
        reverse=reverse,
        batch=batch,
        unroll=unroll,
        vmapped=vmapped,
        check_structure=check_structure,
    )
    return problem, promoted


def _avals(tree) -> list:
    """Shapes, dtypes and weak types of the leaves (``ShapeDtypeStruct`` leaves included)."""
    out = []
    for leaf in jax.tree.leaves(tree):
        weak = isinstance(leaf, int | float | complex) or getattr(leaf, "weak_type", False)
        out.append((tuple(jnp.shape(leaf)), jnp.result_type(leaf), bool(weak)))
    return out
