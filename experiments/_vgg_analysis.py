"""The paper's Fig. 10 analysis: the FLOPs of every product of BPPSA's scan over the transposed
Jacobians of a pruned VGG-11, against the dense back-propagation (BP) that JAX runs.

Everything is symbolic: the layers' patterns come from ``chain.transposed_jacobians`` under
``jax.eval_shape`` (real pattern sizes, no values), and the products of the scan from
:func:`bppsa.scan.chain_plan` (level, sweep, kind, shapes, nnz, FLOPs = 2 x matched pairs,
the dense product's 2mnk, and whether the product lies on a longest chain of dependent products).

Counts, for a batch of ``B`` examples:

* the scan (``levels``): the sum of its products' FLOPs; its critical path, the largest sum of
  FLOPs along a chain of dependent products (the work no number of workers can overlap); and
  the products ``chain_plan`` flags critical (on a longest chain counted in products);
* the sequential sparse chain: ``2 x nnz x B`` per layer (one SpMV per layer, stored zeros of
  ReLU/MaxPool included), all on the critical path;
* BP, dense, as XLA computes it whatever the masks (a pruned weight is a stored zero): per
  Conv2d the input gradient ``2 B C_out C_in k_h k_w H_o W_o`` (the transposed convolution)
  and the weight gradient (the same count) plus the bias' ``B C_out H_o W_o``; per Linear
  ``2 B n_in n_out`` for each of the input and weight gradients; ReLU ``B n`` (one select per
  element), MaxPool2d ``B n_in`` (one compare per window slot); Flatten nothing. Its input
  gradients form a sequential chain: all on its critical path. ``jax.grad`` with respect to the
  parameters skips the first layer's input gradient; the scan computes it (``g_0``), so the
  chain totals include it on both sides and ``first_input_gradient_flops`` tells it apart.

The parameter gradients are the same work for every method (each layer's own output cotangent
against its input); they are reported apart and added in the ``with_weight_gradients`` totals.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from bppsa.models import Chain, Conv2d, Flatten, Linear, MaxPool2d, ReLU
from bppsa.scan import chain_plan


def layer_maps(chain: Chain, params: list, masks: list | None, batch: int, input_size: int):
    """The layers' transposed Jacobians as patterns with abstract values (nothing computed)."""
    x = jax.ShapeDtypeStruct((batch, 3, input_size, input_size), jnp.float32)
    return jax.eval_shape(lambda p, x: chain.transposed_jacobians(p, x, masks=masks), params, x)


def bp_flops(layer, input_shape: tuple[int, ...], batch: int) -> dict[str, int]:
    """Dense BP's FLOPs of one layer: ``input`` (its input gradient) and ``weight`` (its
    parameter gradients), see the module docstring."""
    n_in = math.prod(input_shape)
    if isinstance(layer, Conv2d):
        out = layer.output_shape(input_shape)
        kh, kw = layer.kernel_size
        mults = batch * layer.out_channels * layer.in_channels * kh * kw * out[1] * out[2]
        return {"input": 2 * mults, "weight": 2 * mults + batch * math.prod(out)}
    if isinstance(layer, Linear):
        mults = batch * layer.in_features * layer.out_features
        return {"input": 2 * mults, "weight": 2 * mults + batch * layer.out_features}
    if isinstance(layer, ReLU):
        return {"input": batch * n_in, "weight": 0}
    if isinstance(layer, MaxPool2d):
        out = layer.output_shape(input_shape)
        slots = out[0] * out[1] * out[2] * layer.kernel_size[0] * layer.kernel_size[1]
        return {"input": batch * slots, "weight": 0}
    if isinstance(layer, Flatten):
        return {"input": 0, "weight": 0}
    raise TypeError(f"no FLOP count for a layer of type {type(layer).__name__}.")


