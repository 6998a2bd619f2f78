"""Paper experiment 1: the vanilla RNN classifier on synthetic bitstreams, trained with optax by
back-propagation (BP) and by BPPSA (Wang, Bai & Pekhimenko, MLSys 2020, Figs. 7 and 8).

The model: input 1, tanh RNN with hidden size 20, a linear head on the last state, 10 classes,
cross-entropy, Adam with learning rate 1e-5 (all configurable). The data: the paper's bitstreams
(:class:`bppsa.data.Bitstreams`), generated on the fly from the seed.

Commands:
    train   trains with every ``--method`` in lockstep on the same batches (Fig. 7: T = 1000,
            B = 16) and prints the per-iteration loss agreement and the per-phase times;
    sweep   the speed sweeps of Fig. 8: ``t`` (T sweep at B = 16), ``b`` (B sweep at T = 1000)
            or ``both``; each point trains briefly with every method and records the median
            per-iteration times and the speedups.

Presets: ``--smoke`` (seconds), ``--quick`` (the default; minutes on a 2-core CPU) and
``--paper`` (the paper's T, B and epochs; for a GPU). Any option overrides the preset's value.
``--forward newton`` runs the forward pass of the BPPSA methods by Newton iterations
(``bppsa.Newton()``), ``--forward fused`` in one kernel (``bppsa.Fused()``); BP keeps
``lax.scan`` (the reference), and each run's log records the forward it ran.

Results go to ``<out>/<name>/`` (default ``results/rnn_synthetic/<command>-<preset>/``, followed
by the sizes that differ from the preset's, e.g. ``train-quick-T300-B4``): each
run's ``metrics.jsonl`` and ``checkpoint.npz`` (``train``: one folder per method; ``sweep``:
``runs/T<T>-B<B>/<method>/``) and, for sweeps, ``sweep.jsonl``. Rerunning the same command
resumes where it stopped. Draw the figures with ``python -m paper_figures.fig7`` and
``python -m paper_figures.fig8``.

Examples:
    python -m experiments.rnn_synthetic train --method bp bppsa
    python -m experiments.rnn_synthetic sweep both
    python -m experiments.rnn_synthetic sweep t --paper
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax

import bppsa
from bppsa.data import Bitstreams
from bppsa.models import SequenceClassifier
from experiments import _cli, _report
from experiments._records import ResultsFolderError
from experiments._sweep import compare, run_sweep
from experiments._training import Task, Trainer, lockstep_trainers, run_together
from experiments.methods import SEQUENTIAL_FORWARD, describe, parse_method
from paper_figures.result_files import methods as method_names

NUM_CLASSES = 10
DEFAULT_OUT = pathlib.Path("results/rnn_synthetic")
COMMANDS = ("train", "sweep")


@dataclasses.dataclass(frozen=True)
class Config:
    """One training run's settings (a run of each method uses the same).

    Attributes:
        length, batch, hidden: sequence length T, batch size B and hidden size H.
        lr: Adam's learning rate.
        forward: the forward pass of the BPPSA methods, a name of
            :data:`experiments.methods.FORWARDS`; BP runs ``lax.scan`` in any case.
        num_samples, train_fraction, seed: the data (see :class:`bppsa.data.Bitstreams`); the
            seed also initializes the parameters.
        iterations, epochs: run length; ``iterations`` wins when both are set.
        forward_every: time the forward and the backward, each its own program, every this
            many iterations.
        eval_samples: test samples evaluated at the end of every epoch and of the run
            (0: no evaluation).
    """

    length: int = 1000
    batch: int = 16
    hidden: int = 20
    lr: float = 1e-5
    forward: str = SEQUENTIAL_FORWARD
    num_samples: int = 50_000
    train_fraction: float = 0.64
    seed: int = 0
    iterations: int | None = None
    epochs: float | None = 1.0
    forward_every: int = 1
    eval_samples: int = 0

    def data(self) -> Bitstreams:
        return Bitstreams(
            self.length, self.num_samples, self.train_fraction, NUM_CLASSES, self.seed
        )

    def num_iterations(self) -> int:
        if self.iterations is not None:
            return self.iterations
        per_epoch = self.data().batches_per_epoch("train", self.batch)
        return max(1, round(self.epochs * per_epoch))


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named configuration of both commands."""

    name: str
    train: Config
    lengths: tuple[int, ...]  # T sweep, at sweep_batch
    batches: tuple[int, ...]  # B sweep, at sweep_length
    sweep: Config  # run length of each sweep point
    sweep_batch: int = 16
    sweep_length: int = 1000


