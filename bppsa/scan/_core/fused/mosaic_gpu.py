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
the carry are zeroed at every step, so that products never read anything but zeros there.
Constants that are vectors (biases) and per-step residuals of one example are broadcast to the
rows outside the kernel. :meth:`MosaicGPU.unsupported_loop` says what the kernel cannot run:
types other than float32, arrays other than vectors, products other than a vector with a
constant matrix, primitives outside its table, or shared memory beyond a block's.

JAX's API drift between its versions (``plgpu.load``'s index, transposed references) stays in
this module; where Pallas' Mosaic GPU backend cannot be imported, ``import bppsa`` still works and
its loops fall back to ``lax.scan`` with the reason (:meth:`MosaicGPU.missing`). On the CPU the
kernels run in Mosaic GPU's own interpreter where this JAX has it (:func:`interpreter`), else
the loops run ``lax.scan`` there.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core import tracing
from bppsa.scan._core.fused.backend import Backend, Footprint, Launch
from bppsa.scan._core.jaxprs.walk import bind
from bppsa.scan._profile import FusedProgram

NAME = "mosaic_gpu"
ROWS = 64  # rows of one warpgroup's wgmma: the examples one block runs
LANES = 32  # float32 entries of one 128-byte swizzled row
SHARED_BYTES = 227 * 1024  # shared memory of one block on sm_90
MAX_COLUMNS = 256  # the widest wgmma
PREFETCH_REGISTERS = 64  # registers a thread may hold for the next step's residuals (ASSUMED)
# One block of one warpgroup: its widest array (a (64, 256) product) and its shared memory in
# float32 entries. Not measured: the limits of the hardware.
PROGRAMS = (FusedProgram(num_warps=4, max_tile=ROWS * MAX_COLUMNS, max_resident=SHARED_BYTES // 4),)

_MISSING: str | None = None
_RULES: frozenset[str] | None = None
_INTERPRETER: Any = None
try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError as err:  # pragma: no cover - JAX without it: the loops fall back, naming it
    pl = plgpu = None  # type: ignore[assignment]
    _MISSING = f"Pallas' Mosaic GPU backend cannot be imported here ({type(err).__name__}: {err})"
else:
    try:  # the primitives its lowering has a rule for, in the kernels' default semantics
        from jax._src.pallas.mosaic_gpu import core as _core
        from jax._src.pallas.mosaic_gpu import lowering as _lowering

        _semantics = (_core.CompilerParams().lowering_semantics, _core.PrimitiveSemantics.Warpgroup)
        _RULES = frozenset(p.name for p in _lowering.mosaic_lowering_rules[_semantics])
    except (ImportError, AttributeError, KeyError, TypeError) as err:  # pragma: no cover
        tracing.record_problem("fused", f"cannot read Pallas' Mosaic GPU lowering rules: {err}")
    # Mosaic GPU's own interpreter (private); JAX 0.10's cannot run plgpu.load (checked on
    # 0.10.2 and 0.12.1), so it counts from 0.12 on
    if jax.__version_info__ >= (0, 12):
        try:
            from jax._src.pallas.mosaic_gpu.interpret.params import (
                InterpretGPUParams as _INTERPRETER,
            )
        except ImportError:  # pragma: no cover - JAX moved it: the CPU runs lax.scan
            _INTERPRETER = None

# Elementwise primitives the kernel runs on its register arrays, where this JAX's Mosaic GPU
# lowering has a rule for them (has_rule; tests/core/test_fused_mosaic_gpu.py lowers each).
UNARY = frozenset({"neg", "exp", "log", "tanh", "logistic", "sqrt", "rsqrt", "abs"})
# Primitives that leave a vector as it is where its shape does not change: the value passes.
IDENTITY = frozenset({"copy", "copy_p", "reshape", "reshard", "sharding_constraint", "pvary"})
BINARY = frozenset({"add", "add_any", "sub", "mul", "div", "max", "min"})
ELEMENTWISE = UNARY | BINARY | IDENTITY | {"integer_pow", "convert_element_type", "square"}


def has_rule(name: str) -> bool:
    """Whether Mosaic GPU's lowering has a rule for the primitive called ``name`` (``True``
    where its table cannot be read)."""
    return True if _RULES is None else name in _RULES


def lanes(n: int) -> int:
    """``n`` padded to a whole number of swizzled rows."""
    return max(LANES, -(-int(n) // LANES) * LANES)


def rows(n: int) -> int:
    """``n`` examples padded to whole blocks."""
    return max(ROWS, -(-int(n) // ROWS) * ROWS)


def _full_precision(eqn) -> bool:
    """Whether ``eqn``'s product runs at full float32 precision (three TF32 products): unless
    its precision asks for the default (TF32 alone)."""
    precision = eqn.params.get("precision")
    if precision is None:
        return True
    if isinstance(precision, tuple):
        return any(p is not None and p != lax.Precision.DEFAULT for p in precision)
    return precision != lax.Precision.DEFAULT


def _product(eqn, constants) -> tuple[Any, Any, bool] | str:
    """``(vector, matrix, transposed)`` of a product of a vector with a constant matrix
    (``transposed``: the matrix is ``(N, K)``, the product ``W v``), or why it is not one."""
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
    a, b = eqn.invars
    if batch_l or batch_r or len(contract_l) != 1:
        return "a product with batch axes or several contracting axes"
    if isinstance(a, Literal) or isinstance(b, Literal):
        return "a product with a literal operand"
    if len(a.aval.shape) == 1 and len(b.aval.shape) == 2 and b in constants:
        if tuple(contract_r) == (0,):
            return a, b, False
        return a, b, True
    if len(a.aval.shape) == 2 and len(b.aval.shape) == 1 and a in constants:
        if tuple(contract_l) == (1,):
            return b, a, True
        return b, a, False
    return "a product other than a vector with a constant matrix (the loop's constants)"


class Analysis:
    """What a loop's kernel keeps where: its products and the residuals they read.

    Attributes:
        products: ``eqn -> (vector, matrix, transposed, full)`` of every product.
        matrices: the constant matrices, each ``(variable, transposed)`` once.
        vectors: the other constants (vectors).
        full: whether any product runs at full precision (the matrices kept twice, hi and lo).
        widest: lanes of the widest vector a product stages in shared memory.
        shared_bytes: the shared memory the kernel uses: its matrices (twice at full
            precision), a buffer of each carry, and one staged product operand (twice at full
            precision).
        prefetch: whether a step's residuals (and the vector constants) can be loaded during
            the step before, held in registers (up to :data:`PREFETCH_REGISTERS` a thread);
            else each step loads its own at its start.
    """

    def __init__(self, loop):
        constants = set(loop.constant_residuals)
        self.products: dict = {}
        matrices: list = []
        for eqn in loop.recurrence:
            if eqn.primitive.name == "dot_general":
                vector, matrix, transposed = _product(eqn, constants)
                full = _full_precision(eqn)
                self.products[eqn] = (vector, matrix, transposed, full)
                if (matrix, transposed) not in matrices:
                    matrices.append((matrix, transposed))
        self.matrices = matrices
        used = {m for m, _ in matrices}
        self.vectors = [v for v in loop.constant_residuals if v not in used]
        self.full = any(full for *_, full in self.products.values())
        self.widest = max((lanes(v.aval.shape[-1]) for v, *_ in self.products.values()), default=0)
        copies = 2 if self.full else 1
        entries = sum(copies * lanes(k) * lanes(n) for k, n in (m.aval.shape for m, _ in matrices))
        entries += ROWS * (
            sum(lanes(v.aval.shape[-1]) for v in loop.carry_in) + copies * self.widest
        )
        self.shared_bytes = 4 * entries
        held = [*loop.step_residuals, *self.vectors]
        self.prefetch = (
            sum(lanes(v.aval.shape[-1]) * ROWS // 128 for v in held) <= PREFETCH_REGISTERS
        )


def interpreter() -> Any | None:
    """Mosaic GPU's own interpreter's parameters (race detection on), or ``None`` where this
    JAX has none that runs these kernels."""
    return None if _INTERPRETER is None else _INTERPRETER(detect_races=True)


def _load(ref):
    """``ref`` (shared or global memory) read into registers in the products' layout."""
    if "idx" in inspect.signature(plgpu.load).parameters:  # JAX 0.10
        return plgpu.load(ref, (), layout=plgpu.Layout.WGMMA, optimized=False)
    return plgpu.load(ref, layout=plgpu.Layout.WGMMA, optimized=False)


def _transposed(ref):
    """``ref`` read transposed (its last two axes swapped)."""
    if hasattr(plgpu, "transpose_ref"):  # JAX 0.10
        return plgpu.transpose_ref(ref, (1, 0))
    return ref.transpose((1, 0))


def _swizzled() -> tuple:
    return (plgpu.TilingTransform((8, LANES)), plgpu.SwizzleTransform(128))


def _smem(shape) -> Any:
    return plgpu.SMEM(tuple(shape), jnp.float32, transforms=_swizzled())


def tf32(x):
    """``x`` (float32) rounded to TF32 (10 bits of mantissa, to nearest), as float32."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    bits = (bits + jnp.int32(0x1000)) & jnp.int32(-0x2000)
    return lax.bitcast_convert_type(bits, jnp.float32)


def split_tf32(x) -> tuple[Any, Any]:
    """``(hi, lo)``: ``x`` rounded to TF32, and what is left of it."""
    hi = tf32(x)
    return hi, x - hi


class MosaicGPU(Backend):
    """Pallas' Mosaic GPU backend (NVIDIA sm_90 and newer): one warpgroup per 64 examples."""

    name: ClassVar[str] = NAME
    platform: ClassVar[str] = "cuda"
    tiles: ClassVar[bool] = False
    vmap_outside: ClassVar[bool] = True
    own_kernel: ClassVar[bool] = True

    def missing(self):
        return _MISSING

    def interpretable(self):
        return interpreter() is not None

    def programs(self, kernels):
        return PROGRAMS

    def padded_shape(self, shape):
        return (*shape[:-1], lanes(shape[-1])) if shape else ()

    def unsupported(self, eqn) -> str | None:
        name = eqn.primitive.name
        for v in [*eqn.invars, *eqn.outvars]:
            if isinstance(v, Literal):
                if np.ndim(v.val) != 0:
                    return f"{name} of an array literal"
                continue
            dtype = np.dtype(v.aval.dtype)
            if dtype != np.float32:
                return f"{name} of {dtype.name} (this kernel runs float32)"
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
                found = _product(eqn, constants)
                if isinstance(found, str):
                    return found
                _, matrix, transposed = found
                n = matrix.aval.shape[0 if transposed else 1]
                if lanes(n) > MAX_COLUMNS:
                    return (
                        f"a product of {n} columns (the widest wgmma is {MAX_COLUMNS}; wider "
                        "products are not split yet)"
                    )
        used = Analysis(loop).shared_bytes
        if used > SHARED_BYTES:
            return f"the loop keeps {used} bytes in shared memory (a block has {SHARED_BYTES})"
        return None

    def largest_tile(self, eqn) -> int:
        return max((ROWS * lanes(v.aval.shape[-1]) for v in eqn.outvars if v.aval.shape), default=0)

    def footprint(self, loop) -> Footprint:
        # resident: its shared memory, in float32 entries (PROGRAMS' max_resident)
        tile = super().footprint(loop).tile
        return Footprint(tile, Analysis(loop).shared_bytes // 4)

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
        kernel = _RowsKernel(split, length, reverse, launch.prefetch, name, interpret)
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


class _RowsKernel:
    """One launch of the loop for ``R`` rows (examples): ``init`` ``(R, n)`` each, ``steps``
    ``(T, R, n)`` each; returns the carries after every step, ``(T, R, n)`` each."""

    def __init__(self, split, length, reverse, prefetch, name, interpret):
        self.split = split
        self.analysis = Analysis(split)
        self.length = length
        self.reverse = reverse
        self.prefetch = prefetch and self.analysis.prefetch
        self.name = name
        self.interpret = interpret

    def __call__(self, init, constants, steps):
        split, analysis, length = self.split, self.analysis, self.length
        count = init[0].shape[0]
        padded_rows = rows(count)
        value = dict(zip(split.constant_residuals, constants))
        matrices = []
        for matrix, transposed in analysis.matrices:
            w = value[matrix].astype(jnp.float32)
            w = w if transposed else w.T  # (N, K): read K-major
            n, k = w.shape
            w = jnp.pad(w, ((0, lanes(n) - n), (0, lanes(k) - k)))
            matrices += list(split_tf32(w)) if analysis.full else [w]
        vectors = [
            jnp.broadcast_to(_lanes(value[v].astype(jnp.float32)), (ROWS, lanes(v.aval.shape[-1])))
            for v in analysis.vectors
        ]
        init_rows = [
            jnp.pad(_lanes(x.astype(jnp.float32)), ((0, padded_rows - count), (0, 0))) for x in init
        ]
        step_rows = [
            jnp.pad(_lanes(s.astype(jnp.float32)), ((0, 0), (0, padded_rows - s.shape[1]), (0, 0)))
            for s in steps
        ]
        carry_lanes = [lanes(v.aval.shape[-1]) for v in split.carry_in]
        out_type = [
            jax.ShapeDtypeStruct((length, padded_rows, n), jnp.float32) for n in carry_lanes
        ]
        widest = analysis.widest
        scratch = [
            *(_smem(m.shape) for m in matrices),
            *(_smem((ROWS, n)) for n in carry_lanes),
            *(_smem((ROWS, widest)) for _ in range((1 + analysis.full) if widest else 0)),
            plgpu.Barrier(num_arrivals=len(matrices) + len(init), num_barriers=1),
        ]
        body = _Body(self, len(matrices), len(vectors), len(step_rows), len(init), carry_lanes)
        body.__name__ = self.name  # the kernel's name in the lowered program
        options = {} if self.interpret is None else {"interpret": self.interpret}
        outs = plgpu.kernel(
            body,
            out_type=out_type,
            scratch_types=scratch,
            grid=(padded_rows // ROWS,),
            grid_names=("rows",),
            **options,
        )(*init_rows, *matrices, *vectors, *step_rows)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        return [
            o[:, :count, : v.aval.shape[-1]].astype(x.dtype)
            for o, v, x in zip(outs, split.carry_in, init)
        ]


def _lanes(x):
    """``x`` zero-padded along its last axis to whole swizzled rows."""
    n = x.shape[-1]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, lanes(n) - n)])


class _Body:
    """The kernel's body (its references in :class:`_RowsKernel`'s order)."""

    def __init__(self, kernel, nm, nv, ns, nc, carry_lanes):
        self.kernel = kernel
        self.counts = nm, nv, ns, nc
        self.carry_lanes = carry_lanes

    def __call__(self, *refs):
        kernel = self.kernel
        split, analysis = kernel.split, kernel.analysis
        nm, nv, ns, nc = self.counts
        full = analysis.full
        it = iter(refs)
        init_g, mat_g, vec_g, step_g, out_g = (
            [next(it) for _ in range(n)] for n in (nc, nm, nv, ns, nc)
        )
        mat_s, carry_s = ([next(it) for _ in range(n)] for n in (nm, nc))
        stage_s = [next(it) for _ in range((1 + full) if analysis.products else 0)]
        loaded = next(it)
        here = pl.ds(lax.axis_index("rows") * ROWS, ROWS)
        length, reverse = kernel.length, kernel.reverse

        def time(i):
            return length - 1 - i if reverse else i

        # the loop's matrices, and the carry entering the first step
        for g, s in zip(mat_g, mat_s):
            plgpu.copy_gmem_to_smem(g, s, loaded.at[0])
        for g, s in zip(init_g, carry_s):
            plgpu.copy_gmem_to_smem(g.at[here], s, loaded.at[0])
        plgpu.barrier_wait(loaded.at[0])
        per = 1 + full
        weights = {key: mat_s[j * per : (j + 1) * per] for j, key in enumerate(analysis.matrices)}

        def residuals(i):
            t = time(jnp.minimum(i, length - 1))  # the last step's next: itself again
            return [_load(g.at[t, here]) for g in step_g] + [_load(g) for g in vec_g]

        def product(eqn, env):
            vec, matrix, transposed, wanted = analysis.products[eqn]
            x = env[vec]
            width = lanes(vec.aval.shape[-1])
            stage = [b.at[:, pl.ds(0, width)] if b.shape[-1] != width else b for b in stage_s]
            if full:
                hi, lo = split_tf32(x)
                stage[0][...] = hi
                stage[1][...] = lo
            else:
                stage[0][...] = x
            plgpu.commit_smem()
            w = weights[(matrix, transposed)]
            pairs = [(stage[0], w[0])]
            if full and wanted:
                pairs += [(stage[0], w[1]), (stage[1], w[0])]

            def scope(acc):
                for a, b in pairs:
                    plgpu.wgmma(acc, a, _transposed(b))
                return acc[...]

            return pl.run_scoped(scope, plgpu.ACC((ROWS, w[0].shape[0]), jnp.float32))

        def step(i, current):
            following = residuals(i + 1) if kernel.prefetch else None
            current = current if kernel.prefetch else residuals(i)
            env = {v: _load(s) for v, s in zip(split.carry_in, carry_s)}
            env.update(zip([*split.step_residuals, *analysis.vectors], current))
            for eqn in split.recurrence:
                name = eqn.primitive.name
                if eqn in analysis.products:
                    env[eqn.outvars[0]] = product(eqn, env)
                elif name in IDENTITY:
                    env[eqn.outvars[0]] = env[eqn.invars[0]]
                else:
                    args = [env[v] for v in eqn.invars if not isinstance(v, Literal)]
                    shape = args[0].shape if args else (ROWS, LANES)
                    args = [
                        jnp.full(shape, v.val, jnp.float32) if isinstance(v, Literal) else env[v]
                        for v in eqn.invars
                    ]
                    outs = [args[0] + args[1]] if name == "add_any" else bind(eqn, *args)
                    env.update(zip(eqn.outvars, outs))
            news = []
            for v, n in zip(split.carry_out, self.carry_lanes):
                if isinstance(v, Literal):
                    new = jnp.full((ROWS, n), v.val, jnp.float32)
                else:
                    new = env[v]
                    if v.aval.shape[-1] != n:  # padded lanes stay zero
                        lane = plgpu.broadcasted_iota(
                            jnp.int32, (ROWS, n), 1, layout=plgpu.Layout.WGMMA
                        )
                        new = jnp.where(lane < v.aval.shape[-1], new, 0.0)
                news.append(new)
            # the carries copied out a step ago have left the buffers (read: not written yet)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            for s, new in zip(carry_s, news):
                s[...] = new
            plgpu.commit_smem()
            for s, g in zip(carry_s, out_g):
                plgpu.copy_smem_to_gmem(s, g.at[time(i), here])
            return following

        def pair(j, current):
            return step(2 * j + 1, step(2 * j, current))

        first = residuals(0) if kernel.prefetch else None
        current = lax.fori_loop(0, length // 2, pair, first)
        if length % 2:
            step(length - 1, current)
        plgpu.wait_smem_to_gmem(0)
