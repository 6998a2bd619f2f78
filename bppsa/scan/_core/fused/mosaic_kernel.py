"""The Mosaic GPU kernel of a fused loop (:mod:`~bppsa.scan._core.fused.mosaic_gpu`): one
launch over rows of examples, on one block or a cluster of blocks
(:mod:`~bppsa.scan._core.fused.mosaic_layout` says where it keeps what).

Algorithm summary. Each step loads the carries (a block's chunk of their lanes) from shared
memory and the step's residuals from global memory (a step ahead where they fit registers), runs
the recurrence's equations on ``(64, chunk)`` register arrays, and writes the new carries back,
copied out by TMA while the next step runs. A product stages its operand in swizzled shared
memory and runs on tensor cores (``wgmma``), the products of one operand issued together; in a
cluster each block first writes its lanes of the operand to an exchange in global memory and
waits at the cluster's barrier for the others'. The loop runs two steps an iteration, so that
every buffer (and exchange slot) is static.

JAX's API drift between its versions (``plgpu.load``'s index, ``plgpu.store``) stays here.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from bppsa.scan._core import tracing
from bppsa.scan._core.fused.mosaic_layout import (
    LANES,
    ROWS,
    Analysis,
    lanes,
    rows,
    split_tf32,
)
from bppsa.scan._core.jaxprs.walk import bind

MISSING: str | None = None
_RULES: frozenset[str] | None = None
_INTERPRETER: Any = None
try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError as err:  # pragma: no cover - JAX without it: the loops fall back, naming it
    pl = plgpu = None  # type: ignore[assignment]
    MISSING = f"Pallas' Mosaic GPU backend cannot be imported here ({type(err).__name__}: {err})"
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


def _rounded(x, dtype):
    """``x`` (float32) rounded to ``dtype``'s precision where that is bfloat16, as float32."""
    if np.dtype(dtype) != np.dtype(jnp.bfloat16):
        return x
    return x.astype(jnp.bfloat16).astype(jnp.float32)


class RowsKernel:
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
    """The kernel's body (its references in :class:`RowsKernel`'s order)."""

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

        def zeroed(x, n):
            """``x`` (this block's chunk of a vector of ``n`` entries) with its padded lanes
            zero: a carry's, and a product's operand (a cell's value there may be infinite)."""
            width = lanes(n, cluster)
            return x if n == width else jnp.where(lane(n, width), x, 0.0)

        def operand(vec, env):
            return zeroed(env[vec], vec.aval.shape[-1])

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
                    news.append(jnp.full((ROWS, n // cluster), v.val, jnp.float32))
                else:
                    news.append(zeroed(env[v], v.aval.shape[-1]))
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