PRESETS = {
    # Seconds: the structure of both commands at tiny sizes.
    "smoke": Preset(
        "smoke",
        train=Config(length=20, batch=4, num_samples=200, iterations=10, epochs=None),
        lengths=(10, 30),
        batches=(2, 4),
        sweep=Config(num_samples=200, iterations=4, epochs=None),
        sweep_batch=4,
        sweep_length=30,
    ),
    "quick": Preset(
        "quick",
        train=Config(iterations=300, epochs=None, eval_samples=512),
        lengths=(100, 300, 1000, 3000),
        batches=(2, 8, 32, 128),
        sweep=Config(iterations=40, epochs=None),
    ),
    # The paper's sizes. Fig. 7's run length is the artifact's default of 50 epochs (its grid
    # script takes the epochs as an argument that is not recorded); the sweep times are
    # per-iteration averages over an epoch in the paper, so each point runs one epoch. The
    # forward and the backward alone are timed on every 10th iteration (hundreds of samples per
    # point) to keep the extra calls from doubling the work of these long runs.
    "paper": Preset(
        "paper",
        train=Config(epochs=50.0, eval_samples=18_000, forward_every=10),
        lengths=(10, 30, 100, 300, 1000, 3000, 10_000, 30_000),
        batches=(2, 4, 8, 16, 32, 64, 128, 256),
        sweep=Config(epochs=1.0, forward_every=10),
    ),
}


def make_model(config: Config) -> SequenceClassifier:
    """The paper's classifier at ``config``'s hidden size."""
    return SequenceClassifier(1, config.hidden, NUM_CLASSES)


def initial_params(config: Config) -> dict:
    """The classifier's parameters at initialization (PyTorch's), from ``config.seed``."""
    # stream 0 of the seed; the data draw from their own streams of it (Bitstreams)
    key = jax.random.fold_in(jax.random.key(config.seed), 0)
    return make_model(config).init(key=key)


def make_task(
    config: Config,
    *,
    inputs: Callable[[jax.Array], jax.Array] | None = None,
    params: dict | None = None,
) -> Task:
    """The classifier, its initial parameters and the batches of ``config``.

    Args:
        config: sizes, data and evaluation.
        inputs: what the model reads of a batch of bits ``(B, T, 1)`` (in training and
            evaluation); default: the bits as they are, 0 and 1.
        params: the initial parameters; default: :func:`initial_params`.
    """
    data = config.data()
    model = make_model(config)
    params = initial_params(config) if params is None else params
    encode = (lambda xs: xs) if inputs is None else inputs
    evaluate = None
    if config.eval_samples:
        evaluate = _evaluator(model, data, config.eval_samples, encode)
    return Task(
        loss=model.loss,
        params=params,
        batches=lambda start: (
            (encode(xs), labels) for xs, labels in data.batches("train", config.batch, start=start)
        ),
        iterations_per_epoch=data.batches_per_epoch("train", config.batch),
        evaluate=evaluate,
    )


def make_trainers(
    config: Config,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    checkpoint_every: int = 100,
    overwrite: bool = False,
    progress: bool | None = None,
    task: Task | None = None,
    optimizer: optax.GradientTransformation | None = None,
    recorded: dict[str, Any] | None = None,
) -> dict[str, Trainer]:
    """A trainer per method, logging to ``out_dir/<method>/``, on the same data and init.

    ``task`` (default :func:`make_task` of ``config``) and ``optimizer`` (default Adam at
    ``config.lr``) replace the paper's; ``recorded`` (JSON-able) joins ``config`` in each run's
    recorded configuration, to say how they differ.
    """
    task = make_task(config) if task is None else task
    optimizer = optax.adam(config.lr) if optimizer is None else optimizer
    identity = dataclasses.asdict(config) | (recorded or {})
    for key in ("iterations", "epochs"):  # a run may be extended
        identity.pop(key)
    eval_every = task.iterations_per_epoch if config.eval_samples else None
    return lockstep_trainers(
        task,
        optimizer,
        methods,
        out_dir,
        identity,
        resolved=lambda name: describe(
            name, config.length, config.hidden, batch=config.batch, element=config.hidden
        ),
        forward=config.forward,
        label=f"T={config.length} B={config.batch}",
        num_iterations=config.num_iterations(),
        checkpoint_every=checkpoint_every,
        forward_every=config.forward_every,
        eval_every=eval_every,
        overwrite=overwrite,
        progress=progress,
    )


