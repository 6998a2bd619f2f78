"""The runs of the GRU-on-IRMAS experiment: training (Fig. 13) and the runtime breakdown (Fig. 9),
callable from Python; ``experiments/gru_irmas.py`` is their command line."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

import bppsa
from bppsa.data import irmas
from bppsa.models import GRU, SequenceClassifier
from experiments import _irmas_breakdown, methods
from experiments._irmas_data import Clips
from experiments._records import ResultsFolderError
from experiments._training import Task, Trainer, lockstep_trainers, run_together
from paper_figures.result_files import methods as method_names


@dataclasses.dataclass(frozen=True)
class Config:
    """One training run's settings (every method's run uses the same).

    Attributes:
        variant: MFCC variant, ``"S"``, ``"M"`` or ``"L"``.
        batch, hidden, lr: batch size, GRU hidden size and Adam's learning rate.
        forward: the forward pass of the BPPSA methods, ``"sequential"`` (``lax.scan``) or
            ``"newton"`` (``bppsa.Newton()``); BP runs ``lax.scan`` in any case.
        seed: parameter initialization and the data order.
        iterations, epochs: run length; ``iterations`` wins when both are set.
        forward_every: time the forward and the backward, each its own program, every this
            many iterations.
        evaluate: training-set loss and accuracy at the end of every epoch and of the run.
    """

    variant: str = "S"
    batch: int = 16
    hidden: int = 20
    lr: float = 3e-4
    forward: str = methods.SEQUENTIAL_FORWARD
    seed: int = 0
    iterations: int | None = None
    epochs: float | None = 1.0
    forward_every: int = 1
    evaluate: bool = True

    def num_iterations(self, clips: Clips) -> int:
        if self.iterations is not None:
            return self.iterations
        return max(1, round(self.epochs * clips.batches_per_epoch(self.batch)))


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named configuration of the commands."""

    name: str
    train: Config
    repeats: int  # breakdown rounds per point
    variants: tuple[str, ...] = ("S", "M", "L")
    batches: tuple[int, ...] = (16, 32, 64)  # breakdown grid


PRESETS = {
    "quick": Preset("quick", train=Config(iterations=300, epochs=None), repeats=20),
    # The artifact's grid script trains 400 epochs per configuration; its breakdown averages the
    # iterations of those epochs, here 100 interleaved rounds per point.
    "paper": Preset("paper", train=Config(epochs=400.0), repeats=100),
    "smoke": Preset("smoke", train=Config(iterations=24, epochs=None), repeats=10),
}


GRU_ELEMENT = 4  # a GRU step's Jacobian keeps 4 H floats per example (three gate scales, z)


def describe(name: str, clips: Clips, hidden: int, batch: int) -> str:
    """What method ``name`` runs for the GRU over ``clips`` at ``batch`` (its frames as T, its
    features per step as the inputs Auto weighs)."""
    return methods.describe(
        name,
        clips.frames,
        hidden,
        batch=batch,
        element=GRU_ELEMENT * hidden,
        inputs=clips.num_features,
    )


def model_for(clips: Clips, hidden: int) -> SequenceClassifier:
    return SequenceClassifier(clips.num_features, hidden, irmas.NUM_CLASSES, cell=GRU())


def make_task(config: Config, clips: Clips) -> Task:
    """The classifier, its initial parameters and the batches of ``config`` on ``clips``."""
    model = model_for(clips, config.hidden)
    return Task(
        loss=model.loss,
        params=model.init(key=jax.random.key(config.seed)),
        batches=lambda start: clips.batches(config.batch, start),
        iterations_per_epoch=clips.batches_per_epoch(config.batch),
        evaluate=_evaluator(model, clips) if config.evaluate else None,
    )


