"""Pallas' Mosaic GPU backend of the fused loops: the carry's products on tensor cores.

Algorithm summary. The examples of a batch are the rows of the kernel's arrays: a loop's
recurrence (traced for one example, every value a vector) runs on ``(64, n)`` arrays, one row
per example (a warpgroup's ``wgmma`` takes 64 rows; a batch pads to a multiple of 64, and each
block of the kernel's grid runs 64 rows). Under ``jax.vmap`` the batch becomes rows
(``custom_vmap``), not a grid of one-row programs. Each product of a carry-dependent vector
``v`` with a constant matrix ``W`` is ``plgpu.wgmma``: ``v``'s rows are stored to shared memory
and multiplied by ``W``, resident in shared memory for the whole loop (transposed: float32
operands enter the tensor cores as TF32, whose right operand is read K-major). At full float32
precision (a product whose precision is not asked lower: the library's default) the product is
split into three TF32 products, ``hi(v) hi(W) + hi(v) lo(W) + lo(v) hi(W)`` with ``hi(x)`` ``x``
rounded to TF32 and ``lo(x) = x - hi(x)`` (the 3xTF32 scheme); a product asked at
``Precision.DEFAULT`` runs as one TF32 product. Everything else of the step (elementwise
operations) runs in the products' register layout. Per-step residuals and the carries after
each step move by TMA: step ``t + 1``'s residuals are copied into the other of two buffers
during step ``t``; the new carry is written to one of two buffers, read by the next step and
copied out while it runs. The loop runs two steps an iteration, so every buffer is static.

Vector lanes pad to a multiple of 32 (one 128-byte swizzled row of float32); padded lanes of
the carry are zeroed at every step, and a product's operand is read with zeros there (a cell's
value in a padded lane may be infinite). Constants that are vectors (biases) and per-step
residuals of one example are broadcast to the rows outside the kernel.

Dense cells past one block. A loop whose matrices do not fit one block's shared memory (or
whose products are wider than one ``wgmma``) runs on a thread-block cluster of the fewest
blocks of :data:`CLUSTERS` that hold it: block ``j`` computes lane chunk ``j`` of every vector
(:func:`chunk`: 8, 16 or a multiple of 32 lanes), keeping only the columns of each matrix that
give its chunk. Every operation of the step but a product is lane by lane, so a block needs the
other blocks' lanes only for a product's operand: each block writes its chunk to an exchange in
global memory, all wait at one cluster barrier, and each reads the whole operand back, staged
into shared memory :data:`STAGE_LANES` lanes at a time (two exchange slots, one per step of a
pair, so that a step never overwrites what a block may still be reading). The exchange goes
through global memory (L2), not the peers' shared memory, because Mosaic GPU's interpreter
runs only the former: the kernel tested on the CPU is the kernel a device runs.

bfloat16. A loop's bfloat16 values are held as float32 in registers, each rounded to
bfloat16 after the operation that gives it (as the loop's jaxpr says: XLA may keep excess
precision between fused operations, so the values are not bit-equal to ``lax.scan``'s); a
bfloat16 product runs one ``wgmma`` on bfloat16 operands (its matrix kept once, two bytes an
entry) and float32 accumulation. Carries, residuals and the exchange stay float32 in memory.

:meth:`MosaicGPU.unsupported_loop` says what the kernel cannot run: types other than float32
and bfloat16, a product of mixed types, arrays other than vectors, products other than a
vector with a constant matrix, primitives outside its table, or shared memory beyond a block's
at 16 blocks.

This module is the backend behind the seam (what it runs, its envelope, the batch as rows);
:mod:`~bppsa.scan._core.fused.mosaic_layout` says where a loop's kernel keeps what, and
:mod:`~bppsa.scan._core.fused.mosaic_kernel` is the kernel, with JAX's API drift between its
versions. Where Pallas' Mosaic GPU backend cannot be imported, ``import bppsa`` still works and
its loops fall back to ``lax.scan`` with the reason (:meth:`MosaicGPU.missing`). On the CPU the
kernels run in Mosaic GPU's own interpreter where this JAX has it
(:func:`~bppsa.scan._core.fused.mosaic_kernel.interpreter`), else the loops run ``lax.scan``
there.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core.fused.backend import Backend, Footprint, Launch
from bppsa.scan._core.fused.mosaic_kernel import (
    ELEMENTWISE,
    IDENTITY,
    MISSING,
    RowsKernel,
    has_rule,
    interpreter,
)
from bppsa.scan._core.fused.mosaic_layout import (
    PROGRAMS,
    TYPES,
    Analysis,
    product_of,
)

NAME = "mosaic_gpu"


@functools.cache
def older_devices() -> str | None:
    """Why this machine's NVIDIA GPUs cannot run the kernels (``wgmma``: sm_90 and newer), or
    ``None`` (none older here; no GPU at all: the kernels are lowered or interpreted)."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return None
    for device in devices:
        capability = getattr(device, "compute_capability", None)
        if capability is not None and float(capability) < 9.0:
            sm = str(capability).replace(".", "")
            return f"Mosaic GPU's kernels need sm_90 or newer ({device.device_kind} is sm_{sm})"
    return None


