"""Measured backward of the pruned VGG-11: sparse BPPSA against JAX's dense back-propagation.

At every point (pruning sparsity, batch size): the network pruned to that sparsity, a batch of
seeded normal images with labels, and the loss ``cross-entropy(chain.apply(params, x, masks))``
with the masks closed over (concrete: the pruned entries are absent from every pattern). Per
method (``bp`` = ``Sequential()``: ``jax.grad`` of the plain forward, dense; the others run
``bppsa``'s scan over the layers' sparse transposed Jacobians), the method bound inside the loss
(:func:`experiments.methods.bind`):

* the gradient's three programs are compiled ahead of time
  (:class:`experiments.timing.GradientPrograms`): ``total``, ``jax.value_and_grad`` (what
  ``bppsa.grad(loss, method)`` runs); ``forward``, the forward of ``jax.vjp`` (the forward as it
  runs inside the gradient); ``backward``, its pullback applied to saved residuals, the backward as
  its own program. A method whose backward would exceed the memory limit raises
  ``bppsa.MemoryLimitError`` while it is traced: the point records it as skipped, with the library's
  estimate;
* memory: XLA's ``memory_analysis()`` of the compiled gradient (``temp + argument + output``
  bytes: its peak on the device as XLA plans it) and ``chain.estimate_memory`` (the library's
  model of the backward);
* time: every program of every method timed once per round for ``repeats`` rounds, each right
  after an untimed call of itself (:func:`experiments.timing.time_gradients`), medians and minima
  (``total_ms``, ``forward_ms``, ``backward_ms`` and their ``_min_ms``); never a difference of
  two programs (``"backward": "pullback"``);
* agreement: the largest difference of every method's parameter gradients from BP's, relative
  to the largest BP gradient.

``ratio = backward_method / backward_BP`` (below 1: faster than BP) and ``speedup = 1 / ratio``,
from the medians and (``_min``) from the minima.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import bppsa
from experiments import _vgg_model
from experiments.methods import bind
from experiments.timing import GradientPrograms, ms_fields, quartiles, time_gradients
from paper_figures.result_files import PULLBACK
from paper_figures.result_files import methods as method_names

_DIGITS = 7


def measure(
    chain,
    params: list,
    masks: list,
    batch: int,
    input_size: int,
    methods: Sequence[str],
    *,
    repeats: int,
    seed: int = 0,
    memory_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One point: the times, memory and agreement of every method (see the module docstring);
    ``memory_limit``: bytes the backward may use (``None``: the device's available memory)."""
    key_x, key_y = jax.random.split(jax.random.key(seed + 1))
    x = jax.random.normal(key_x, (batch, 3, input_size, input_size))
    y = jax.random.randint(key_y, (batch,), 0, _vgg_model.NUM_CLASSES)
    loss = _vgg_model.loss_fn(chain, masks)
    programs, entries, grads = {}, {}, {}
    for name in methods:
        if progress is not None:
            progress(f"compiling {name}")
        method = _vgg_model.parse_method(name)
        entry: dict[str, Any] = dict(resolved=repr(method))
        try:
            entry["estimate_bytes"] = int(
                chain.estimate_memory(params, x, masks=masks, method=method)
            )
        except bppsa.MemoryLimitError as error:  # pragma: no cover - an estimate never runs
            entry["estimate_bytes"] = int(error.estimate)
        bound = bind(loss, method=method, memory_limit=memory_limit)
        try:
            with bppsa.trace_plans() as plans:
                program = GradientPrograms.from_loss(bound, params, x, y)
        except bppsa.MemoryLimitError as error:
            entry |= dict(
                skipped="MemoryLimitError",
                estimate_bytes=int(error.estimate),
                limit_bytes=float(error.limit),
                message=str(error),
            )
            entries[name] = entry
            continue
        entry["compile_s"] = {q: round(s, 3) for q, s in program.compile_seconds.items()}
        backward = next((p.backward or p.method for p in plans), None)
        if backward is not None:
            entry["ran"] = backward.describe() if hasattr(backward, "describe") else repr(backward)
        entry["memory"] = _memory(program.total)
        grads[name] = jax.block_until_ready(program.total(params, x, y))[1]
        programs[name] = program
        entries[name] = entry
    _agreement(entries, grads)
    del grads
    times: dict[str, dict[str, list[float]]] = {name: {} for name in programs}
    for r in range(repeats):
        for name, quantities in time_gradients(programs, 1).items():
            for quantity, ts in quantities.items():
                times[name].setdefault(quantity, []).extend(ts)
        if progress is not None:
            progress(f"round {r + 1}/{repeats}")
    for name, quantities in times.items():
        entries[name] |= {
            k: v if v is None else _round(v) for k, v in ms_fields(quantities).items()
        }
        entries[name]["quartiles_ms"] = {
            q: quartiles([1e3 * t for t in ts], _DIGITS) for q, ts in quantities.items()
        }
        entries[name]["backward_kernel_ms"] = programs[name].backward_kernel_ms()  # GPU only
    base = entries.get(method_names.BASELINE, {})
    for entry in entries.values():
        for suffix in ("", "_min"):
            ratio = _ratio(entry.get(f"backward{suffix}_ms"), base.get(f"backward{suffix}_ms"))
            entry[f"ratio{suffix}"] = ratio
            entry[f"speedup{suffix}"] = None if not ratio else 1.0 / ratio
    return dict(repeats=repeats, backward=PULLBACK, methods=entries)


