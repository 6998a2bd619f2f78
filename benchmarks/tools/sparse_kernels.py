"""Sparse kernels of ``bppsa.scan``: which numeric phase, and when dense is cheaper.

Measures, jitted, on this machine (interleaved repeats, each timed call right after an untimed
call of itself, :func:`experiments.timing.interleaved`; min and median):

* ``spgemm``: the numeric phase of a fixed-pattern SpGEMM, the padded-row sum (pairs padded
  per output entry, the pad gathering an appended zero: no scatter) against a flat
  ``segment_sum`` (a scatter-add on XLA CPU), on products of pruned 3x3 convolutions' ``J^T``
  (shared by the batch), a ReLU diagonal (per example) times a convolution, and random patterns.
* ``spmv``: the same two sums for SpMV (a convolution's ``J^T`` applied to a batch of vectors).
* ``pair_ratio``: the SpGEMM numeric phase against a dense GEMM of the same shapes (with and
  without densifying the operands first), over operand densities: the ratio
  ``pairs / (n0 n1 n2)`` above which the GEMM wins (``DENSIFY_PAIR_RATIO``).
* ``storage``: what an output of density ``d`` costs its users when stored sparse rather than
  dense: an SpMV against a GEMV on a batch, and the next product with a pruned convolution's
  ``J^T`` (sparse @ sparse against the SpMM gathers of a dense operand): the density above which
  the dense form wins (``DENSIFY_DENSITY``).

Run: ``.venv/bin/python -m benchmarks.tools.sparse_kernels`` (about two minutes on 2 cores), or with
``--sections``, ``--repeats``, ``--out``. Results: JSON written atomically after each section
(``benchmarks/results/sparse_kernels_cpu.json`` by default) and a printed table.

Measured (benchmarks/results/sparse_kernels_cpu.json: XLA CPU, 2 cores shared with other jobs, JAX
0.10.2, float32, medians of 10 interleaved repeats, ms):

* SpGEMM, padded / bucketed / segment: conv @ conv (6.7M pairs, 5x padding) 38.4 / 23.1 / 8.9;
  per example (B = 8) 298 / 170 / 90; ReLU diagonal (B = 16) @ conv (no padding) 0.60 / 0.98 /
  3.28; max-pooling @ conv 0.22 / 0.49 / 0.79; diagonal plus neighbours (<= 2 pairs per entry)
  11.1 / 3.40 / 3.57 and 20.7 / 4.68 / 14.2; random patterns (width 4, 6) segment 20-30% ahead
  of bucketed. Hence ``SPGEMM_METHOD = "auto"``: padded without padding, bucketed up to 2 pairs
  per entry, segment otherwise.
* SpMV on 16 vectors, padded / segment / entries on the last axis: conv J^T 1.62 / 1.22 / 40.8,
  38.0 / 36.4 / 334, 42.4 / 32.3 / 271; random 1.06 / 0.49 / 6.4. Hence the rows layout and
  ``SPMV_METHOD = "segment"``.
* pair ratio: a GEMM beats the best sparse numeric phase from ``pairs / (n0 n1 n2)`` = 0.0098
  (n = 256 and 512), not at 0.0024: ``DENSIFY_PAIR_RATIO = 0.005``.
* storage (n = 1024, B = 16): an output's SpMV plus its next product, sparse / dense: 6.1 / 53.3
  at density 0.1, 72.7 / 107.3 at 0.3, 132.7 / 97.0 at 0.5 (the SpMV alone goes dense from 0.1
  at n = 1024 and 4096, the product from 0.5): ``DENSIFY_DENSITY = 0.4``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from bppsa.scan._sparse import METHODS, Pattern, Sparse, _pairs, product_plan, spgemm_values
from experiments.timing import interleaved

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1]
SECTIONS = ("spgemm", "spmv", "pair_ratio", "storage")


def conv_pattern(c_in: int, c_out: int, side: int, keep: float, seed: int) -> Pattern:
    """``J^T`` of a 3x3, stride 1, padding 1 convolution on ``side x side`` images whose
    weights are pruned to a fraction ``keep`` at random: ``(c_in side^2, c_out side^2)``."""
    rng = np.random.default_rng(seed)
    mask = rng.random((c_out, c_in, 3, 3)) < keep
    co, ci, dy, dx = np.nonzero(mask)
    y, x = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    y, x = y.ravel(), x.ravel()
    # Output pixel (y, x) of channel co reads input pixel (y + dy - 1, x + dx - 1) of channel ci.
    yi, xi = y[None, :] + dy[:, None] - 1, x[None, :] + dx[:, None] - 1
    inside = (yi >= 0) & (yi < side) & (xi >= 0) & (xi < side)
    rows = (ci[:, None] * side * side + yi * side + xi)[inside]
    cols = (co[:, None] * side * side + y * side + x)[inside]
    shape = (c_in * side * side, c_out * side * side)
    return Pattern.from_coo(rows, cols, shape)[0]


def maxpool_pattern(channels: int, side: int, seed: int) -> Pattern:
    """``J^T`` of a 2x2, stride 2 max-pooling: one entry per pooled output, at a random slot
    of its window (the argmax): ``(channels side^2, channels (side / 2)^2)``."""
    rng = np.random.default_rng(seed)
    half = side // 2
    c, y, x = (
        a.ravel() for a in np.meshgrid(*map(np.arange, (channels, half, half)), indexing="ij")
    )
    slot = rng.integers(0, 4, c.size)
    rows = c * side * side + (2 * y + slot // 2) * side + 2 * x + slot % 2
    cols = c * half * half + y * half + x
    return Pattern.from_coo(rows, cols, (channels * side * side, channels * half * half))[0]


def with_extras(n: int, fraction: float, seed: int) -> Pattern:
    """The ``(n, n)`` diagonal plus, in a ``fraction`` of the rows, one entry next to it: pair
    counts of 1 or 2 per output entry when it multiplies another map."""
    rng = np.random.default_rng(seed)
    extra = np.flatnonzero(rng.random(n - 1) < fraction)
    rows = np.concatenate([np.arange(n), extra])
    return Pattern.from_coo(rows, np.concatenate([np.arange(n), extra + 1]), (n, n))[0]


def random_pattern(shape, density: float, seed: int) -> Pattern:
    rng = np.random.default_rng(seed)
    rows, cols = np.nonzero(rng.random(shape) < density)
    return Pattern.from_coo(rows, cols, shape)[0]


def values_for(pattern: Pattern, vbatch=(), seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(1, *vbatch, pattern.nnz)), jnp.float32)


def measure(fns: dict, args: dict, repeats: int) -> dict:
    """Jits every function, then times them interleaved round by round, each timed call right
    after an untimed call of itself (:func:`experiments.timing.interleaved`); ms per call."""
    calls = {name: functools.partial(jax.jit(fn), *args[name]) for name, fn in fns.items()}
    times = interleaved(calls, repeats)
    return {
        n: dict(min_ms=1e3 * min(t), median_ms=1e3 * statistics.median(t)) for n, t in times.items()
    }


def spgemm_pair(later, earlier, later_vbatch, earlier_vbatch, repeats):
    pairs = _pairs(later, earlier)
    lv, ev = values_for(later, later_vbatch, 1), values_for(earlier, earlier_vbatch, 2)
    fns = {m: (lambda a, b, m=m: spgemm_values(a, b, pairs, m)) for m in METHODS}
    timed = measure(fns, {m: (lv, ev) for m in fns}, repeats)
    plan = product_plan(later, earlier)
    return dict(
        later=repr(later), earlier=repr(earlier), later_vbatch=list(later_vbatch),
        earlier_vbatch=list(earlier_vbatch), pairs=plan.pairs, nnz_out=plan.nnz_out,
        width=plan.width, padded_over_pairs=plan.width * plan.nnz_out / max(1, plan.pairs),
        density_out=plan.density, times=timed,
    )  # fmt: skip


def section_spgemm(repeats):
    conv_a = conv_pattern(16, 16, 16, 0.3, 0)
    conv_b = conv_pattern(16, 16, 16, 0.3, 1)
    conv_c = conv_pattern(8, 16, 16, 0.3, 2)
    relu = Pattern.diagonal(conv_a.shape[0])
    cases = [
        ("conv@conv shared", conv_a, conv_b, (), ()),
        ("conv(8->16)@conv shared", conv_a, conv_c, (), ()),
        ("relu(B=16)@conv", relu, conv_a, (16,), ()),
        ("maxpool(B=16)@conv", maxpool_pattern(16, 16, 3), conv_a, (16,), ()),
        ("diag+30%(B=16)@conv", with_extras(conv_a.shape[0], 0.3, 4), conv_a, (16,), ()),
        ("diag+100%(B=16)@conv", with_extras(conv_a.shape[0], 1.0, 4), conv_a, (16,), ()),
        ("conv@conv per-example B=8", conv_a, conv_b, (8,), ()),
        ("random 1024^2 d=0.01", *(random_pattern((1024, 1024), 0.01, s) for s in (3, 4)), (), ()),
        ("random 2048x512 d=0.02", random_pattern((512, 2048), 0.02, 5),
         random_pattern((2048, 512), 0.02, 6), (), ()),
    ]  # fmt: skip
    rows = []
    for name, later, earlier, lb, eb in cases:
        row = dict(case=name, **spgemm_pair(later, earlier, lb, eb, repeats))
        rows.append(row)
        t = row["times"]
        print(
            f"spgemm {name:<28} pairs {row['pairs']:>9} width {row['width']:>4} "
            f"pad/pairs {row['padded_over_pairs']:5.2f} | {times_text(t)}",
            flush=True,
        )
    return rows


def spmv_last_axis(maps: Sparse, v: jax.Array) -> jax.Array:
    """The SpMV with the entries on the LAST axis (one float per gathered index, the batch
    leading): the layout bppsa.scan._sparse does not use, kept here as the measured reference."""
    p = maps.pattern
    values = jnp.concatenate([maps.values, jnp.zeros((*maps.values.shape[:-1], 1))], axis=-1)
    values = values[:, None] if v.ndim > maps.values.ndim else values
    cols = np.append(p.cols, 0)[p.ell]
    return (values[..., p.ell] * v[..., cols]).sum(axis=-1)


def section_spmv(repeats):
    rows = []
    cases = [
        ("conv 16->16 16x16 keep 0.3", conv_pattern(16, 16, 16, 0.3, 0), 16),
        ("conv 3->64 32x32 keep 1.0", conv_pattern(3, 64, 32, 1.0, 0), 16),
        ("conv 64->64 16x16 keep 0.1", conv_pattern(64, 64, 16, 0.1, 0), 16),
        ("random 4096^2 d=0.002", random_pattern((4096, 4096), 0.002, 0), 16),
    ]
    for name, pattern, batch in cases:
        maps = Sparse(values_for(pattern), pattern)
        v = jnp.asarray(np.random.default_rng(0).normal(size=(1, batch, pattern.shape[1])))
        v = v.astype(jnp.float32)
        fns = {m: (lambda s, x, m=m: s._apply(x, 0, m)) for m in ("padded", "segment")}
        fns["last_axis"] = spmv_last_axis
        timed = measure(fns, {m: (maps, v) for m in fns}, repeats)
        width = pattern.ell.shape[1]
        rows.append(dict(case=name, pattern=repr(pattern), batch=batch, width=width, times=timed))
        print(
            f"spmv   {name:<28} nnz {pattern.nnz:>9} width {width:>4} | {times_text(timed)}",
            flush=True,
        )
    return rows


def section_pair_ratio(repeats):
    rows = []
    for n, densities in ((256, (0.01, 0.03, 0.1, 0.2, 0.3)), (512, (0.005, 0.02, 0.05, 0.1, 0.2))):
        for d in densities:
            later, earlier = random_pattern((n, n), d, 7), random_pattern((n, n), d, 8)
            pairs = _pairs(later, earlier)
            sl = Sparse(values_for(later, (), 1), later)
            se = Sparse(values_for(earlier, (), 2), earlier)
            dl, de = sl.to_dense().a, se.to_dense().a
            fns = {m: (lambda a, b, m=m, p=pairs: spgemm_values(a.values, b.values, p, m))
                   for m in METHODS}  # fmt: skip
            fns["gemm"] = lambda a, b: b @ a
            fns["densify+gemm"] = lambda a, b: b.to_dense().a @ a.to_dense().a
            args = {m: (sl, se) for m in METHODS} | dict(gemm=(dl, de))
            args["densify+gemm"] = (sl, se)
            timed = measure(fns, args, repeats)
            plan = product_plan(later, earlier)
            ratio = plan.pairs / n**3
            rows.append(
                dict(n=n, density_in=d, pairs=plan.pairs, pair_ratio=ratio,
                     density_out=plan.density, width=plan.width, times=timed)
            )  # fmt: skip
            print(
                f"ratio  n={n} d_in={d:<6} pairs/n^3 {ratio:8.5f} d_out {plan.density:5.3f} | "
                + times_text(timed),
                flush=True,
            )
    return rows


def section_storage(repeats):
    """An output X (n x n, density d) stored sparse or dense, then used by an SpMV on a batch
    of 16 (n = 1024: the dense matrix fits the caches; n = 4096: it does not) and by the next
    product with a pruned convolution's J^T (n = 1024; E @ X with E sparse: SpGEMM against the
    SpMM gathers of the dense X)."""
    rows = []
    batch = 16
    earlier = conv_pattern(16, 16, 8, 0.3, 9)
    se = Sparse(values_for(earlier, (), 3), earlier)
    grid = [(1024, d) for d in (0.01, 0.03, 0.1, 0.2, 0.3, 0.5)]
    grid += [(4096, d) for d in (0.003, 0.01, 0.03, 0.1, 0.2)]
    for n, d in grid:
        x = random_pattern((n, n), d, 10)
        sx = Sparse(values_for(x, (), 4), x)
        dx = sx.to_dense()
        v = jnp.asarray(np.random.default_rng(0).normal(size=(1, batch, n)), jnp.float32)
        fns = dict(spmv_sparse=lambda s, v: s.apply(v), spmv_dense=lambda s, v: s.apply(v))
        args = dict(spmv_sparse=(sx, v), spmv_dense=(dx, v))
        if n == earlier.shape[1]:
            pairs = _pairs(x, earlier)
            fns["next_dense"] = lambda s, e: e.after(s).a
            for m in METHODS:
                fns[f"next_{m}"] = lambda s, e, m=m, p=pairs: spgemm_values(
                    s.values, e.values, p, m
                )
            args |= {f"next_{m}": (sx, se) for m in METHODS} | dict(next_dense=(dx, se))
        timed = measure(fns, args, repeats)
        rows.append(dict(n=n, density=d, batch=batch, times=timed))
        print(f"store  n={n} d={d:<5} | " + times_text(timed), flush=True)
    return rows


def times_text(times: dict) -> str:
    return " | ".join(f"{k} {v['median_ms']:8.3f} ms" for k, v in times.items())


def crossover(rows, key, sparse, dense):
    """The smallest ``key`` from which the dense variant's median is below the best of the
    ``sparse`` variants' for every larger ``key`` (``None``: sparse always wins)."""
    rows = sorted(rows, key=lambda r: r[key])
    best = [min(r["times"][name]["median_ms"] for name in sparse) for r in rows]
    wins = [r["times"][dense]["median_ms"] < b for r, b in zip(rows, best)]
    for i in range(len(rows)):
        if all(wins[i:]):
            return rows[i][key]
    return None