class MosaicGPU(Backend):
    """Pallas' Mosaic GPU backend (NVIDIA sm_90 and newer): one warpgroup per 64 examples."""

    name: ClassVar[str] = NAME
    platform: ClassVar[str] = "cuda"
    tiles: ClassVar[bool] = False
    vmap_outside: ClassVar[bool] = True
    own_kernel: ClassVar[bool] = True

    def missing(self):
        return MISSING or older_devices()

    def interpretable(self):
        return interpreter() is not None

    def programs(self, kernels):
        return PROGRAMS

    # padded_shape, largest_tile, run_equations and masked serve the shared kernel (and its
    # default footprint); this backend brings its own kernel and footprint (Analysis)
    def padded_shape(self, shape):
        raise NotImplementedError("the Mosaic GPU kernel pads its own arrays (Analysis)")

    def unsupported(self, eqn) -> str | None:
        name = eqn.primitive.name
        for v in [*eqn.invars, *eqn.outvars]:
            if isinstance(v, Literal):
                if np.ndim(v.val) != 0:
                    return f"{name} of an array literal"
                continue
            dtype = np.dtype(v.aval.dtype)
            if dtype not in TYPES:
                return f"{name} of {dtype.name} (this kernel runs float32 and bfloat16)"
        if name == "dot_general":
            return None  # checked with the loop's constants (unsupported_loop)
        if name not in ELEMENTWISE:
            return f"{name} (no rule in the Mosaic GPU kernel's table)"
        lowered = "add" if name == "add_any" else name  # add_any runs as an add
        if name not in IDENTITY and not has_rule(lowered):
            return f"{name} (no rule in this JAX's Mosaic GPU lowering)"
        if name == "integer_pow" and eqn.params["y"] < 0:
            return "integer_pow with a negative power"
        if name in IDENTITY and eqn.invars[0].aval.shape != eqn.outvars[0].aval.shape:
            return f"{name} that changes a shape"
        for v in [*eqn.invars, *eqn.outvars]:
            if not isinstance(v, Literal) and len(v.aval.shape) != 1:
                return f"{name} of a {len(v.aval.shape)}-d array (this kernel runs vectors)"
        return None

    def unsupported_loop(self, loop) -> str | None:
        reason = super().unsupported_loop(loop)
        if reason is not None:
            return reason
        constants = set(loop.constant_residuals)
        for v in [*loop.carry_in, *loop.step_residuals]:
            if len(v.aval.shape) != 1:
                return f"a carry or per-step value of shape {v.aval.shape} (it runs vectors)"
        for v in loop.constant_residuals:
            if len(v.aval.shape) not in (1, 2):
                return f"a constant of shape {v.aval.shape} (it runs vectors and matrices)"
        for eqn in loop.recurrence:
            if eqn.primitive.name == "dot_general":
                found = product_of(eqn, constants)
                if isinstance(found, str):
                    return found
                types = {np.dtype(v.aval.dtype).name for v in [*eqn.invars, *eqn.outvars]}
                if len(types) > 1:
                    return f"a product of mixed types ({', '.join(sorted(types))})"
        return Analysis(loop).overflow()

    def largest_tile(self, eqn) -> int:
        raise NotImplementedError("the Mosaic GPU kernel sizes its own arrays (Analysis.tile)")

    def footprint(self, loop) -> Footprint:
        # a block's: its largest array, and its shared memory in float32 entries (PROGRAMS')
        analysis = Analysis(loop)
        return Footprint(analysis.tile, analysis.shared_bytes // 4)

    def run_equations(self, eqns, env, permuted=None, *, num_warps):
        raise NotImplementedError("the Mosaic GPU kernel evaluates its own equations")

    def masked(self, x, shape, fill):
        raise NotImplementedError("the Mosaic GPU kernel masks its own carries")

    def compiler_params(self, launch: Launch):
        return None

    def carries_after(
        self,
        split,
        length: int,
        init: Sequence[Any],
        constants: Sequence[Any],
        steps: Sequence[Any],
        *,
        launch: Launch,
        reverse: bool = False,
        name: str = "bppsa_fused_forward",
        tiled=None,
    ) -> list[Any]:
        """The carry leaves after every step, ``(T, *leaf)`` each, from one Mosaic GPU kernel
        (:func:`bppsa.scan._core.fused.kernel.carries_after`'s contract; ``tiled`` must be
        ``None``: this kernel runs the batch as rows, not tiles of lanes). Its interpreter
        (``Interpreted``) runs it with Mosaic GPU's."""
        if tiled is not None:
            raise ValueError("the Mosaic GPU kernel runs no tiles of lanes")
        interpret = None
        if self.interpret:
            interpret = interpreter()
            if interpret is None:
                raise NotImplementedError("this JAX has no Mosaic GPU interpreter")
        kernel = RowsKernel(split, length, reverse, launch.prefetch, name, interpret)
        ni, nk = len(init), len(constants)

        @jax.custom_batching.custom_vmap
        def by_rows(args):
            return kernel(args[:ni], args[ni : ni + nk], args[ni + nk :])

        @by_rows.def_vmap
        def _(axis_size, in_batched, args):
            (batched,) = in_batched
            if any(batched[ni : ni + nk]):  # constants that differ by example: a launch each
                whole = [
                    a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                    for a, b in zip(args, batched)
                ]
                outs = lax.map(by_rows, whole)
                return outs, [True] * len(outs)
            moved = []
            for i, (a, b) in enumerate(zip(args, batched)):
                if ni <= i < ni + nk:
                    moved.append(a)
                    continue
                if i < ni:  # (B, R, n) -> (B R, n)
                    a = a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                    moved.append(a.reshape(-1, a.shape[-1]))
                    continue
                # (B, T, R, n) -> (T, B R, n)
                a = (
                    jnp.moveaxis(a, 0, 1)
                    if b
                    else jnp.broadcast_to(a[:, None], (a.shape[0], axis_size, *a.shape[1:]))
                )
                moved.append(a.reshape(a.shape[0], -1, a.shape[-1]))
            outs = by_rows(moved)
            outs = [
                jnp.moveaxis(o.reshape(o.shape[0], axis_size, -1, o.shape[-1]), 1, 0) for o in outs
            ]
            return outs, [True] * len(outs)

        outs = by_rows([*(x[None] for x in init), *constants, *(s[:, None] for s in steps)])
        return [o[:, 0] for o in outs]

    def __eq__(self, other):
        return type(other) is MosaicGPU

    def __hash__(self):
        return hash(MosaicGPU)

    def __repr__(self) -> str:
        return "MosaicGPU()"
