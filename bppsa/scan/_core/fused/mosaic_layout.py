"""Where a Mosaic GPU kernel keeps a loop (:mod:`~bppsa.scan._core.fused.mosaic_gpu`): the
examples as rows, the lanes of its vectors (split over the blocks of a cluster), its shared
memory and the precision of its products.

Algorithm summary. A vector of ``n`` entries pads to whole 128-byte swizzled rows of float32;
split over a cluster of ``c`` blocks, each block computes a chunk of 8, 16 or a multiple of 32
lanes (:func:`chunk`). A loop takes the fewest blocks of :data:`CLUSTERS` whose shared memory
holds its share of the matrices (float32 ones twice at full precision: 3xTF32), whose products
are at most :data:`MAX_COLUMNS` wide and whose largest array fits (:class:`Analysis`).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._profile import FusedProgram

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


def halved(v) -> bool:
    """Whether ``v`` is a bfloat16 value."""
    return np.dtype(v.aval.dtype) == np.dtype(jnp.bfloat16)


def full_precision(eqn) -> bool:
    """Whether ``eqn``'s product runs at full float32 precision (three TF32 products): unless
    its precision asks for the default (TF32 alone)."""
    precision = eqn.params.get("precision")
    if precision is None:
        return True
    if isinstance(precision, tuple):
        return any(p is not None and p != lax.Precision.DEFAULT for p in precision)
    return precision != lax.Precision.DEFAULT


def product_of(eqn, constants) -> tuple[Any, Any, bool] | str:
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
        shapes: ``(K, N)`` of each matrix (``matrices``' keys): its rows the operand's
            lanes, its columns the product's.
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
                vector, matrix, transposed = product_of(eqn, constants)
                full = full_precision(eqn)
                self.products[eqn] = (vector, matrix, transposed, full)
                if (matrix, transposed) not in matrices:
                    matrices.append((matrix, transposed))
                if vector not in exchanged:
                    exchanged.append(vector)
        self.matrices = matrices
        self.shapes = {(m, t): m.aval.shape[::-1] if t else m.aval.shape for m, t in matrices}
        self.half = {(m, t) for m, t in matrices if halved(m)}
        used = {m for m, _ in matrices}
        self.vectors = [v for v in loop.constant_residuals if v not in used]
        self.full = any(full and not halved(m) for _, m, _, full in self.products.values())
        for cluster in CLUSTERS:
            self._size(loop, cluster)
            if self.overflow() is None and self.tile <= PROGRAMS[0].max_tile:
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
            _, n = self.shapes[(matrix, transposed)]
            registers = ROWS * self.chunk(n) // 128
            group, used = open_group.get(vector, ([], 0))
            if group and used + registers > ACCUMULATOR_REGISTERS:
                group, used = [], 0
            group.append(eqn)
            open_group[vector] = (group, used + registers)
            groups[eqn] = group
        return {eqn: tuple(group) for eqn, group in groups.items()}

    def overflow(self) -> str | None:
        """Why the loop's blocks cannot hold it (a product wider than a ``wgmma``, more
        shared memory than a block has), or ``None``."""
        blocks = f"split over {self.cluster} blocks" if self.cluster > 1 else "in one block"
        if self.columns > MAX_COLUMNS:
            return (
                f"a product of {self.columns} columns a block {blocks} (the widest wgmma "
                f"is {MAX_COLUMNS})"
            )
        if self.shared_bytes > SHARED_BYTES:
            return (
                f"the loop keeps {self.shared_bytes} bytes of shared memory a block, {blocks} "
                f"(a block has {SHARED_BYTES})"
            )
        return None

    def copies(self, key) -> int:
        """The copies of matrix ``key`` kept: a float32 one's hi and lo at full precision."""
        return 2 if self.full and key not in self.half else 1

    def _size(self, loop, cluster: int) -> None:
        self.cluster = cluster
        copies = 2 if self.full else 1
        operands = [(v.aval.shape[-1], halved(m)) for v, m, *_ in self.products.values()]
        self.widest = max((self.stage(k) for k, half in operands if not half), default=0)
        self.widest_half = max((self.stage(k) for k, half in operands if half), default=0)
        self.columns = max((self.chunk(n) for _, n in self.shapes.values()), default=0)
        self.shared_bytes = sum(
            self.copies(key) * (2 if key in self.half else 4) * lanes(k, cluster) * self.chunk(n)
            for key, (k, n) in self.shapes.items()
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


def tf32(x):
    """``x`` (float32) rounded to TF32 (10 bits of mantissa, to nearest), as float32."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    bits = (bits + jnp.int32(0x1000)) & jnp.int32(-0x2000)
    return lax.bitcast_convert_type(bits, jnp.float32)


def split_tf32(x) -> tuple[Any, Any]:
    """``(hi, lo)``: ``x`` rounded to TF32, and what is left of it."""
    hi = tf32(x)
    return hi, x - hi
