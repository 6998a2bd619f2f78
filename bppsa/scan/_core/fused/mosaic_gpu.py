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

JAX's API drift between its versions (``plgpu.load``'s index, transposed references) stays in
this module; where Pallas' Mosaic GPU backend cannot be imported, ``import bppsa`` still works and
its loops fall back to ``lax.scan`` with the reason (:meth:`MosaicGPU.missing`). On the CPU the
kernels run in Mosaic GPU's own interpreter where this JAX has it (:func:`interpreter`), else
the loops run ``lax.scan`` there.
"""

from __future__ import annotations

import functools
import inspect
import math
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
# Blocks of a thread-block cluster a loop's lanes may be split over (16 is beyond CUDA's portable
# 8; Mosaic GPU's launch allows it); the kernel takes the fewest that hold the loop.
CLUSTERS = (1, 2, 4, 8, 16)
STAGE_LANES = 128  # lanes of a product's operand a cluster kernel stages at a time (at most)
# The types a loop's values may have: registers hold float32, rounded to a bfloat16 value's
# precision after each operation that gives one; bfloat16 products run on bfloat16 operands.
TYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16))
PREFETCH_REGISTERS = 64  # registers a thread may hold for the next step's residuals (ASSUMED)
ACCUMULATOR_REGISTERS = 128  # registers a thread may hold for products issued together (ASSUMED)
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


def chunk(n: int, cluster: int = 1) -> int:
    """Lanes of a vector of ``n`` entries that each of ``cluster`` blocks computes: 8 or 16
    (a 32- or 64-byte swizzled row) where the whole stays whole swizzled rows, else whole
    swizzled rows."""
    share = -(-int(n) // cluster)
    for small in (8, 16):
        if share <= small and cluster * small % LANES == 0:
            return small
    return max(LANES, -(-share // LANES) * LANES)


def lanes(n: int, cluster: int = 1) -> int:
    """``n`` padded to whole chunks (:func:`chunk`) for each of ``cluster`` blocks."""
    return cluster * chunk(n, cluster)


def rows(n: int) -> int:
    """``n`` examples padded to whole blocks."""
    return max(ROWS, -(-int(n) // ROWS) * ROWS)


def _halved(v) -> bool:
    """Whether ``v`` is a bfloat16 value."""
    return np.dtype(v.aval.dtype) == np.dtype(jnp.bfloat16)


def _rounded(x, dtype):
    """``x`` (float32) rounded to ``dtype``'s precision where that is bfloat16, as float32."""
    if np.dtype(dtype) != np.dtype(jnp.bfloat16):
        return x
    return x.astype(jnp.bfloat16).astype(jnp.float32)


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
    """What a loop's kernel keeps where: its products, the residuals they read, and the blocks
    of a cluster its lanes are split over.

    Attributes:
        products: ``eqn -> (vector, matrix, transposed, full)`` of every product.
        matrices: the constant matrices, each ``(variable, transposed)`` once.
        vectors: the other constants (vectors).
        full: whether any float32 product runs at full precision (float32 matrices kept
            twice, hi and lo).
        half: the matrices of bfloat16 products (kept as bfloat16, once).
        cluster: the blocks of a cluster the loop's lanes are split over, the fewest of
            :data:`CLUSTERS` whose blocks hold it (shared memory, the widest product, the
            largest array: :data:`PROGRAMS`; the largest where none does): block ``j``
            computes lane chunk ``j`` of every vector, with the columns of each matrix that
            give it; each product's vector is gathered whole from all blocks first.
        exchanged: the vectors a cluster kernel gathers for its products (none for one block).
        groups: ``eqn -> products``: the products of one operand (an LSTM's four gates) that
            the kernel issues together where the first of them comes, the operand staged once
            and one wait for all (as many as :data:`ACCUMULATOR_REGISTERS` allows).
        widest: lanes of the widest operand a float32 product stages in shared memory at a
            time (``widest_half``: a bfloat16 product).
        columns: the most columns a block's product computes.
        tile: entries of the largest array a block forms.
        shared_bytes: the shared memory a block uses: its matrices' columns (float32 ones
            twice at full precision), a buffer of its chunk of each carry (float32), and one
            staged operand of each type of product (float32's twice at full precision).
        prefetch: whether a step's residuals (and the vector constants) can be loaded during
            the step before, held in registers (up to :data:`PREFETCH_REGISTERS` a thread);
            else each step loads its own at its start.
    """

    def __init__(self, loop):
        constants = set(loop.constant_residuals)
        self.products: dict = {}
        matrices: list = []
        exchanged: list = []
        for eqn in loop.recurrence:
            if eqn.primitive.name == "dot_general":
                vector, matrix, transposed = _product(eqn, constants)
                full = _full_precision(eqn)
                self.products[eqn] = (vector, matrix, transposed, full)
                if (matrix, transposed) not in matrices:
                    matrices.append((matrix, transposed))
                if vector not in exchanged:
                    exchanged.append(vector)
        self.matrices = matrices
        self.half = {(m, t) for m, t in matrices if _halved(m)}
        used = {m for m, _ in matrices}
        self.vectors = [v for v in loop.constant_residuals if v not in used]
        self.full = any(full and not _halved(m) for _, m, _, full in self.products.values())
        for cluster in CLUSTERS:
            self._size(loop, cluster)
            if (
                self.shared_bytes <= SHARED_BYTES
                and self.columns <= MAX_COLUMNS
                and self.tile <= PROGRAMS[0].max_tile
            ):
                break
        self.exchanged = exchanged if self.cluster > 1 else []
        self.groups = self._grouped()

    def chunk(self, n: int) -> int:
        """Lanes of a vector of ``n`` entries that one block of the cluster computes."""
        return chunk(n, self.cluster)

    def stage(self, n: int) -> int:
        """Lanes of a product's operand of ``n`` entries staged at a time: all of it in one
        block, else a divisor of its lanes up to :data:`STAGE_LANES`."""
        padded = lanes(n, self.cluster)
        return padded if self.cluster == 1 else math.gcd(padded, STAGE_LANES)

    def _grouped(self) -> dict:
        """``eqn -> group``: the products of one operand, in order, issued together (their
        accumulators up to :data:`ACCUMULATOR_REGISTERS` a thread)."""
        groups: dict = {}
        open_group: dict = {}
        for eqn, (vector, matrix, transposed, _) in self.products.items():
            n = matrix.aval.shape[0 if transposed else 1]
            registers = ROWS * self.chunk(n) // 128
            group, used = open_group.get(vector, ([], 0))
            if group and used + registers > ACCUMULATOR_REGISTERS:
                group, used = [], 0
            group.append(eqn)
            open_group[vector] = (group, used + registers)
            groups[eqn] = group
        return {eqn: tuple(group) for eqn, group in groups.items()}

    def copies(self, key) -> int:
        """The copies of matrix ``key`` kept: a float32 one's hi and lo at full precision."""
        return 2 if self.full and key not in self.half else 1

    def _size(self, loop, cluster: int) -> None:
        self.cluster = cluster
        copies = 2 if self.full else 1
        operands = [(v.aval.shape[-1], _halved(m)) for v, m, *_ in self.products.values()]
        self.widest = max((self.stage(k) for k, half in operands if not half), default=0)
        self.widest_half = max((self.stage(k) for k, half in operands if half), default=0)
        shapes = {
            key: key[0].aval.shape[::-1] if key[1] else key[0].aval.shape  # (K, N)
            for key in self.matrices
        }
        self.columns = max((self.chunk(n) for _, n in shapes.values()), default=0)
        self.shared_bytes = sum(
            self.copies(key) * (2 if key in self.half else 4) * lanes(k, cluster) * self.chunk(n)
            for key, (k, n) in shapes.items()
        )
        self.shared_bytes += ROWS * (
            4 * sum(self.chunk(v.aval.shape[-1]) for v in loop.carry_in)
            + 4 * copies * self.widest
            + 2 * self.widest_half
        )
        widths = [
            v.aval.shape[-1]
            for eqn in loop.recurrence
            for v in eqn.outvars
            if len(v.aval.shape) == 1
        ]
        self.tile = ROWS * max((self.chunk(n) for n in widths), default=0)
        held = [*loop.step_residuals, *self.vectors]
        self.prefetch = (
            sum(self.chunk(v.aval.shape[-1]) * ROWS // 128 for v in held) <= PREFETCH_REGISTERS
        )


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


def interpreter() -> Any | None:
    """Mosaic GPU's own interpreter's parameters (race detection on), or ``None`` where this
    JAX has none that runs these kernels."""
    return None if _INTERPRETER is None else _INTERPRETER(detect_races=True)


def _load(ref):
    """``ref`` (shared or global memory) read into registers in the products' layout."""
    idx = inspect.signature(plgpu.load).parameters.get("idx")
    if idx is not None and idx.default is inspect.Parameter.empty:  # JAX 0.10 (0.11: optional)
        return plgpu.load(ref, (), layout=plgpu.Layout.WGMMA, optimized=False)
    return plgpu.load(ref, layout=plgpu.Layout.WGMMA, optimized=False)


def _store(ref, x) -> None:
    """``x`` (registers) written to ``ref`` in global memory, rows of any width (JAX 0.12's
    ``ref[...] = x`` asks for whole 128-byte lines; 0.10 has no ``plgpu.store``)."""
    if hasattr(plgpu, "store"):
        plgpu.store(ref, x, optimized=False)
    else:  # JAX 0.10
        ref[...] = x


def _transposed(ref):
    """``ref`` read transposed (its last two axes swapped)."""
    return ref.transpose((1, 0))


def _smem(shape, dtype=jnp.float32) -> Any:
    """Shared memory of ``shape`` and ``dtype``, its rows swizzled: 128 bytes, or 64 or 32
    where its last axis is no whole number of 128-byte rows."""
    size = np.dtype(dtype).itemsize
    row = next(r for r in (128 // size, 64 // size, 32 // size) if int(shape[-1]) % r == 0)
    transforms = (plgpu.TilingTransform((8, row)), plgpu.SwizzleTransform(size * row))
    return plgpu.SMEM(tuple(shape), dtype, transforms=transforms)


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
        return _MISSING or older_devices()

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
                found = _product(eqn, constants)
                if isinstance(found, str):
                    return found
                types = {np.dtype(v.aval.dtype).name for v in [*eqn.invars, *eqn.outvars]}
                if len(types) > 1:
                    return f"a product of mixed types ({', '.join(sorted(types))})"
        analysis = Analysis(loop)
        blocks = f"split over {analysis.cluster} blocks" if analysis.cluster > 1 else "in one block"
        if analysis.columns > MAX_COLUMNS:
            return (
                f"a product of {analysis.columns} columns a block {blocks} (the widest wgmma "
                f"is {MAX_COLUMNS})"
            )
        if analysis.shared_bytes > SHARED_BYTES:
            return (
                f"the loop keeps {analysis.shared_bytes} bytes of shared memory a block, {blocks} "
                f"(a block has {SHARED_BYTES})"
            )
        return None

    def largest_tile(self, eqn) -> int:
        return max((ROWS * lanes(v.aval.shape[-1]) for v in eqn.outvars if v.aval.shape), default=0)

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
        cluster = analysis.cluster
        count = init[0].shape[0]
        padded_rows = rows(count)
        value = dict(zip(split.constant_residuals, constants))
        matrices = []
        for key in analysis.matrices:
            matrix, transposed = key
            w = value[matrix].astype(jnp.float32)
            w = w if transposed else w.T  # (N, K): read K-major
            n, k = w.shape
            w = jnp.pad(w, ((0, lanes(n, cluster) - n), (0, lanes(k, cluster) - k)))
            if key in analysis.half:
                matrices.append(w.astype(jnp.bfloat16))
            else:
                matrices += list(split_tf32(w)) if analysis.copies(key) == 2 else [w]
        vectors = [
            jnp.broadcast_to(
                _lanes(value[v].astype(jnp.float32), cluster),
                (ROWS, lanes(v.aval.shape[-1], cluster)),
            )
            for v in analysis.vectors
        ]
        init_rows = [
            jnp.pad(_lanes(x.astype(jnp.float32), cluster), ((0, padded_rows - count), (0, 0)))
            for x in init
        ]
        step_rows = [
            jnp.pad(
                _lanes(s.astype(jnp.float32), cluster),
                ((0, 0), (0, padded_rows - s.shape[1]), (0, 0)),
            )
            for s in steps
        ]
        carry_lanes = [lanes(v.aval.shape[-1], cluster) for v in split.carry_in]
        out_type = [
            jax.ShapeDtypeStruct((length, padded_rows, n), jnp.float32) for n in carry_lanes
        ]
        # a cluster's exchange of each gathered vector: two slots (steps alternate)
        out_type += [
            jax.ShapeDtypeStruct((2, padded_rows, lanes(v.aval.shape[-1], cluster)), jnp.float32)
            for v in analysis.exchanged
        ]
        widest, half = analysis.widest, analysis.widest_half
        scratch = [
            *(_smem((m.shape[0] // cluster, m.shape[1]), m.dtype) for m in matrices),
            *(_smem((ROWS, n // cluster)) for n in carry_lanes),
            *(_smem((ROWS, widest)) for _ in range((1 + analysis.full) if widest else 0)),
            *([_smem((ROWS, half), jnp.bfloat16)] if half else []),
            plgpu.Barrier(num_arrivals=len(matrices) + len(init), num_barriers=1),
        ]
        options: dict[str, Any] = {} if self.interpret is None else {"interpret": self.interpret}
        if cluster > 1:
            scratch.append(plgpu.ClusterBarrier(collective_axes=("cols",), num_arrivals=1))
            options.update(cluster=(cluster,), cluster_names=("cols",))
        body = _Body(self, len(matrices), len(vectors), len(step_rows), len(init), carry_lanes)
        body.__name__ = self.name  # the kernel's name in the lowered program
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


def _lanes(x, cluster: int = 1):
    """``x`` zero-padded along its last axis to whole swizzled rows for each block."""
    n = x.shape[-1]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, lanes(n, cluster) - n)])


def _block_lanes(block, width: int, cluster: int):
    """Block ``block``'s lanes of an array ``width`` lanes wide split over ``cluster``."""
    share = width // cluster
    return pl.ds(block * share, share)


def _matrix_columns(block, width: int, cluster: int):
    """The columns of a matrix (``width`` of them, stored as rows) that block ``block``
    keeps: those of its lanes of the product."""
    return _block_lanes(block, width, cluster)


def _all_wrote(barrier) -> None:
    """Waits until every block of the cluster has written its lanes to the exchange."""
    plgpu.barrier_arrive(barrier)
    plgpu.barrier_wait(barrier)


class _Body:
    """The kernel's body (its references in :class:`_RowsKernel`'s order)."""

    def __init__(self, kernel, nm, nv, ns, nc, carry_lanes):
        self.kernel = kernel
        self.counts = nm, nv, ns, nc
        self.carry_lanes = carry_lanes

    def __call__(self, *refs):
        kernel = self.kernel
        split, analysis = kernel.split, kernel.analysis
        cluster = analysis.cluster
        nm, nv, ns, nc = self.counts
        full = analysis.full
        it = iter(refs)
        init_g, mat_g, vec_g, step_g, out_g, exchange_g = (
            [next(it) for _ in range(n)] for n in (nc, nm, nv, ns, nc, len(analysis.exchanged))
        )
        mat_s, carry_s = ([next(it) for _ in range(n)] for n in (nm, nc))
        stage_s = [next(it) for _ in range((1 + full) if analysis.widest else 0)]
        stage_half = next(it) if analysis.widest_half else None
        loaded = next(it)
        gathered_all = next(it) if cluster > 1 else None
        here = pl.ds(lax.axis_index("rows") * ROWS, ROWS)
        block = lax.axis_index("cols") if cluster > 1 else 0
        length, reverse = kernel.length, kernel.reverse

        def mine(width):
            """This block's lanes of an array ``width`` lanes wide (all of them in one block)."""
            return slice(None) if cluster == 1 else _block_lanes(block, width, cluster)

        def lane(n, width):
            """Whether each lane of this block's chunk is one of a vector's ``n`` entries."""
            index = plgpu.broadcasted_iota(
                jnp.int32, (ROWS, width // cluster), 1, layout=plgpu.Layout.WGMMA
            )
            return index + block * (width // cluster) < n

        def time(i):
            return length - 1 - i if reverse else i

        # this block's columns of the loop's matrices, and of the carry entering the first step
        for g, s in zip(mat_g, mat_s):
            columns = slice(None) if cluster == 1 else _matrix_columns(block, g.shape[0], cluster)
            plgpu.copy_gmem_to_smem(g.at[columns], s, loaded.at[0])
        for g, s in zip(init_g, carry_s):
            plgpu.copy_gmem_to_smem(g.at[here, mine(g.shape[-1])], s, loaded.at[0])
        plgpu.barrier_wait(loaded.at[0])
        weights, start = {}, 0
        for key in analysis.matrices:
            weights[key] = mat_s[start : start + analysis.copies(key)]
            start += analysis.copies(key)

        def residuals(i):
            t = time(jnp.minimum(i, length - 1))  # the last step's next: itself again
            return [_load(g.at[t, here, mine(g.shape[-1])]) for g in step_g] + [
                _load(g.at[:, mine(g.shape[-1])]) for g in vec_g
            ]

        def operand(vec, env):
            """``vec``'s value with its padded lanes zero (a product reads them)."""
            n = vec.aval.shape[-1]
            width = lanes(n, cluster)
            x = env[vec]
            return x if n == width else jnp.where(lane(n, width), x, 0.0)

        def gather(vec, env, slot, gathered):
            """``vec`` whole for this block's rows, in global memory: each block writes its
            lanes to the exchange, and all wait for all at the cluster's barrier."""
            if vec not in gathered:
                exchange = exchange_g[analysis.exchanged.index(vec)].at[slot]
                _store(exchange.at[here, mine(exchange.shape[-1])], operand(vec, env))
                _all_wrote(gathered_all)
                gathered[vec] = exchange.at[here]
            return gathered[vec]

        def staged(x, width, half):
            """``x`` (``width`` lanes) in the stage buffers: ``(hi, lo)`` at full precision,
            bfloat16 for a bfloat16 product (``half``)."""
            buffers = [stage_half] if half else stage_s
            stage = [b.at[:, pl.ds(0, width)] if b.shape[-1] != width else b for b in buffers]
            if half:
                stage[0][...] = x.astype(jnp.bfloat16)
            elif full:
                hi, lo = split_tf32(x)
                stage[0][...] = hi
                stage[1][...] = lo
            else:
                stage[0][...] = x
            plgpu.commit_smem()
            return stage

        def products(group, env, slot, gathered):
            """The products of ``group`` (one operand, each with its matrix) into ``env``:
            the operand staged once, all their ``wgmma`` issued before one wait."""
            vec = analysis.products[group[0]][0]
            keys = [analysis.products[eqn][1:3] for eqn in group]
            half = keys[0] in analysis.half
            k = lanes(vec.aval.shape[-1], cluster)
            step = analysis.stage(vec.aval.shape[-1])
            source = gather(vec, env, slot, gathered) if cluster > 1 else None

            def scope(*accs):
                for start in range(0, k, step):
                    if start:  # the last part's products have read the stage
                        plgpu.wgmma_wait(0)
                    part = pl.ds(start, step)
                    x = operand(vec, env) if source is None else _load(source.at[:, part])
                    stage = staged(x, step, half)
                    for eqn, key, acc in zip(group, keys, accs):
                        w = weights[key]
                        parts = w if step == k else [b.at[:, part] for b in w]
                        pairs = [(stage[0], parts[0])]
                        if full and analysis.products[eqn][3] and not half:
                            pairs += [(stage[0], parts[1]), (stage[1], parts[0])]
                        for a, b in pairs:
                            plgpu.wgmma(acc, a, _transposed(b))
                return [acc[...] for acc in accs]

            accs = [plgpu.ACC((ROWS, weights[key][0].shape[0]), jnp.float32) for key in keys]
            outs = pl.run_scoped(scope, *accs)
            for eqn, out in zip(group, outs):
                env[eqn.outvars[0]] = _rounded(out, eqn.outvars[0].aval.dtype)

        def step(i, current, slot):
            following = residuals(i + 1) if kernel.prefetch else None
            current = current if kernel.prefetch else residuals(i)
            env = {v: _load(s) for v, s in zip(split.carry_in, carry_s)}
            env.update(zip([*split.step_residuals, *analysis.vectors], current))
            gathered: dict = {}
            for eqn in split.recurrence:
                name = eqn.primitive.name
                if eqn in analysis.products:
                    if eqn.outvars[0] not in env:  # else computed with its group
                        products(analysis.groups[eqn], env, slot, gathered)
                elif name in IDENTITY:
                    env[eqn.outvars[0]] = env[eqn.invars[0]]
                else:
                    args = [env[v] for v in eqn.invars if not isinstance(v, Literal)]
                    shape = args[0].shape if args else (ROWS, LANES)
                    args = [
                        jnp.full(shape, v.val, jnp.float32) if isinstance(v, Literal) else env[v]
                        for v in eqn.invars
                    ]
                    if name == "add_any":
                        outs = [args[0] + args[1]]
                    elif name == "convert_element_type":  # float32 and bfloat16: a rounding
                        outs = [args[0]]
                    else:
                        outs = bind(eqn, *args)
                    outs = [_rounded(o, v.aval.dtype) for o, v in zip(outs, eqn.outvars)]
                    env.update(zip(eqn.outvars, outs))
            news = []
            for v, n in zip(split.carry_out, self.carry_lanes):
                if isinstance(v, Literal):
                    new = jnp.full((ROWS, n // cluster), v.val, jnp.float32)
                elif v.aval.shape[-1] != n:  # padded lanes stay zero
                    new = jnp.where(lane(v.aval.shape[-1], n), env[v], 0.0)
                else:
                    new = env[v]
                news.append(new)
            # the carries copied out a step ago have left the buffers (read: not written yet)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            for s, new in zip(carry_s, news):
                s[...] = new
            plgpu.commit_smem()
            for s, g in zip(carry_s, out_g):
                plgpu.copy_smem_to_gmem(s, g.at[time(i), here, mine(g.shape[-1])])
            return following

        def pair(j, current):
            return step(2 * j + 1, step(2 * j, current, 0), 1)

        first = residuals(0) if kernel.prefetch else None
        current = lax.fori_loop(0, length // 2, pair, first)
        if length % 2:
            step(length - 1, current, 0)
        plgpu.wait_smem_to_gmem(0)
