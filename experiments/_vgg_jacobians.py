"""Table 1 of the paper: generating the transposed Jacobians of VGG-11's first Conv2d, ReLU and
MaxPool2d analytically (sparse, with static patterns) against by reverse-mode autodiff (dense).

For one example (B = 1) at the input size ``S``: the image ``x`` (seeded normal values), the
first convolution's input; ``z = conv(x)``, the ReLU's input; ``relu(z)``, the pooling's input.
For each layer:

* analytic: :func:`bppsa.jacobians.conv2d_jacobian_t` (``relu_jacobian_t``,
  ``maxpool2d_jacobian_t``) under ``jax.jit``: the values of ``J^T`` in its static pattern;
* dense: ``jax.jacrev`` of the layer on the flattened input, jitted: the full ``J`` (n_out,
  n_in). When ``J`` and the identity ``jax.jacrev`` pushes through (``n_out x n_out``) would
  exceed ``dense_budget`` bytes (at 32x32 the ReLU's ``J`` alone is 17 GB), the same
  computation runs in blocks of rows: ``jax.vmap`` of the layer's VJP over ``block`` rows of
  the identity (what ``jax.jacrev`` does, ``block`` rows at a time), one jitted call per
  block, each block dropped after it is waited for; the time is that of all blocks.

Protocol: each function is compiled and called once untimed; both results are compared (the
dense ``J^T`` must equal the analytic one, and be zero outside its pattern); then in each of
``repeats`` rounds each is timed once, right after an untimed call of itself
(:func:`experiments.timing.interleaved`). Medians and quartiles are kept;
``speedup = dense / analytic``. The first call (trace, pattern construction in NumPy and
compilation) is recorded too.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse

from bppsa.jacobians import conv2d_jacobian_t, maxpool2d_jacobian_t, relu_jacobian_t
from bppsa.models import Conv2d, MaxPool2d, ReLU
from experiments.timing import interleaved, quartiles

LAYERS = ("conv", "relu", "maxpool")
TITLES = {"conv": "Conv2d(3, 64, 3, padding=1)", "relu": "ReLU", "maxpool": "MaxPool2d(2)"}
# Guaranteed-zero fractions the paper reports for these layers on 32x32 inputs.
PAPER_SPARSITY = {"conv": 0.99157, "relu": 0.99998, "maxpool": 0.99994}
DENSE_BUDGET = 2 << 30  # bytes of J plus the identity jax.jacrev pushes through
BLOCK_BUDGET = 256 << 20  # bytes of one block (identity rows plus J rows)
_DIGITS = 7


def layer_inputs(input_size: int, seed: int) -> dict[str, tuple[Any, dict, Any]]:
    """``{layer: (layer object, params, its input (1, C, S, S))}`` of VGG-11's first layers."""
    conv, relu, pool = Conv2d(3, 64, 3, padding=1), ReLU(), MaxPool2d(2)
    key_x, key_w = jax.random.split(jax.random.key(seed))
    params = conv.init(key_w)
    x = jax.random.normal(key_x, (1, 3, input_size, input_size))
    z = conv(params, x)
    return {"conv": (conv, params, x), "relu": (relu, {}, z), "maxpool": (pool, {}, relu({}, z))}


def analytic(name: str, layer, params: dict) -> Callable:
    """``fn(x) -> Sparse``: the layer's ``J^T`` at ``x`` from the analytic builder."""
    if name == "conv":
        return lambda x: conv2d_jacobian_t(
            params["weight"], x.shape[-2:], stride=layer.stride, padding=layer.padding
        )
    if name == "relu":
        return relu_jacobian_t
    return lambda x: maxpool2d_jacobian_t(x, layer.kernel_size, layer.stride)