def make_trainers(
    config: Config,
    clips: Clips,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    checkpoint_every: int = 100,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Trainer]:
    """A trainer per method, logging to ``out_dir/<method>/``, on the same data and init."""
    task = make_task(config, clips)
    identity = dataclasses.asdict(config) | {"data": clips.identity()}
    for key in ("iterations", "epochs"):  # a run may be extended
        identity.pop(key)
    eval_every = task.iterations_per_epoch if config.evaluate else None
    return lockstep_trainers(
        task,
        optax.adam(config.lr),
        methods,
        out_dir,
        identity,
        resolved=lambda name: describe(name, clips, config.hidden, config.batch),
        forward=config.forward,
        label=f"{config.variant} B={config.batch}",
        num_iterations=config.num_iterations(clips),
        checkpoint_every=checkpoint_every,
        forward_every=config.forward_every,
        eval_every=eval_every,
        overwrite=overwrite,
        progress=progress,
    )


def train(
    config: Config,
    clips: Clips,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    checkpoint_every: int = 100,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Trains every method in lockstep; returns each run's log rows."""
    trainers = make_trainers(
        config,
        clips,
        methods,
        out_dir,
        checkpoint_every=checkpoint_every,
        overwrite=overwrite,
        progress=progress,
    )
    for trainer in trainers.values():
        try:
            trainer.start()
        except ValueError as error:  # another configuration, or a foreign checkpoint
            raise ResultsFolderError(str(error)) from error
    run_together(list(trainers.values()), chunk=checkpoint_every)
    return {name: trainer.rows() for name, trainer in trainers.items()}


def breakdown(
    clips: dict[str, Clips],
    batches: Sequence[int],
    out_dir: str | pathlib.Path,
    *,
    hidden: int = 20,
    seed: int = 0,
    repeats: int = 20,
    method: str = method_names.BPPSA,
    overwrite: bool = False,
    progress: bool | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Fig. 9's measurements for every variant of ``clips`` and every batch size."""
    points = [{"variant": v, "batch": b} for v in clips for b in batches]
    config = dict(
        hidden=hidden,
        seed=seed,
        repeats=repeats,
        method=method,
        data={v: c.identity() for v, c in clips.items()},
    )
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=len(points) * repeats, desc="breakdown", unit="round", disable=not show)

    def measure_point(point):
        data = clips[point["variant"]]
        model = model_for(data, hidden)
        params = model.init(key=jax.random.key(seed))
        # A few different batches, so that no single batch's content decides the times.
        batch_list = [data.batch(i, point["batch"]) for i in range(min(repeats, 4))]
        bar.set_description(f"breakdown {point['variant']} B={point['batch']}")
        backward = methods.parse_method(method)
        if isinstance(backward, bppsa.Auto):
            # Fig. 9 breaks BPPSA's time down: time the method Auto runs BPPSA with, even where
            # it would run plain back-propagation instead on this backend (large batches).
            backward = backward.choose(
                data.frames,
                hidden,
                batch=point["batch"],
                element=GRU_ELEMENT * hidden,
                jacobians=True,
            )
        row = _irmas_breakdown.measure(model, params, batch_list, backward, repeats, bar.update)
        resolved = f"{describe(method, data, hidden, point['batch'])} (timed: {backward!r})"
        return dict(frames=data.frames, features=data.num_features, resolved=resolved) | row

    with bar:
        return _irmas_breakdown.run_breakdown(
            points, measure_point, out_dir, config, overwrite=overwrite, on_point=on_point
        )


def _evaluator(model: SequenceClassifier, clips: Clips, chunk: int = 256):
    logits = jax.jit(jax.vmap(model.logits, in_axes=(None, 0)))
    xs, labels = clips.features.xs, clips.features.labels

    def evaluate(params) -> dict[str, float]:
        loss = correct = 0.0
        for start in range(0, len(labels), chunk):
            out = logits(params, xs[start : start + chunk])
            target = labels[start : start + chunk]
            loss += float(optax.softmax_cross_entropy_with_integer_labels(out, target).sum())
            correct += float((np.asarray(out).argmax(-1) == target).sum())
        return {"train_loss": loss / len(labels), "train_accuracy": correct / len(labels)}

    return evaluate