def layers_table(chain: Chain, maps: list, batch: int, input_size: int) -> list[dict[str, Any]]:
    """Per layer: its type, ``J^T``'s shape, nnz and density, and the FLOPs of BP and of the
    sequential sparse chain."""
    shapes = chain.shapes((3, input_size, input_size))
    rows = []
    for i, (layer, jac_t) in enumerate(zip(chain, maps)):
        flops = bp_flops(layer, shapes[i], batch)
        row = dict(
            index=i,
            layer=type(layer).__name__,
            input_shape=list(shapes[i]),
            output_shape=list(shapes[i + 1]),
            bp_input_flops=flops["input"],
            bp_weight_flops=flops["weight"],
        )
        if jac_t is None:
            row |= dict(shape_t=None, nnz=0, density=None, per_example=False, spmv_flops=0)
        else:
            copies = math.prod(jac_t.values.shape[1:-1])
            row |= dict(
                shape_t=list(jac_t.pattern.shape),
                nnz=jac_t.pattern.nnz,
                density=jac_t.pattern.density,
                per_example=copies > 1 or isinstance(layer, ReLU | MaxPool2d),
                spmv_flops=2 * jac_t.pattern.nnz * batch,
            )
        rows.append(row)
    return rows


def scan_rows(maps: list, levels: int | None, batch: int) -> list[dict[str, Any]]:
    """Every product of the scan with ``levels`` (rows of ``chain_plan`` as dicts)."""
    present = [m for m in maps if m is not None]
    return [_jsonable(dataclasses.asdict(row)) for row in chain_plan(present, levels, batch=batch)]


def critical_path_flops(rows: list[dict[str, Any]]) -> int:
    """The largest sum of FLOPs along a chain of dependent products (rows are topological)."""
    best: list[int] = []
    for row in rows:
        best.append(row["flops"] + max((best[d] for d in row["depends"]), default=0))
    return max(best, default=0)


def scan_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals of one scan's rows: all FLOPs, per kind and sweep, and on the critical path."""
    by_kind: dict[str, int] = {}
    by_sweep: dict[str, int] = {}
    for row in rows:
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + row["flops"]
        by_sweep[row["sweep"]] = by_sweep.get(row["sweep"], 0) + row["flops"]
    depth: list[int] = []
    for row in rows:
        depth.append(1 + max((depth[d] for d in row["depends"]), default=0))
    return dict(
        products=len(rows),
        flops=sum(r["flops"] for r in rows),
        dense_flops=sum(r["dense_flops"] for r in rows),
        flops_by_kind=by_kind,
        flops_by_sweep=by_sweep,
        critical_path_flops=critical_path_flops(rows),
        critical_flagged_flops=sum(r["flops"] for r in rows if r["critical"]),
        critical_steps=max(depth, default=0),
        dense_products=sum(r["format"] == "dense" for r in rows),
        floats=sum(r["floats"] for r in rows),
    )