def _memory(compiled) -> dict[str, int] | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")
    out = {f.removesuffix("_size_in_bytes"): int(getattr(analysis, f, 0) or 0) for f in fields}
    out["peak"] = sum(out.values())
    return out


def _agreement(entries: dict[str, dict], grads: dict[str, Any]) -> None:
    reference = grads.get(method_names.BASELINE)
    if reference is None:
        return
    ref_leaves = jax.tree.leaves(reference)
    scale = max(float(jnp.max(jnp.abs(leaf))) for leaf in ref_leaves)
    for name, tree in grads.items():
        diff = max(
            float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(tree), ref_leaves)
        )
        entries[name]["max_grad_diff"] = diff
        entries[name]["max_grad_diff_relative"] = diff / scale if scale else diff


def crossover(rows: Sequence[dict[str, Any]], method: str = method_names.SEQUENTIAL_JACOBIANS):
    """Where ``method``'s backward beats dense BP (``speedup > 1``, from the medians) and where
    it stops paying: per sparsity the largest batch it still wins at, per batch the lowest
    sparsity; plus a sentence."""
    wins, losses, skipped, noise = [], [], [], []
    for row in rows:
        point, entry = row["point"], row["methods"].get(method, {})
        where = (point["sparsity"], point["batch"])
        if entry.get("skipped") or not entry:
            skipped.append(where)
        elif entry.get("speedup") is None:  # a backward at or below the timing noise
            noise.append(where)
        elif entry["speedup"] > 1:
            wins.append(where)
        else:
            losses.append(where)
    sparsities = sorted({p[0] for p in wins + losses + skipped})
    batches = sorted({p[1] for p in wins + losses + skipped})
    largest_batch = {
        str(s): max((b for s2, b in wins if s2 == s), default=None) for s in sparsities
    }
    lowest_sparsity = {str(b): min((s for s, b2 in wins if b2 == b), default=None) for b in batches}
    parts = []
    for s in sparsities:
        won = [b for s2, b in sorted(wins) if s2 == s]
        lost = [b for s2, b in sorted(losses) if s2 == s]
        if won and not lost:
            parts.append(f"at {100 * s:g}% it beats BP at every batch measured ({_list(won)})")
        elif lost and not won:
            parts.append(f"at {100 * s:g}% it loses to BP at every batch measured ({_list(lost)})")
        elif won:
            parts.append(
                f"at {100 * s:g}% it wins at B = {_list(won)} and loses at B = {_list(lost)}"
            )
    summary = (
        f"{method} vs dense BP (backward, medians): " + ("; ".join(parts) or "no points") + "."
    )
    return dict(
        method=method,
        wins=[list(p) for p in wins],
        losses=[list(p) for p in losses],
        skipped=[list(p) for p in skipped],
        below_noise=[list(p) for p in noise],
        largest_winning_batch=largest_batch,
        lowest_winning_sparsity=lowest_sparsity,
        summary=summary,
    )


