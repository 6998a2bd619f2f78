"""Re-training a pruned VGG-11, the paper's use case for sparse BPPSA: a briefly trained network
is pruned and then trained further with BP and with BPPSA in lockstep on the same batches.

1. Dense pre-training (``pretrain/``): ``pretrain_iterations`` of the unpruned network with BP,
   then its parameters are saved to ``pretrained.npz`` (``analyze`` and ``benchmark`` accept
   it as ``--checkpoint``).
2. Pruning: magnitude masks of those parameters (NumPy, concrete), pruned weights set to zero.
3. Re-training (``runs/<method>/``): one run per method from the same pruned parameters, the
   same optimizer and the same batches, the masks closed over in the loss (so the pruned
   entries are absent from the sparse patterns and stay zero: their gradient is zero).
   Every run logs the per-iteration loss and times (``experiments._training``); the runs
   alternate every ``chunk`` iterations.

The summary (``retrain.json``) holds the pruning, the largest relative per-iteration loss
difference of every method from BP, the final test accuracy and the per-phase medians.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

import bppsa
from bppsa.models import sparsity_of
from experiments import _report, _vgg_model
from experiments._records import load_checkpoint, save_checkpoint
from experiments._sweep import compare
from experiments._training import Task, Trainer, run_together
from paper_figures.result_files import methods as method_names
from paper_figures.result_files import read_json, write_json

PRETRAINED = "pretrained.npz"
SUMMARY = "retrain.json"


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one re-training experiment (every method's run shares them)."""

    data: str = "digits"
    root: str | None = None
    input_size: int = 32
    width_divisor: int = 1
    sparsity: float = 0.97
    scope: str = "global"
    batch: int = 16
    lr: float = 1e-3
    pretrain_iterations: int = 300
    iterations: int = 200
    seed: int = 0
    eval_batch: int = 128
    forward_every: int = 1

    def net(self):
        return _vgg_model.vgg11_chain(self.input_size, self.width_divisor)


def _evaluator(chain, masks, test: _vgg_model.Images, batch: int):
    logits = jax.jit(lambda p, x: chain.forward(p, x, masks=masks))

    def evaluate(params) -> dict[str, float]:
        loss = correct = 0.0
        for start in range(0, len(test), batch):
            x, y = test.images[start : start + batch], test.labels[start : start + batch]
            out = logits(params, x)
            loss += float(optax.softmax_cross_entropy_with_integer_labels(out, y).sum())
            correct += float((np.asarray(out).argmax(-1) == y).sum())
        return {"test_loss": loss / len(test), "test_accuracy": correct / len(test)}

    return evaluate


def _task(config: Config, chain, params, masks, train, test) -> Task:
    return Task(
        loss=_vgg_model.loss_fn(chain, masks),
        params=params,
        batches=lambda start: (train.batch(i, config.batch, config.seed) for i in _count(start)),
        iterations_per_epoch=train.image_set.batches_per_epoch(config.batch),
        evaluate=_evaluator(chain, masks, test, config.eval_batch),
    )


def _count(start: int):
    i = start
    while True:
        yield i
        i += 1


PRETRAIN_ONLY = ("data", "root", "input_size", "width_divisor", "batch", "lr", "seed")


def identity(config: Config, train: _vgg_model.Images, stage: str) -> dict[str, Any]:
    """What a run must match to be resumed: for ``"pretrain"`` what the dense training
    depends on (it may be extended), for ``"retrain"`` also the pruning and the pre-training's
    length (its starting point), and the data."""
    out = dataclasses.asdict(config)
    out.pop("iterations")
    if stage == "pretrain":
        out = {key: out[key] for key in PRETRAIN_ONLY}
    out["data_set"] = dict(name=train.name, synthetic=train.synthetic, images=len(train))
    return out | dict(stage=stage)


def pretrain(config: Config, out_dir: pathlib.Path, train, test, *, overwrite, progress):
    """Dense pre-training (BP); returns the pretrained parameters (also in ``pretrained.npz``)."""
    chain = config.net()
    params = _vgg_model.init_params(chain, config.seed)
    optimizer = optax.adam(config.lr)
    trainer = Trainer(
        _task(config, chain, params, None, train, test),
        optimizer,
        method=bppsa.Sequential(),
        out_dir=out_dir / "pretrain",
        config=identity(config, train, "pretrain"),
        num_iterations=config.pretrain_iterations,
        checkpoint_every=max(1, min(100, config.pretrain_iterations)),
        forward_every=10,
        overwrite=overwrite,
        progress=progress,
        name="pretrain (dense, BP)",
    )
    trainer.run()
    loaded = load_checkpoint(
        out_dir / "pretrain" / "checkpoint.npz", like=(params, optimizer.init(params))
    )
    (params, _), _ = loaded
    save_checkpoint(
        out_dir / PRETRAINED,
        params,
        input_size=config.input_size,
        width_divisor=config.width_divisor,
        data=train.name,
        synthetic=train.synthetic,
        iterations=config.pretrain_iterations,
    )
    return chain, params