def baselines(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """The totals of BP (dense) and of the sequential sparse chain over ``layers``."""
    weight = sum(r["bp_weight_flops"] for r in layers)
    bp_chain = sum(r["bp_input_flops"] for r in layers)
    sparse_chain = sum(r["spmv_flops"] for r in layers)
    return dict(
        bp=dict(
            flops=bp_chain,
            critical_path_flops=bp_chain,
            first_input_gradient_flops=layers[0]["bp_input_flops"],
            weight_gradient_flops=weight,
            steps=sum(r["bp_input_flops"] > 0 for r in layers),
        ),
        sparse_chain=dict(
            flops=sparse_chain,
            critical_path_flops=sparse_chain,
            steps=sum(r["shape_t"] is not None for r in layers),
        ),
        weight_gradient_flops=weight,
    )


def compare(totals: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A scan's totals against BP's and the sparse chain's (ratios > 1: the scan does more)."""
    bp, chain, weight = base["bp"], base["sparse_chain"], base["weight_gradient_flops"]
    return dict(
        flops_over_bp=_ratio(totals["flops"], bp["flops"]),
        critical_path_over_bp=_ratio(totals["critical_path_flops"], bp["critical_path_flops"]),
        flops_over_sparse_chain=_ratio(totals["flops"], chain["flops"]),
        critical_path_over_sparse_chain=_ratio(
            totals["critical_path_flops"], chain["critical_path_flops"]
        ),
        with_weight_gradients=dict(
            bppsa_flops=totals["flops"] + weight,
            bp_flops=bp["flops"] + weight,
            sparse_chain_flops=chain["flops"] + weight,
        ),
    )


def levels_key(levels: int | None) -> str:
    return "all" if levels is None else str(levels)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _jsonable(value):
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def run(
    chain: Chain,
    params: list,
    masks: list,
    levels: list[int | None],
    out_dir,
    config: dict[str, Any],
    *,
    batch: int,
    input_size: int,
    extra: dict[str, Any],
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """The analysis for every ``levels`` (one point each in ``analyze.jsonl``, resumable), and
    the whole result in ``analyze.json`` (written atomically); returns that result."""
    import pathlib

    from tqdm.auto import tqdm

    from experiments._records import resume_points, run_metadata
    from paper_figures.result_files import JsonLines, write_json

    out_dir = pathlib.Path(out_dir)
    log = JsonLines(out_dir / POINTS)
    if overwrite:
        log.path.unlink(missing_ok=True)
    maps = layer_maps(chain, params, masks, batch, input_size)
    layers = layers_table(chain, maps, batch, input_size)
    base = baselines(layers)

    def measure(point):
        rows = scan_rows(maps, point["levels"], batch)
        totals = scan_totals(rows)
        return dict(rows=rows, totals=totals, versus=compare(totals, base))

    points = [{"levels": k} for k in levels]
    bar = tqdm(points, desc="scan plans", disable=not progress, dynamic_ncols=True)
    done = resume_points(log, config, bar, measure, what="analysis")
    by_levels = {levels_key(row["point"]["levels"]): row for row in done}
    result = (
        dict(
            metadata=run_metadata(config),
            batch=batch,
            input_size=input_size,
            layers=layers,
            baselines=base,
            scans={
                levels_key(k): {
                    key: by_levels[levels_key(k)][key] for key in ("rows", "totals", "versus")
                }
                for k in levels
            },
        )
        | extra
    )
    write_json(out_dir / RESULT, result)
    return result


POINTS = "analyze.jsonl"
RESULT = "analyze.json"


def summary(result: dict[str, Any]) -> str:
    """The totals of every scan against BP and the sparse chain, as text."""
    base = result["baselines"]
    bp, chain = base["bp"], base["sparse_chain"]
    lines = [
        f"BP (dense, JAX): chain of input gradients {_g(bp['flops'])} FLOPs, all on its critical "
        f"path ({bp['steps']} steps); weight gradients {_g(base['weight_gradient_flops'])} "
        f"(the same for every method); jax.grad skips the first layer's input gradient "
        f"({_g(bp['first_input_gradient_flops'])})",
        f"sequential sparse chain (SpMV per layer): {_g(chain['flops'])} FLOPs, "
        f"{chain['steps']} steps, {_r(chain['flops'], bp['flops'])} of BP",
    ]
    for key, scan in result["scans"].items():
        t, v = scan["totals"], scan["versus"]
        name = "full modified Blelloch" if key == "all" else f"Blelloch, {key} parallel levels"
        lines.append(
            f"BPPSA ({name}): {t['products']} products, all {_g(t['flops'])} FLOPs "
            f"({_x(v['flops_over_bp'])} BP's), critical path {_g(t['critical_path_flops'])} "
            f"({_x(v['critical_path_over_bp'])} BP's, {t['critical_steps']} steps), "
            f"{t['dense_products']} dense products"
        )
    weight = base["weight_gradient_flops"]
    parts = [f"BP {_g(bp['flops'] + weight)}", f"sparse chain {_g(chain['flops'] + weight)}"]
    for key, scan in result["scans"].items():
        total = scan["totals"]["flops"] + weight
        parts.append(f"BPPSA {key} levels {_g(total)} ({_r(total, bp['flops'] + weight)} BP's)")
    lines.append("with the weight gradients (dense, the same for all): " + ", ".join(parts))
    return "\n".join(lines)


def _g(flops: float) -> str:
    return f"{flops / 1e9:.4g} G"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3g}x"


def _r(a: float, b: float) -> str:
    return _x(a / b if b else None)