def table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per point and method: the backward (its own program; median and minimum, ms),
    its ratio to BP's, the whole gradient (ms), peak memory (MB)."""
    lines = [
        f"{'sparsity':>8} {'B':>3} {'method':<22} {'bwd ms':>9} {'min ms':>9} {'/ BP':>7} "
        f"{'total ms':>9} {'XLA peak MB':>11} {'estimate MB':>11}  note"
    ]
    for row in rows:
        point = row["point"]
        for name, m in row["methods"].items():
            peak = (m.get("memory") or {}).get("peak")
            note = m.get("skipped", "")
            if m.get("max_grad_diff_relative") is not None and name != method_names.BASELINE:
                note = note or f"grads vs BP {m['max_grad_diff_relative']:.1e}"
            lines.append(
                f"{point['sparsity']:>8g} {point['batch']:>3} {name:<22} "
                f"{_ms(m.get('backward_ms')):>9} {_ms(m.get('backward_min_ms')):>9} "
                f"{_x(m.get('ratio')):>7} {_ms(m.get('total_ms')):>9} {_mb(peak):>11} "
                f"{_mb(m.get('estimate_bytes')):>11}  {note}"
            )
    return "\n".join(lines)


def _list(values) -> str:
    return ", ".join(str(v) for v in values)


def _ratio(a, b) -> float | None:
    if a is None or b is None or b <= 0 or a <= 0:
        return None
    return a / b


def _round(value: float) -> float:
    return round(value, _DIGITS)


def _ms(ms) -> str:
    return "-" if ms is None else f"{ms:.2f}"


def _mb(value) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def _x(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


POINTS = "benchmark.jsonl"
RESULT = "benchmark.json"


def run(
    chain,
    params: list,
    points: list[dict[str, Any]],
    methods: Sequence[str],
    out_dir,
    config: dict[str, Any],
    *,
    input_size: int,
    scope: str,
    repeats: int,
    seed: int = 0,
    memory_limit: float | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every point (``{"sparsity", "batch"}``) not yet in ``benchmark.jsonl``; then the
    summary with the crossover in ``benchmark.json`` (atomically). Returns the summary."""
    import pathlib

    from tqdm.auto import tqdm

    from bppsa.models import sparsity_of
    from experiments._records import resume_points, run_metadata
    from paper_figures.result_files import JsonLines, write_json

    out_dir = pathlib.Path(out_dir)
    log = JsonLines(out_dir / POINTS)
    if overwrite:
        log.path.unlink(missing_ok=True)
    bar = tqdm(points, desc="benchmark", disable=not progress, dynamic_ncols=True)

    def one(point):
        pruned, masks = _vgg_model.prune(params, point["sparsity"], scope)
        label = f"{100 * point['sparsity']:g}% B={point['batch']}"
        row = measure(
            chain,
            pruned,
            masks,
            point["batch"],
            input_size,
            methods,
            repeats=repeats,
            seed=seed,
            memory_limit=memory_limit,
            progress=lambda text: bar.set_postfix_str(f"{label}: {text}"),
        )
        return row | dict(
            weight_sparsity=sparsity_of(masks).overall,
            empty_layers=_vgg_model.empty_layers(chain, masks),
        )

    rows = resume_points(log, config, bar, one, what="benchmark", on_point=on_point)
    rows = [r for r in rows if r["point"] in points]
    result = dict(
        metadata=run_metadata(config),
        backward=PULLBACK,
        points=rows,
        crossover={
            name: crossover(rows, name) for name in methods if name != method_names.BASELINE
        },
    )
    write_json(out_dir / RESULT, result)
    return result