def used_once(times: dict) -> dict:
    """An output's two uses in the scan, one SpMV (down-sweep) and one product (next level):
    their summed medians, stored sparse (the fastest SpGEMM) or dense."""
    next_sparse = min(times[f"next_{m}"]["median_ms"] for m in METHODS)
    return dict(
        both_sparse=dict(median_ms=times["spmv_sparse"]["median_ms"] + next_sparse),
        both_dense=dict(
            median_ms=times["spmv_dense"]["median_ms"] + times["next_dense"]["median_ms"]
        ),
    )


def summarize(payload) -> dict:
    out = {}
    for name in ("spgemm", "spmv"):
        for row in payload.get(name, []):
            t = {k: v["median_ms"] for k, v in row["times"].items()}
            out.setdefault(f"{name}_fastest", {})[row["case"]] = min(t, key=t.get)
    if payload.get("pair_ratio"):
        for n in sorted({r["n"] for r in payload["pair_ratio"]}):
            rows = [r for r in payload["pair_ratio"] if r["n"] == n]
            for dense in ("gemm", "densify+gemm"):
                out[f"pair_ratio_{dense}_wins_from_n{n}"] = crossover(
                    rows, "pair_ratio", METHODS, dense
                )
    if payload.get("storage"):
        for n in sorted({r["n"] for r in payload["storage"]}):
            rows = [r for r in payload["storage"] if r["n"] == n]
            out[f"density_spmv_dense_wins_from_n{n}"] = crossover(
                rows, "density", ["spmv_sparse"], "spmv_dense"
            )
            if "next_dense" in rows[0]["times"]:
                out[f"density_next_dense_wins_from_n{n}"] = crossover(
                    rows, "density", [f"next_{m}" for m in METHODS], "next_dense"
                )
                both = [dict(r, times=dict(r["times"], **used_once(r["times"]))) for r in rows]
                out[f"density_spmv_plus_next_dense_wins_from_n{n}"] = crossover(
                    both, "density", ["both_sparse"], "both_dense"
                )
    return out


def write_atomically(path: pathlib.Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds after warm-up")
    default_out = BENCHMARKS / "results" / "sparse_kernels_cpu.json"
    parser.add_argument("--out", type=pathlib.Path, default=default_out)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    payload = dict(
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        backend=jax.default_backend(),
        jax=jax.__version__,
        dtype="float32",
        repeats=args.repeats,
        load_average=os.getloadavg(),
        note="ms per call, jitted, interleaved repeats after two warm-up calls",
    )
    sections = dict(
        spgemm=section_spgemm, spmv=section_spmv, pair_ratio=section_pair_ratio,
        storage=section_storage,
    )  # fmt: skip
    for name in args.sections:
        payload[name] = sections[name](args.repeats)
        payload["summary"] = summarize(payload)
        write_atomically(args.out, payload)
    print(json.dumps(payload["summary"], indent=1, default=lambda x: x))


if __name__ == "__main__":
    main()