def usable_methods(chain, params, masks, methods: Sequence[str], batch: int, input_size: int):
    """The methods whose backward fits the memory limit (traced, not compiled), and the
    ``MemoryLimitError`` message of each of the others."""
    x = jax.ShapeDtypeStruct((batch, 3, input_size, input_size), np.float32)
    y = jax.ShapeDtypeStruct((batch,), np.int32)
    loss = _vgg_model.loss_fn(chain, masks)
    usable, skipped = [], {}
    for name in methods:
        try:
            jax.eval_shape(bppsa.grad(loss, method=_vgg_model.parse_method(name)), params, x, y)
        except bppsa.MemoryLimitError as error:
            skipped[name] = str(error)
            continue
        usable.append(name)
    return usable, skipped


def retrain(
    config: Config,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    chunk: int = 25,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Pre-trains, prunes and re-trains with every method; returns the summary it writes."""
    out_dir = pathlib.Path(out_dir)
    root = config.root
    train = _vgg_model.load_images(
        config.data, "train", root=root, input_size=config.input_size, seed=config.seed
    )
    test = _vgg_model.load_images(
        config.data, "test", root=root, input_size=config.input_size, seed=config.seed
    )
    chain, dense = pretrain(config, out_dir, train, test, overwrite=overwrite, progress=progress)
    params, masks = _vgg_model.prune(dense, config.sparsity, config.scope)
    empty = _vgg_model.empty_layers(chain, masks)
    usable, skipped = usable_methods(chain, params, masks, methods, config.batch, config.input_size)
    task = _task(config, chain, params, masks, train, test)
    trainers = {
        name: Trainer(
            task,
            optax.adam(config.lr),
            method=_vgg_model.parse_method(name),
            out_dir=out_dir / "runs" / name,
            config=identity(config, train, "retrain")
            | dict(method=name, resolved=_vgg_model.describe(name)),
            num_iterations=config.iterations,
            checkpoint_every=max(chunk, 100),
            forward_every=config.forward_every,
            eval_every=max(1, config.iterations // 4),
            overwrite=overwrite,
            progress=progress,
            name=f"retrain {name}",
            position=position,
        )
        for position, name in enumerate(usable)
    }
    run_together(list(trainers.values()), chunk=chunk)
    runs = {name: trainer.rows() for name, trainer in trainers.items()}
    summary = dict(
        config=dataclasses.asdict(config),
        data=dict(name=train.name, synthetic=train.synthetic, train=len(train), test=len(test)),
        net=_vgg_model.net_name(config.input_size, config.width_divisor),
        sparsity=sparsity_of(masks)._asdict(),
        empty_layers=empty,
        methods={name: _vgg_model.describe(name) for name in usable},
        skipped=skipped,
        pretrain=_final_eval(out_dir / "pretrain"),
        loss_max_relative_difference=_report.loss_differences(runs, method_names.BASELINE),
        final=_finals(runs),
        timing=compare(runs, method_names.BASELINE, skip=1),
        loss_table=_report.loss_table(runs, method_names.BASELINE),
    )
    write_json(out_dir / SUMMARY, summary)
    return summary


def _final_eval(run_dir: pathlib.Path) -> dict[str, Any] | None:
    from paper_figures.result_files import JsonLines

    evals = [r for r in JsonLines(run_dir / "metrics.jsonl").read() if r.get("kind") == "eval"]
    return evals[-1] if evals else None


def _finals(runs: dict[str, list[dict]]) -> dict[str, Any]:
    out = {}
    for name, rows in runs.items():
        steps = [r for r in rows if r.get("kind") == "step"]
        evals = [r for r in rows if r.get("kind") == "eval"]
        out[name] = dict(
            iterations=len(steps),
            last_loss=steps[-1]["loss"] if steps else None,
            wall_clock_s=steps[-1]["wall_clock_s"] if steps else None,
            test_accuracy=evals[-1].get("test_accuracy") if evals else None,
            test_loss=evals[-1].get("test_loss") if evals else None,
        )
    return out


def load_summary(out_dir: str | pathlib.Path) -> dict[str, Any]:
    return read_json(pathlib.Path(out_dir) / SUMMARY)
