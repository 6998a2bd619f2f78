"""The settings of the character-level language model experiment
(``python -m experiments.char_lm``): the run's :class:`Config`, the named configurations
(:data:`PRESETS`), and the names of the runs of a method (:func:`parse_run`).

Run names: those of ``paper_figures.result_files.methods`` (``bp``: back-propagation, ``jax.grad``
through ``lax.scan``; ``bppsa``: ``bppsa.Auto()``; ``blelloch``, ...) and ``<name>-newton`` for a
BPPSA method whose forward pass runs ``bppsa.Newton()`` (``bppsa-newton``: ``Auto()`` backward,
Newton forward); ``bp`` always runs ``lax.scan``, the reference the losses are compared with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

import bppsa
from bppsa.models import CIFGLSTM, GRU, LSTM, DiagonalGRU, IndRNN, LanguageModel
from experiments.methods import NEWTON_FORWARD, SEQUENTIAL_FORWARD, is_baseline, parse_method
from paper_figures.result_files import methods as method_names

CELLS = {
    "diagonal-gru": DiagonalGRU,
    "cifg-lstm": CIFGLSTM,
    "indrnn": IndRNN,
    "gru": GRU,
    "lstm": LSTM,
}
NEWTON_SUFFIX = "-newton"


@dataclasses.dataclass(frozen=True)
class Config:
    """One run's settings, the same for every method.

    Attributes:
        cell: a name of :data:`CELLS`, the cell of every block.
        width, layers, expansion: ``H``, ``L`` and the MLP's expansion of the model.
        length, batch: ``T`` characters per window and ``B`` windows per batch.
        lr: AdamW's peak learning rate, reached after ``warmup`` iterations (linear from 0),
            then a cosine decay to ``final_lr * lr`` at ``schedule_iterations`` (default:
            ``iterations``) and constant after it.
        weight_decay, clip: AdamW's decoupled weight decay, and the global norm the gradients
            are clipped to.
        iterations: the run's length (a run may be extended; the schedule then stays).
        eval_every: iterations between evaluations (and one at the end).
        eval_batches: validation windows evaluated, in batches of ``batch``: a fixed set.
        prompt_length, sample_length, final_sample_length, temperature: the samples: after
            the first ``prompt_length`` characters of the first validation window,
            ``sample_length`` characters at each evaluation and ``final_sample_length`` at the
            end, at ``temperature``.
        forward_every: time the forward and the backward, each its own program, every this
            many iterations.
        seed: the initialization, the batch order, the validation windows and the samples.
    """

    cell: str = "diagonal-gru"
    width: int = 128
    layers: int = 2
    expansion: int = 4
    length: int = 128
    batch: int = 16
    lr: float = 6e-3
    warmup: int = 25
    schedule_iterations: int | None = None
    final_lr: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    iterations: int = 500
    eval_every: int = 50
    eval_batches: int = 4
    prompt_length: int = 32
    sample_length: int = 80
    final_sample_length: int = 400
    temperature: float = 0.8
    forward_every: int = 25
    seed: int = 0

    def __post_init__(self):
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, got {self.cell!r}.")
        if self.warmup >= self.horizon:
            raise ValueError(
                f"warmup ({self.warmup}) must be shorter than the schedule "
                f"({self.horizon} iterations)."
            )

    @property
    def horizon(self) -> int:
        """The iteration where the cosine decay ends."""
        return self.schedule_iterations or self.iterations

    def model(self, vocab_size: int) -> LanguageModel:
        return LanguageModel(
            vocab_size, self.width, self.layers, CELLS[self.cell](), expansion=self.expansion
        )

    def optimizer(self) -> optax.GradientTransformation:
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, self.lr, self.warmup, self.horizon, end_value=self.final_lr * self.lr
        )
        return optax.chain(
            optax.clip_by_global_norm(self.clip),
            optax.adamw(schedule, weight_decay=self.weight_decay),
        )

    def record(self) -> dict[str, Any]:
        """The settings as result files record them (the schedule's end resolved)."""
        return dataclasses.asdict(self) | {"schedule_iterations": self.horizon}

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share: everything but the run's length."""
        identity = self.record()
        identity.pop("iterations")
        return identity


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named configuration: the settings, the methods and the checkpoint interval."""

    name: str
    config: Config
    methods: tuple[str, ...]
    checkpoint_every: int


PRESETS = {
    # Minutes on 2 CPU cores: the validation bits per character fall from 6.5 (log2 of the 88
    # characters) to about 2.6 in 500 iterations (1M characters seen).
    "quick": Preset("quick", Config(), (method_names.BP, method_names.BPPSA), 10),
    # For one accelerator: ParaRNN's regime of long sequences and wide diagonal cells.
    "gpu": Preset(
        "gpu",
        Config(
            width=2048,
            layers=4,
            length=2048,
            batch=32,
            lr=1e-3,
            warmup=100,
            iterations=1000,
            eval_every=100,
            eval_batches=4,
            prompt_length=64,
            sample_length=200,
            final_sample_length=1000,
            forward_every=50,
        ),
        (method_names.BP, method_names.BPPSA, method_names.BPPSA + NEWTON_SUFFIX),
        250,
    ),
    # The tests' and the smoke run's: seconds.
    "smoke": Preset(
        "smoke",
        Config(
            width=8,
            layers=1,
            length=16,
            batch=4,
            lr=1e-2,
            warmup=2,
            iterations=6,
            eval_every=3,
            eval_batches=1,
            prompt_length=8,
            sample_length=16,
            final_sample_length=48,
            forward_every=1,
        ),
        (method_names.BP, method_names.BPPSA),
        3,
    ),
}


def dry_run(config: Config) -> Config:
    """``config``'s structure (cell, layers, optimizer) at tiny sizes, for a few iterations."""
    return dataclasses.replace(
        config,
        width=16,
        length=32,
        batch=4,
        warmup=1,
        iterations=4,
        schedule_iterations=None,
        eval_every=2,
        eval_batches=1,
        prompt_length=8,
        sample_length=16,
        final_sample_length=32,
        forward_every=1,
    )


# ----------------------------------------------------------------------------- methods


def parse_run(name: str) -> tuple[bppsa.Method, str]:
    """The backward method and the forward name (``experiments.methods.FORWARDS``) of a run's
    name: a name of ``paper_figures.result_files.methods`` (``bp`` runs ``lax.scan``), or
    ``<name>-newton``.

    Raises:
        ValueError: for an unknown name, or ``bp-newton`` (the reference keeps ``lax.scan``).
    """
    base = name.removesuffix(NEWTON_SUFFIX)
    method = parse_method(base)
    if base == name:
        return method, SEQUENTIAL_FORWARD
    if is_baseline(base):
        raise ValueError(
            f"method {name!r}: {base} is the reference and runs lax.scan's forward; "
            f"{NEWTON_SUFFIX} goes with a BPPSA method (e.g. bppsa{NEWTON_SUFFIX})."
        )
    return method, NEWTON_FORWARD