def train(
    config: Config,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    checkpoint_every: int = 100,
    overwrite: bool = False,
    progress: bool | None = None,
    task: Task | None = None,
    optimizer: optax.GradientTransformation | None = None,
    recorded: dict[str, Any] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Trains every method in lockstep; returns each run's log rows. ``task``, ``optimizer``
    and ``recorded``: as :func:`make_trainers` takes them (default: the paper's)."""
    trainers = make_trainers(
        config,
        methods,
        out_dir,
        checkpoint_every=checkpoint_every,
        overwrite=overwrite,
        progress=progress,
        task=task,
        optimizer=optimizer,
        recorded=recorded,
    )
    run_together(list(trainers.values()), chunk=checkpoint_every)
    return {name: trainer.rows() for name, trainer in trainers.items()}


def sweep_points(
    which: str, lengths: Sequence[int], batches: Sequence[int], batch: int, length: int
) -> list[dict[str, Any]]:
    """Points of the T sweep (``lengths`` at ``batch``) and/or the B sweep (``batches`` at
    ``length``); ``which`` is ``"t"``, ``"b"`` or ``"both"``."""
    points = []
    if which in ("t", "both"):
        points += [{"sweep": "T", "length": t, "batch": batch} for t in lengths]
    if which in ("b", "both"):
        points += [{"sweep": "B", "length": length, "batch": b} for b in batches]
    return points


def sweep(
    points: Sequence[dict[str, Any]],
    config: Config,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    chunk: int | None = None,
    on_point=None,
) -> list[dict[str, Any]]:
    """Runs the sweep ``points`` (each a short training of ``config`` with its T and B) and
    returns their rows of ``out_dir/sweep.jsonl``. The methods of a point alternate every
    ``chunk`` iterations (default: a tenth of a run, from 10 to 100)."""
    out_dir = pathlib.Path(out_dir)
    if chunk is None:
        chunk = max(10, min(100, config.num_iterations() // 10))
    if overwrite:
        (out_dir / "sweep.jsonl").unlink(missing_ok=True)

    def trainers(point):
        at = dataclasses.replace(config, length=point["length"], batch=point["batch"])
        folder = out_dir / "runs" / f"T{point['length']}-B{point['batch']}"
        return make_trainers(
            at,
            methods,
            folder,
            checkpoint_every=max(chunk, 1000),
            overwrite=overwrite,
            progress=progress,
        )

    # Auto()'s choice depends on T and B, so it differs between points (each run records its own).
    resolved = {
        name: "Auto() -> its choice per point"
        if isinstance(parse_method(name), bppsa.Auto)
        else describe(name, config.length, config.hidden)
        for name in methods
    }
    identity = dataclasses.asdict(config) | dict(methods=list(methods), resolved=resolved)
    for key in ("length", "batch"):
        identity.pop(key)
    baseline = method_names.BASELINE if method_names.BASELINE in methods else methods[0]
    return run_sweep(
        points, trainers, out_dir, identity, baseline=baseline, chunk=chunk, on_point=on_point
    )


def _evaluator(model: SequenceClassifier, data: Bitstreams, samples: int, encode, batch: int = 500):
    logits = jax.jit(jax.vmap(model.logits, in_axes=(None, 0)))
    count = min(samples, data.size("test"))
    offset = data.size("train")

    def evaluate(params) -> dict[str, float]:
        loss = correct = 0.0
        for start in range(0, count, batch):
            xs, labels = data.samples(np.arange(start, min(start + batch, count)) + offset)
            out = logits(params, encode(xs))
            loss += float(optax.softmax_cross_entropy_with_integer_labels(out, labels).sum())
            correct += float((out.argmax(-1) == labels).sum())
        return {"test_loss": loss / count, "test_accuracy": correct / count}

    return evaluate


# ----------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = _cli.parser("experiments.rnn_synthetic", __doc__)
    commands = _cli.add_commands(parser, COMMANDS)
    common = argparse.ArgumentParser(add_help=False)
    _cli.add_presets(
        common,
        {
            "smoke": "seconds: tiny sizes, a few iterations",
            "quick": "minutes on a 2-core CPU",
            "paper": "the paper's sizes (for a GPU)",
        },
    )
    _cli.add_training(common, lr="1e-5")
    common.add_argument("--hidden", type=_cli.positive_int, help="hidden size H (default: 20)")
    common.add_argument(
        "--samples", type=_cli.positive_int, help="dataset size (default: the preset's, 50000)"
    )
    common.add_argument("--train-fraction", type=_cli.fraction, help="train split (default: 0.64)")
    common.add_argument(
        "--seed", type=_cli.non_negative_int, help="data and init seed (default: 0)"
    )
    common.add_argument(
        "--forward-every",
        type=_cli.positive_int,
        help="time the forward and the backward, each its own program, every N iterations "
        "(default: 1; 10 with --paper)",
    )
    _cli.add_results(common, DEFAULT_OUT)

    train_parser = commands.add_parser(
        "train", parents=[common], help="train with each method (Fig. 7)"
    )
    train_parser.add_argument(
        "--length", type=_cli.positive_int, help="sequence length T (default: the preset's, 1000)"
    )
    train_parser.add_argument(
        "--batch", type=_cli.positive_int, help="batch size B (default: the preset's, 16)"
    )
    train_parser.add_argument(
        "--eval-samples",
        type=_cli.non_negative_int,
        help="test samples per evaluation, 0: none (default: the preset's)",
    )
    _cli.add_checkpoint_every(train_parser)

    sweep_parser = commands.add_parser(
        "sweep", parents=[common], help="speed sweeps over T and B (Fig. 8)"
    )
    sweep_parser.add_argument(
        "which", nargs="?", choices=("t", "b", "both"), default="both", help="the sweeps to run"
    )
    sweep_parser.add_argument(
        "--lengths", type=_cli.positive_int, nargs="+", help="T sweep (default: the preset's)"
    )
    sweep_parser.add_argument(
        "--batches", type=_cli.positive_int, nargs="+", help="B sweep (default: the preset's)"
    )
    sweep_parser.add_argument(
        "--sweep-batch", type=_cli.positive_int, help="B of the T sweep (default: 16)"
    )
    sweep_parser.add_argument(
        "--sweep-length", type=_cli.positive_int, help="T of the B sweep (default: 1000)"
    )
    return parser


def _config(args: argparse.Namespace, base: Config) -> Config:
    return _cli.training_config(
        base,
        args,
        hidden=args.hidden,
        num_samples=args.samples,
        train_fraction=args.train_fraction,
        seed=args.seed,
        forward_every=args.forward_every,
        length=getattr(args, "length", None),
        batch=getattr(args, "batch", None),
        eval_samples=getattr(args, "eval_samples", None),
    )


def _sizes(config: Config, preset: Config) -> dict[str, tuple[int, int]]:
    """The sizes of a run folder's name (:func:`experiments._cli.run_name`): T, B and H."""
    return {
        "T": (config.length, preset.length),
        "B": (config.batch, preset.batch),
        "H": (config.hidden, preset.hidden),
    }


def _check(parser: argparse.ArgumentParser, config: Config, batches: Sequence[int]) -> None:
    """Fails with the argument's name before any heavy work."""
    try:
        data = config.data()
    except ValueError as error:
        parser.error(f"argument --samples/--train-fraction/--seed: {error}")
    for batch in batches:
        if batch > data.size("train"):
            parser.error(
                f"argument --batch/--batches: batch size {batch} exceeds the training split "
                f"({data.size('train')} samples)"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except ResultsFolderError as error:  # found only once the run folder is opened
        _cli.fail(parser, args, error)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    preset = PRESETS[_cli.configuration(args)]
    progress = _cli.progress(args)
    methods = _cli.methods(args)
    base = f"{args.command}-{preset.name}"

    if args.command == "train":
        config = _config(args, preset.train)
        folder = _cli.run_folder(args, _cli.run_name(base, _sizes(config, preset.train)))
        _check(parser, config, [config.batch])
        print(f"training {', '.join(methods)}: {config} -> {folder}", flush=True)
        runs = train(
            config,
            methods,
            folder,
            checkpoint_every=args.checkpoint_every,
            overwrite=args.overwrite,
            progress=progress,
        )
        print(_report.loss_table(runs))
        print(_report.timing_table(compare(runs, skip=1)))
        return 0

    config = _config(args, preset.sweep)
    config = dataclasses.replace(
        config,
        length=args.sweep_length or preset.sweep_length,
        batch=args.sweep_batch or preset.sweep_batch,
    )
    # T and B are the points', which join one log: only H names the folder
    folder = _cli.run_folder(args, _cli.run_name(base, {"H": (config.hidden, preset.sweep.hidden)}))
    points = sweep_points(
        args.which,
        args.lengths or preset.lengths,
        args.batches or preset.batches,
        batch=config.batch,
        length=config.length,
    )
    _check(parser, config, [p["batch"] for p in points])
    print(f"sweep {args.which} ({len(points)} points): {config} -> {folder}", flush=True)
    rows = sweep(
        points,
        config,
        methods,
        folder,
        overwrite=args.overwrite,
        progress=progress,
        on_point=lambda row: print(_report.sweep_table([row]).split("\n", 1)[1], flush=True),
    )
    print(_report.sweep_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
