"""The Newton forward in a language model's layers: iterations, fallbacks, accuracy, time.

For a character-level language model (``experiments/char_lm.py``) trained by a run (``--run``:
its folder; the parameters of one method's checkpoint, ``--method``) or at its initialization
(no ``--run``: ``--cell``, ``--width``, ``--layers``), on validation windows of the corpus
(``--data``) of each length of ``--lengths`` (also longer than the run's training windows):

* per layer, every window separately: the Newton iterations (mean, max), the windows that
  converged (the others fell back to sequential steps after their converged prefix), the mean
  fallback steps, the largest certified residual (relative to the tolerance's scale);
* the logits' largest difference from those of the sequential forward, relative to their
  largest value;
* with ``--rounds N``: the forward of the whole batch (``jax.vmap`` over the windows), Newton
  against ``lax.scan``, each its own program, timed round by round right after an untimed call
  of itself (:func:`experiments.timing.interleaved`), minimum and median.

Rows are appended to a JSON-lines file (``--out``) as they finish; a rerun skips the rows it
finds. Run: ``.venv/bin/python -m benchmarks.newton_lm --run results/char_lm/quick-diagonal-gru
--lengths 128 1024 4096 --out benchmarks/results/width/newton_lm_cpu.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

import bppsa
from experiments.char_lm import CELLS, CHECKPOINT, CONFIG, Config, load_checkpoint, load_corpus
from experiments.timing import interleaved, min_median
from paper_figures.result_files import JsonLines


def load_model(args):
    """``(model, params, source)``: a run's trained model, or a freshly initialized one."""
    corpus = load_corpus(args.data)
    vocab = len(corpus.vocabulary)
    if args.run is None:
        config = Config(cell=args.cell, width=args.width, layers=args.layers)
        model = config.model(vocab)
        params = model.init(key=jax.random.key(args.seed))
        return corpus, model, params, dict(source="init", seed=args.seed)
    run = pathlib.Path(args.run)
    recorded = json.loads((run / CONFIG).read_text())["config"]
    config = Config(**recorded)
    model = config.model(vocab)
    like = model.init(key=jax.random.key(0))
    path = run / args.method / CHECKPOINT
    loaded = load_checkpoint(path, like=(like, config.optimizer().init(like)))
    if loaded is None:
        raise SystemExit(f"benchmarks.newton_lm: no checkpoint at {path}")
    (params, _), extra = loaded
    source = dict(source=run.name, method=args.method, trained=extra.get("iteration"))
    return corpus, model, params, source


def layer_infos(model, params, windows) -> tuple[list[list[dict]], np.ndarray]:
    """Per window, the :class:`bppsa.NewtonInfo` of each layer's scan (in call order: each
    layer's scan needs the previous layer's outputs), and the windows' Newton logits."""
    infos: list = []
    newton = bppsa.Newton(callback=infos.append)
    call = jax.jit(lambda p, w: model.logits(p, w, forward=newton))
    out, logits = [], []
    for window in windows:
        infos.clear()
        logits.append(np.asarray(call(params, window), np.float64))
        jax.effects_barrier()
        if len(infos) != model.layers:
            raise RuntimeError(f"expected {model.layers} Newton reports, got {len(infos)}")
        out.append([{k: np.asarray(v).item() for k, v in i._asdict().items()} for i in infos])
    return out, np.stack(logits)


def summarize_layers(per_window: list[list[dict]]) -> list[dict]:
    layers = []
    for layer in zip(*per_window, strict=True):
        its = [i["iterations"] for i in layer]
        layers.append(
            dict(
                iterations_mean=statistics.fmean(its),
                iterations_max=max(its),
                converged=sum(bool(i["converged"]) for i in layer) / len(layer),
                fallback_steps_mean=statistics.fmean(i["fallback_steps"] for i in layer),
                residual_max=max(i["residual"] for i in layer),
            )
        )
    return layers


def measure(model, params, corpus, length, batch, dtype, rounds, seed) -> dict:
    inputs, _ = corpus.batch("validation", 0, batch, length, seed=seed)
    windows = jnp.asarray(inputs)
    params = jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, params
    )
    row = dict(length=length, batch=batch, dtype=jnp.dtype(dtype).name)
    infos, newton = layer_infos(model, params, windows)
    row["layers"] = summarize_layers(infos)
    forward = {
        "sequential": jax.jit(jax.vmap(lambda p, w: model.logits(p, w), in_axes=(None, 0))),
        "newton": jax.jit(
            jax.vmap(lambda p, w: model.logits(p, w, forward=bppsa.Newton()), in_axes=(None, 0))
        ),
    }
    reference = np.asarray(forward["sequential"](params, windows), np.float64)
    row["logits_relative_difference"] = float(
        np.max(np.abs(newton - reference)) / np.max(np.abs(reference))
    )
    if rounds:
        times = interleaved(
            {name: functools.partial(call, params, windows) for name, call in forward.items()},
            rounds,
        )
        row |= min_median(times)
        row["newton_speedup_median"] = row["sequential_median_s"] / row["newton_median_s"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a char_lm run folder (default: an initialized model)")
    parser.add_argument("--method", default="bp", help="whose checkpoint of the run")
    parser.add_argument("--data", default="data/shakespeare", help="the corpus of the run")
    parser.add_argument("--cell", default="diagonal-gru", choices=list(CELLS))
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--batch", type=int, default=8, help="validation windows per length")
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (0: no timing)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/newton_lm.jsonl"))
    args = parser.parse_args(argv)
    if any(d == "float64" for d in args.dtypes):
        jax.config.update("jax_enable_x64", True)
    corpus, model, params, source = load_model(args)
    log = JsonLines(args.out)
    done = {
        (r["length"], r["dtype"])
        for r in log.read()
        if r.get("model") == repr(model) and r.get("from") == source
    }
    for dtype in args.dtypes:
        for length in args.lengths:
            if (length, dtype) in done:
                continue
            row = measure(model, params, corpus, length, args.batch, dtype, args.rounds, args.seed)
            row = dict(model=repr(model), **{"from": source}, backend=jax.default_backend(), **row)
            log.append(row)
            layers = "; ".join(
                f"L{k}: {r['iterations_mean']:.1f} it (max {r['iterations_max']}), "
                f"{100 * r['converged']:.0f}% converged"
                for k, r in enumerate(row["layers"])
            )
            line = f"T={length:<6} {dtype}: {layers}; logits rel diff "
            line += f"{row['logits_relative_difference']:.1e}"
            if args.rounds:
                line += f"; Newton forward x{row['newton_speedup_median']:.2f}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