class DenseJacobian:
    """``J`` of a layer at ``x`` by reverse-mode autodiff, whole or in blocks of rows."""

    def __init__(self, layer, params: dict, x, budget: int | None = None):
        budget = DENSE_BUDGET if budget is None else budget
        self.x = x
        self.in_shape = x.shape
        self.n_in = x.size
        self.f = lambda flat: layer(params, flat.reshape(self.in_shape)).reshape(-1)
        self.n_out = jax.eval_shape(self.f, x.reshape(-1)).shape[0]
        whole = 4 * self.n_out * (self.n_out + self.n_in)
        if whole <= budget:
            self.block = self.n_out
            self.how = "jax.jacrev (whole)"
            self._fn = jax.jit(jax.jacrev(self.f))
        else:
            rows = max(1, min(budget, BLOCK_BUDGET) // (4 * (self.n_out + self.n_in)))
            self.block = min(self.n_out, 1 << (rows.bit_length() - 1))
            self.how = (
                f"jax.vmap(jax.vjp) over {self.block} rows of the identity per call (jax.jacrev "
                f"in {self.blocks} blocks: J and the identity it pushes through would take "
                f"{whole / 2**30:.1f} GiB)"
            )
            self._fn = jax.jit(self._rows)

    @property
    def blocks(self) -> int:
        return -(-self.n_out // self.block)

    def _rows(self, flat, start):
        _, vjp = jax.vjp(self.f, flat)
        basis = jax.nn.one_hot(start + jnp.arange(self.block), self.n_out, dtype=flat.dtype)
        return jax.vmap(lambda row: vjp(row)[0])(basis)  # rows past n_out are zero

    def compile(self) -> None:
        flat = self.x.reshape(-1)
        if self.block == self.n_out:
            self._fn = self._fn.lower(flat).compile()
        else:
            self._fn = self._fn.lower(flat, jnp.int32(0)).compile()

    def row_blocks(self):
        """Yields ``(start, J[start:start + block])`` (rows past ``n_out`` cut off)."""
        flat = self.x.reshape(-1)
        if self.block == self.n_out:
            yield 0, jax.block_until_ready(self._fn(flat))
            return
        for start in range(0, self.n_out, self.block):
            rows = jax.block_until_ready(self._fn(flat, jnp.int32(start)))
            yield start, rows[: self.n_out - start]

    def __call__(self) -> None:
        for _ in self.row_blocks():
            pass


def compare(sparse, dense: DenseJacobian) -> dict[str, Any]:
    """How the analytic ``J^T`` and the dense ``J`` differ: the largest absolute difference,
    and whether every non-zero of ``J`` lies inside the analytic pattern."""
    pattern = sparse.pattern
    values = np.asarray(sparse.values).reshape(-1)
    csc = scipy.sparse.csr_array(
        (values, pattern.cols, pattern.row_starts), shape=pattern.shape
    ).tocsc()
    inside = scipy.sparse.csr_array(
        (np.ones(pattern.nnz, bool), pattern.cols, pattern.row_starts), shape=pattern.shape
    ).tocsc()
    worst, outside, scale = 0.0, 0, 0.0
    for start, rows in dense.row_blocks():
        rows = np.asarray(rows)  # (block, n_in) = columns start.. of J^T, transposed
        stop = start + rows.shape[0]
        expected = csc[:, start:stop].toarray().T
        worst = max(worst, float(np.abs(rows - expected).max(initial=0.0)))
        scale = max(scale, float(np.abs(rows).max(initial=0.0)))
        structural = inside[:, start:stop].toarray().T
        outside += int(np.count_nonzero(rows[~structural]))
    return dict(
        max_abs_diff=worst,
        max_abs_value=scale,
        nonzeros_outside_pattern=outside,
        same=bool(outside == 0 and worst <= 1e-6 * max(scale, 1.0)),
    )


def measure(
    name: str, input_size: int, seed: int, repeats: int, dense_budget: int | None = None
) -> dict[str, Any]:
    """One row of Table 1 (see the module docstring); ``dense_budget``: bytes above which the
    dense Jacobian is computed in blocks (default :data:`DENSE_BUDGET`)."""
    layer, params, x = layer_inputs(input_size, seed)[name]
    fn = analytic(name, layer, params)
    start = time.perf_counter()
    analytic_fn = jax.jit(fn).lower(x).compile()
    sparse = jax.block_until_ready(analytic_fn(x))
    analytic_first = time.perf_counter() - start
    start = time.perf_counter()
    dense = DenseJacobian(layer, params, x, dense_budget)
    dense.compile()
    dense()
    dense_first = time.perf_counter() - start
    check = compare(sparse, dense)
    times = interleaved({"analytic": functools.partial(analytic_fn, x), "dense": dense}, repeats)
    pattern = sparse.pattern
    n_in, n_out = pattern.shape
    medians = {k: statistics.median(v) for k, v in times.items()}
    return dict(
        layer=TITLES[name],
        input_shape=list(x.shape),
        shape_t=[n_in, n_out],
        nnz=pattern.nnz,
        sparsity=1.0 - pattern.nnz / (n_in * n_out),
        paper_sparsity=PAPER_SPARSITY[name] if input_size == 32 else None,
        dense_bytes=4 * n_in * n_out,
        sparse_bytes=4 * pattern.nnz + 8 * pattern.nnz,  # float32 values, int32 rows and cols
        dense_how=dense.how,
        dense_blocks=dense.blocks,
        analytic_s=round(medians["analytic"], _DIGITS),
        dense_s=round(medians["dense"], _DIGITS),
        speedup=medians["dense"] / medians["analytic"] if medians["analytic"] > 0 else None,
        quartiles={k: quartiles(v, _DIGITS) for k, v in times.items()},
        analytic_first_call_s=round(analytic_first, 4),
        dense_first_call_s=round(dense_first, 4),
        repeats=repeats,
        check=check,
    )


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per measured layer."""
    lines = [
        "| layer | input | J^T shape | sparsity | analytic (ms) | jax.jacrev (ms) | speedup "
        "| same |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['layer']} | {'x'.join(map(str, row['input_shape'][1:]))} | "
            f"{row['shape_t'][0]} x {row['shape_t'][1]} | {row['sparsity']:.5f} | "
            f"{1e3 * row['analytic_s']:.3f} | {1e3 * row['dense_s']:.1f} | "
            f"{row['speedup']:.0f}x | {'yes' if row['check']['same'] else 'NO'} |"
        )
    return "\n".join(lines)


POINTS = "jacobians.jsonl"


def run(
    layers: list[str],
    input_size: int,
    out_dir,
    config: dict[str, Any],
    *,
    seed: int,
    repeats: int,
    dense_budget: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every layer's row not yet in ``jacobians.jsonl`` (resumable); returns all rows."""
    import pathlib

    from tqdm.auto import tqdm

    from experiments._records import resume_points
    from paper_figures.result_files import JsonLines

    log = JsonLines(pathlib.Path(out_dir) / POINTS)
    if overwrite:
        log.path.unlink(missing_ok=True)
    points = [{"layer": name, "input_size": input_size} for name in layers]
    bar = tqdm(points, desc="Table 1", disable=not progress, dynamic_ncols=True)

    def one(point):
        bar.set_postfix_str(point["layer"])
        return measure(point["layer"], input_size, seed, repeats, dense_budget)

    return resume_points(log, config, bar, one, what="Table 1 run")
