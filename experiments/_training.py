"""A training loop generic over a model's loss, an optax optimizer and a batch stream, with the
paper's per-phase timing, a crash-safe results log and exact resume.

Used by every experiment that trains (the RNN on synthetic bitstreams, the GRU on IRMAS): it
knows nothing about the model or the data, only ``loss(params, *batch)``, initial parameters,
and the batches of iterations ``start, start + 1, ...``.

Timing of one iteration, each quantity its own compiled program (:mod:`experiments.timing`: the loss
with the trainer's method and forward bound inside it, :func:`experiments.methods.bind`; compiled
and called once before the first timed call; each call waited for with ``jax.block_until_ready``):

* ``grad_s``: the training step's gradient, ``jax.value_and_grad`` of the loss (what
  ``bppsa.value_and_grad(loss, method=..., forward=...)`` runs): forward + backward;
* ``update_s``: the optimizer's update and ``optax.apply_updates``;
* ``step_s = grad_s + update_s``: the training iteration;
* ``forward_s``: the forward as it runs inside that gradient, the forward of ``jax.vjp`` (the loss
  and the residuals its backward needs), and ``backward_s``: the backward as its own program, the
  pullback applied to this iteration's residuals. Both are EXTRA calls made every
  ``forward_every`` iterations (``None`` in the other rows), not part of training, timed by the
  harness's protocol (:func:`experiments.timing.interleaved`: each right after an untimed call of
  itself).

``backward_s`` is never ``grad_s - forward_s``: a standalone forward is another program (on an
H200 the standalone ``lax.scan`` forward ran at half the speed of the same forward inside a
gradient), and so is each method's forward (with ``forward="newton"`` the BPPSA runs' holds
the Newton forward).

``wall_clock_s`` accumulates ``step_s``: training time without data generation, the extra
forward and backward calls, evaluation, logging and checkpoints (the x axis of the paper's
Fig. 7). ``elapsed_s`` is real time since the run began (over all sessions), everything
included.

Results: ``out_dir/metrics.jsonl`` holds a ``session`` row at every (re)start (run metadata, the
configuration, compile times), a ``step`` row per iteration and ``eval`` rows;
``out_dir/checkpoint.npz`` holds parameters and optimizer state. Rows are buffered and appended
right before each checkpoint; a resumed run drops rows past its checkpoint and regenerates them
(the batch of iteration ``i`` must be a function of ``i``), so an interruption at any point
leaves no duplicated and no missing rows.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import optax
from tqdm.auto import tqdm

import bppsa
from experiments._records import (
    config_mismatch,
    load_checkpoint,
    run_metadata,
    same_config,
    save_checkpoint,
)
from experiments.methods import SEQUENTIAL_FORWARD, bind, forward_of, parse_forward, parse_method
from experiments.timing import GradientPrograms, interleaved, timed
from paper_figures.result_files import PULLBACK, JsonLines

Batch = tuple[Any, ...]
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.npz"
_DIGITS = 7  # times are logged in seconds, rounded to 0.1 microsecond


@dataclasses.dataclass(frozen=True)
class Task:
    """What to train.

    Attributes:
        loss: ``loss(params, *batch) -> scalar``; its ``bppsa.scan`` calls back-propagate with
            the trainer's method.
        params: initial parameters (a pytree of arrays).
        batches: ``batches(start)`` yields the batches of iterations ``start, start + 1, ...``;
            the batch of an iteration must depend on the iteration only (exact resume).
        iterations_per_epoch: iterations in one pass over the training data.
        evaluate: optional ``evaluate(params) -> {name: float or str}`` (e.g. test loss and
            accuracy; a str, e.g. generated text, is logged as it is).
    """

    loss: Callable[..., Any]
    params: Any
    batches: Callable[[int], Iterable[Batch]]
    iterations_per_epoch: int
    evaluate: Callable[[Any], dict[str, float | str]] | None = None


@dataclasses.dataclass(frozen=True)
class _State:
    """Everything that changes per iteration, replaced as ONE object so that an interruption
    never separates parameters from the rows that describe them."""

    params: Any
    opt_state: Any
    iteration: int
    wall_clock_s: float
    elapsed_s: float
    pending: tuple[dict[str, Any], ...]


class Trainer:
    """One training run of ``task`` with one backward method, logged under ``out_dir``.

    Args:
        task: the loss, parameters and batches.
        optimizer: an optax gradient transformation.
        method: backward method for ``bppsa.value_and_grad`` (object or name; ``"sequential"``
            is plain back-propagation).
        forward: forward pass for ``bppsa.value_and_grad`` (``None`` or ``"sequential"``:
            ``lax.scan``; ``"newton"`` or a ``bppsa.Newton(...)``).
        out_dir: folder of this run's ``metrics.jsonl`` and ``checkpoint.npz``.
        config: JSON-able description of the run; resuming requires the same one.
        num_iterations: iterations of the whole run (may grow between sessions).
        checkpoint_every: iterations between checkpoints (and appends to the log).
        forward_every: time the forward and the backward of the gradient, each its own
            program, every this many iterations.
        eval_every: evaluate every this many iterations and at the end (``None``: at the end).
        overwrite: start afresh, deleting this run's log and checkpoint.
        progress: show a progress bar (default: when stderr is a terminal).
        name: label of the progress bar.
        position: line of the progress bar when several run together.

    Example:
        >>> trainer = Trainer(task, optax.adam(1e-5), method="sequential", out_dir="results/x",
        ...                   config={"lr": 1e-5}, num_iterations=100)
        >>> trainer.run()
        >>> losses = [row["loss"] for row in step_rows(trainer.rows())]
    """

    def __init__(
        self,
        task: Task,
        optimizer: optax.GradientTransformation,
        *,
        method: bppsa.Method | str,
        forward: bppsa.Newton | str | None = None,
        out_dir: str | pathlib.Path,
        config: dict[str, Any],
        num_iterations: int,
        checkpoint_every: int = 100,
        forward_every: int = 1,
        eval_every: int | None = None,
        overwrite: bool = False,
        progress: bool | None = None,
        name: str | None = None,
        position: int = 0,
    ):
        for arg, value in (
            ("num_iterations", num_iterations),
            ("checkpoint_every", checkpoint_every),
            ("forward_every", forward_every),
            ("eval_every", 1 if eval_every is None else eval_every),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}.")
        self.task = task
        self.optimizer = optimizer
        self.method = method
        self.forward = forward
        self.out_dir = pathlib.Path(out_dir)
        self.config = json.loads(json.dumps(config))  # as it reads back from the log
        self.num_iterations = num_iterations
        self.checkpoint_every = checkpoint_every
        self.forward_every = forward_every
        self.eval_every = eval_every
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.name = name or self.out_dir.name
        self.position = position
        self.log = JsonLines(self.out_dir / METRICS)
        self._checkpoint = self.out_dir / CHECKPOINT
        if overwrite:
            for path in (self.log.path, self._checkpoint):
                path.unlink(missing_ok=True)
        self._state: _State | None = None
        self._saved = -1  # iteration of the last checkpoint
        self._programs: GradientPrograms | None = None
        self._update: Any = None
        self._batches: Iterator[Batch] | None = None
        self._bar = None
        self._session_start = 0.0

    @property
    def iteration(self) -> int:
        """Iterations done so far (after :meth:`start`)."""
        return 0 if self._state is None else self._state.iteration

    @property
    def done(self) -> bool:
        return self._state is not None and self._state.iteration >= self.num_iterations

    def start(self) -> int:
        """Resumes from the checkpoint (or starts), compiles, and returns the first iteration.

        Raises:
            ValueError: when ``out_dir`` holds a run with another configuration.
        """
        if self._state is not None:
            return self._state.iteration
        sessions = [row for row in self.log.read() if row.get("kind") == "session"]
        if sessions and not same_config(sessions[0]["config"], self.config):
            raise config_mismatch(self.out_dir, "run", sessions[0]["config"], self.config)
        opt_state = self.optimizer.init(self.task.params)
        loaded = load_checkpoint(self._checkpoint, like=(self.task.params, opt_state))
        if loaded is not None and not sessions:
            raise ValueError(
                f"{self._checkpoint} exists without a {METRICS} log; remove the folder or "
                "pass overwrite to start afresh."
            )
        params, iteration, wall, elapsed = self.task.params, 0, 0.0, 0.0
        if loaded is not None:
            (params, opt_state), extra = loaded
            iteration, wall, elapsed = extra["iteration"], extra["wall_clock_s"], extra["elapsed_s"]
        if sessions:  # rows past the checkpoint are regenerated below
            self.log.keep(lambda row: _before(row, iteration))
        self._state = _State(params, opt_state, iteration, wall, elapsed, ())
        self._saved = iteration
        self._session_start = time.perf_counter() - elapsed
        if not self.done:
            compile_s = self._compile()
            self.log.append(
                dict(kind="session", iteration=iteration, compile_s=compile_s, backward=PULLBACK)
                | run_metadata(self.config)
            )
        return iteration

    def rows(self) -> list[dict[str, Any]]:
        """All rows of this run's log (``session``, ``step`` and ``eval`` rows)."""
        return self.log.read()

    def run(
        self, until: int | None = None, callback: Callable[[Trainer, dict], None] | None = None
    ) -> None:
        """Trains up to iteration ``until`` (default: the end), then logs and checkpoints.

        ``callback(trainer, row)`` runs after every iteration. On any exception (Ctrl-C
        included) the finished iterations are logged and checkpointed before it propagates.
        """
        self.start()
        until = self.num_iterations if until is None else min(until, self.num_iterations)
        if self.progress and self._bar is None and not self.done:
            self._bar = tqdm(
                total=self.num_iterations,
                initial=self.iteration,
                desc=self.name,
                position=self.position,
                dynamic_ncols=True,
                leave=True,
            )
        try:
            while self.iteration < until:
                row = self._step()
                if callback is not None:
                    callback(self, row)
        except BaseException:
            self._save()
            self.close()
            raise
        self._save()
        if self.done:
            self.close()

    def close(self) -> None:
        """Closes the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _compile(self) -> dict[str, float]:
        state = self._state
        self._batches = iter(self.task.batches(state.iteration))
        first = jax.block_until_ready(next(self._batches))
        self._batches = _prepend(first, self._batches)
        loss = bind(self.task.loss, method=self.method, forward=self.forward)
        programs = GradientPrograms.from_loss(loss, state.params, *first)

        def update(grads, opt_state, params):
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        compile_s = {
            "grad": round(programs.compile_seconds["total"], 3),
            "forward": round(programs.compile_seconds["forward"], 3),
            "backward": round(programs.compile_seconds["backward"], 3),
        }
        # One untimed call of each (first calls allocate and fill caches); results discarded.
        _, grads = jax.block_until_ready(programs.total(state.params, *first))
        jax.block_until_ready(programs.backward(programs.pullback, programs.cotangent))
        start = time.perf_counter()
        update_fn = jax.jit(update).lower(grads, state.opt_state, state.params).compile()
        compile_s["update"] = round(time.perf_counter() - start, 3)
        jax.block_until_ready(update_fn(grads, state.opt_state, state.params))
        self._programs, self._update = programs, update_fn
        return compile_s

    def _forward_backward(self, params, batch) -> tuple[float, float]:
        """Seconds of the gradient's forward and of its backward on ``batch``, each its own
        program, each right after an untimed call of itself."""
        programs = self._programs
        _, pullback = programs.forward(params, *batch)  # this iteration's residuals
        times = interleaved(
            {
                "forward": functools.partial(programs.forward, params, *batch),
                "backward": functools.partial(programs.backward, pullback, programs.cotangent),
            },
            rounds=1,
        )
        return times["forward"][0], times["backward"][0]

    def _step(self) -> dict[str, Any]:
        state = self._state
        i = state.iteration
        batch = jax.block_until_ready(next(self._batches))
        forward_s = backward_s = None
        if i % self.forward_every == 0:
            forward_s, backward_s = self._forward_backward(state.params, batch)
        (loss, grads), grad_s = timed(self._programs.total, state.params, *batch)
        (params, opt_state), update_s = timed(self._update, grads, state.opt_state, state.params)
        step_s = grad_s + update_s
        wall = state.wall_clock_s + step_s
        row = dict(
            kind="step",
            iteration=i,
            epoch=i // self.task.iterations_per_epoch,
            loss=float(loss),
            forward_s=_round(forward_s),
            backward_s=_round(backward_s),
            grad_s=_round(grad_s),
            update_s=_round(update_s),
            step_s=_round(step_s),
            wall_clock_s=_round(wall),
            elapsed_s=_round(time.perf_counter() - self._session_start),
        )
        rows = (row,)
        done = i + 1
        if self.task.evaluate is not None and (
            done == self.num_iterations or (self.eval_every and done % self.eval_every == 0)
        ):
            metrics = {
                k: v if isinstance(v, str) else float(v)
                for k, v in self.task.evaluate(params).items()
            }
            rows += (
                dict(
                    kind="eval",
                    iterations_done=done,
                    epoch=done / self.task.iterations_per_epoch,
                    wall_clock_s=row["wall_clock_s"],
                )
                | metrics,
            )
        elapsed = time.perf_counter() - self._session_start
        self._state = _State(params, opt_state, done, wall, elapsed, state.pending + rows)
        if done % self.checkpoint_every == 0:
            self._save()
        if self._bar is not None:
            self._bar.update(1)
            if done % 10 == 0 or done == self.num_iterations:
                self._bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)
        return row

    def _save(self) -> None:
        """Appends the pending rows, then checkpoints (a crash in between is undone on resume
        because rows past the checkpoint are dropped)."""
        state = self._state
        if state is None:
            return
        if state.pending:
            self.log.extend(state.pending)
            self._state = state = dataclasses.replace(state, pending=())
        if self._saved != state.iteration:
            save_checkpoint(
                self._checkpoint,
                (state.params, state.opt_state),
                iteration=state.iteration,
                wall_clock_s=state.wall_clock_s,
                elapsed_s=state.elapsed_s,
            )
            self._saved = state.iteration


def lockstep_trainers(
    task: Task,
    optimizer: optax.GradientTransformation,
    methods: Sequence[str],
    out_dir: str | pathlib.Path,
    config: dict[str, Any],
    *,
    resolved: Callable[[str], str],
    label: str,
    forward: str = SEQUENTIAL_FORWARD,
    **options: Any,
) -> dict[str, Trainer]:
    """A trainer per method name (:mod:`experiments.methods`) on the same task and optimizer.

    The BPPSA methods run the forward pass ``forward`` (a name of
    :data:`experiments.methods.FORWARDS`), the back-propagation baseline ``lax.scan`` in any case
    (:func:`experiments.methods.forward_of`). Each logs to ``out_dir/<name>/`` with ``config``
    plus its method name, ``resolved(name)`` (what the method runs) and the forward it runs,
    shows ``"<name> <label>"`` on its progress bar, and takes ``options`` (e.g.
    ``num_iterations``) as :class:`Trainer` does.
    """
    forwards = {name: forward_of(name, forward) for name in methods}
    return {
        name: Trainer(
            task,
            optimizer,
            method=parse_method(name),
            forward=parse_forward(forwards[name]),
            out_dir=pathlib.Path(out_dir) / name,
            config=config | dict(method=name, resolved=resolved(name), forward=forwards[name]),
            name=f"{name} {label}",
            position=position,
            **options,
        )
        for position, name in enumerate(methods)
    }


def run_together(trainers: Sequence[Trainer], chunk: int = 50) -> None:
    """Runs ``trainers`` to their ends in lockstep, ``chunk`` iterations each in turn, so that
    load from elsewhere on a shared machine affects all of them alike."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}.")
    for trainer in trainers:
        trainer.start()
    try:
        while not all(trainer.done for trainer in trainers):
            for trainer in trainers:
                if not trainer.done:
                    trainer.run(until=trainer.iteration + chunk)
    finally:
        for trainer in trainers:
            trainer.close()


def step_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``step`` rows of a log, in iteration order."""
    return sorted((r for r in rows if r.get("kind") == "step"), key=lambda r: r["iteration"])


def _before(row: dict[str, Any], iteration: int) -> bool:
    if row.get("kind") == "step":
        return row["iteration"] < iteration
    if row.get("kind") == "eval":
        return row["iterations_done"] <= iteration
    return True


def _prepend(first: Batch, rest: Iterator[Batch]) -> Iterator[Batch]:
    yield first
    yield from rest


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, _DIGITS)
