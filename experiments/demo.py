"""The main job, ``make demo``: the paper's first experiment at a CPU-sized scale.

1. checks that BPPSA's gradient of the RNN classifier equals back-propagation's (the first batch
   of the training below);
2. trains the paper's RNN (hidden size 20) to tell the synthetic bitstreams' 10 bit
   probabilities apart, with BP and with BPPSA in lockstep (T = 1000, B = 16, one epoch of 2000
   iterations, the demo's recipe below), and prints the per-iteration loss agreement, the test
   accuracy before and after, what was learned, and the per-phase times;
3. runs the quick T sweep (B = 16) and B sweep (T = 1000) and prints the speedup table;
4. draws Fig. 7 and Fig. 8 from the result files.

``--quick`` (the default) trains with the demo's recipe; ``--paper`` with the paper's recipe
instead (PyTorch's initialization, bits read as 0 and 1, Adam at lr 1e-5 on every parameter)
for the quick configuration's 300 iterations, which leave the loss at ln 10.

Everything is written under ``results/demo/`` (replaced on every run; figures in
``results/demo/figures/``). About a minute on a 2-core CPU (70 s, on a shared one). Uses only
the public API.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bppsa
from experiments import _cli, _report, rnn_synthetic
from experiments._records import cpu_model
from experiments._sweep import compare
from experiments._training import Task, step_rows
from paper_figures import _style, fig7, fig8
from paper_figures.result_files import methods as method_names

DEFAULT_OUT = pathlib.Path("results/demo")

# The demo's recipe. The class is the bit probability, so a unit that averages many bits tells
# it: each hidden unit starts as a slow average of the bits read as -1 and +1 (weight_hh =
# 0.998 I, a memory of about 500 steps; small input weights; zero biases), and training moves
# the units' thresholds (input weights and biases) and the head. Adam with a cosine decay to 0
# over the run; the cell's parameters get a smaller step because their effect is multiplied by
# up to 1 / (1 - 0.998) = 500 through the recurrence, and weight_hh stays as it starts. Measured
# at T = 1000, B = 16, 2000 iterations (test accuracy; largest relative BP/BPPSA loss difference
# over the run), seed 0 unless noted:
#   this recipe: 89.4%, 1.0e-6 (seeds 1 and 2: 90.0%, 88.4%; 1.2e-6, 6.5e-6);
#   4000 iterations: 93.4%, 2.6e-6; cell lr 3e-4: 86.7%, 1.4e-5; head lr 2e-2: 93.6%, 3.8e-6;
#   weight_hh trained too (lr 1e-4): the runs part within 100 iterations (0.5), as its spectral
#     radius passes 1 and float32 rounding differences grow through Adam; 0.995 I: 83%, 8e-3;
#   bits as 0 and 1: 93.7%, but the runs part (1.7e-2); one lr 1e-2 for all: 66%, 0.34; no
#     decay (cell lr 3e-4): 7.8e-6, growing;
#   the paper's recipe with lr 1e-3 (not 1e-5): 37% after 600 iterations, the runs part (0.25).
ITERATIONS = 2000  # one epoch of the 32,000 training samples at B = 16
HEAD_LR = 1e-2  # Adam's peak learning rate for the head (recorded as the runs' lr)
CELL_LR = 1e-4  # and for the cell's input weights and biases
RECURRENCE = 0.998  # weight_hh = RECURRENCE * I, not trained
INPUT_SCALE = 0.01  # weight_ih drawn from U(-INPUT_SCALE, INPUT_SCALE)
EVAL_SAMPLES = 2000  # test samples evaluated before and after training
RECIPE = {
    "inputs": "2 * bits - 1",
    "init": (
        f"weight_hh = {RECURRENCE} I, weight_ih ~ U(-{INPUT_SCALE}, {INPUT_SCALE}), cell biases 0,"
        " head as PyTorch's nn.Linear"
    ),
    "optimizer": (
        f"Adam, cosine decay to 0 over the run from lr {HEAD_LR:g} (head) and {CELL_LR:g} (cell "
        "input weights and biases); weight_hh not trained"
    ),
}


def encode(bits: jax.Array) -> jax.Array:
    """The bits as the demo's model reads them: -1 and +1."""
    return 2.0 * bits - 1.0


def demo_params(config: rnn_synthetic.Config) -> dict:
    """The paper's initial parameters of ``config`` with the demo's cell (see ``RECIPE``)."""
    params = rnn_synthetic.initial_params(config)
    cell = dict(params["cell"])
    hidden = cell["weight_hh"].shape[0]
    # PyTorch's U(-1/sqrt(H), 1/sqrt(H)), rescaled: the same draw at the demo's scale
    cell["weight_ih"] = cell["weight_ih"] * (INPUT_SCALE * math.sqrt(hidden))
    cell["weight_hh"] = RECURRENCE * jnp.eye(hidden, dtype=cell["weight_hh"].dtype)
    cell["bias_ih"] = jnp.zeros_like(cell["bias_ih"])
    cell["bias_hh"] = jnp.zeros_like(cell["bias_hh"])
    return {"cell": cell, "head": params["head"]}


def demo_optimizer(iterations: int) -> optax.GradientTransformation:
    """Adam with a cosine decay over ``iterations``: ``HEAD_LR`` for the head, ``CELL_LR`` for
    the cell's input weights and biases; weight_hh is not updated."""

    def labels(params):
        cell = {name: "fixed" if name == "weight_hh" else "cell" for name in params["cell"]}
        return {"cell": cell, "head": {name: "head" for name in params["head"]}}

    def adam(lr: float) -> optax.GradientTransformation:
        return optax.adam(optax.cosine_decay_schedule(lr, iterations))

    transforms = {"head": adam(HEAD_LR), "cell": adam(CELL_LR), "fixed": optax.set_to_zero()}
    return optax.multi_transform(transforms, labels)


@dataclasses.dataclass(frozen=True)
class Training:
    """What the demo trains: a configuration, its task and optimizer, and how to describe it."""

    config: rnn_synthetic.Config
    task: Task
    optimizer: optax.GradientTransformation
    recorded: dict[str, Any]
    description: str


def demo_training(config: rnn_synthetic.Config) -> Training:
    """The demo's recipe at the sizes of ``config`` (its lr and run length are the demo's)."""
    config = dataclasses.replace(config, lr=HEAD_LR)
    task = rnn_synthetic.make_task(config, inputs=encode, params=demo_params(config))
    description = (
        f"bits read as -1/+1; weight_hh = {RECURRENCE} I (not trained), small input weights, "
        f"zero biases; Adam with a cosine decay from lr {HEAD_LR:g} (head) and {CELL_LR:g} (cell) "
        f"to 0. `--paper` trains with the paper's recipe instead."
    )
    optimizer = demo_optimizer(config.num_iterations())
    return Training(config, task, optimizer, {"recipe": RECIPE}, description)


def paper_training(config: rnn_synthetic.Config) -> Training:
    """The paper's recipe at the sizes of ``config``."""
    description = (
        f"the paper's recipe: PyTorch's initialization, bits read as 0/1, Adam lr "
        f"{config.lr:g} on every parameter; {config.num_iterations()} iterations of it leave the "
        "loss at ln 10 = 2.30."
    )
    return Training(config, rnn_synthetic.make_task(config), optax.adam(config.lr), {}, description)


def gradient_check(task: Task) -> float:
    """Max normwise relative difference of BPPSA's gradient leaves from BP's, on the task's
    initial parameters and first batch."""
    batch = next(iter(task.batches(0)))
    bp = jax.jit(bppsa.grad(task.loss, method="sequential"))(task.params, *batch)
    ours = jax.jit(bppsa.grad(task.loss))(task.params, *batch)
    return max(
        float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(bp), strict=True)
    )


def summary(
    runs: Mapping[str, Sequence[dict[str, Any]]],
    initial: float,
    config: rnn_synthetic.Config,
    baseline: str = method_names.BP,
) -> dict[str, Any]:
    """The numbers of the "learned" line: accuracies, losses and the BP/BPPSA agreement."""
    final = {
        name: [r for r in rows if r.get("kind") == "eval"][-1]["test_accuracy"]
        for name, rows in runs.items()
    }
    losses = {name: np.array([r["loss"] for r in step_rows(rows)]) for name, rows in runs.items()}
    base = losses[baseline]
    tail = min(100, len(base))
    quarters = {}
    for name, loss in losses.items():
        if name != baseline:
            diff = np.abs(loss - base) / np.abs(base)
            quarters[name] = [float(part.max()) for part in np.array_split(diff, 4) if part.size]
    return dict(
        length=config.length,
        initial_accuracy=initial,
        final_accuracy=final,
        first_loss=float(base[0]),
        last_loss=float(base[-tail:].mean()),
        tail=tail,
        quarters=quarters,
    )


def learned_line(numbers: Mapping[str, Any]) -> str:
    """One line: what the model learned (or did not: less than 20 points of accuracy gained),
    before and after."""
    accuracies = sorted(set(numbers["final_accuracy"].values()))
    after = " / ".join(f"{a:.1%}" for a in accuracies)
    learned = min(accuracies) - numbers["initial_accuracy"] >= 0.2
    return (
        f"{'learned' if learned else 'not learned'}: which of the 10 bit probabilities made a "
        f"{numbers['length']}-bit stream; "
        f"test accuracy {numbers['initial_accuracy']:.1%} -> {after} (chance 10%); training loss "
        f"{numbers['first_loss']:.2f} at the start, {numbers['last_loss']:.2f} over the last "
        f"{numbers['tail']} iterations (ln 10 = 2.30)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = _cli.parser("experiments.demo", __doc__)
    _cli.add_presets(
        parser,
        {
            "quick": "the demo's recipe, 2000 iterations",
            "paper": "train with the paper's recipe (Adam lr 1e-5, PyTorch's initialization, bits "
            "as 0/1) for the quick configuration's 300 iterations; the sweeps are the same",
        },
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="results folder (replaced on every run)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    preset = rnn_synthetic.PRESETS["quick"]
    methods = [method_names.BP, method_names.BPPSA]
    device = jax.devices()[0]
    name = cpu_model() if device.platform == "cpu" else device.device_kind
    print(f"bppsa {bppsa.__version__}, jax {jax.__version__} on {device.platform} ({name})")
    if args.preset == "paper":
        training = paper_training(preset.train)
    else:
        config = dataclasses.replace(preset.train, iterations=ITERATIONS, eval_samples=EVAL_SAMPLES)
        training = demo_training(config)
    config, task = training.config, training.task
    chosen = bppsa.Auto().choose(
        config.length, config.hidden, batch=config.batch, element=config.hidden
    )  # RNN Jacobian: H floats
    print(
        f"BPPSA here is bppsa.Auto(), which runs {chosen!r} at T = {config.length}, "
        f"B = {config.batch} (and plain BP where the batch is too large for BPPSA to pay on this "
        "backend; see the table).\n"
    )

    print(
        f"1. Gradient of the RNN classifier (T = {config.length}, B = {config.batch}, the first "
        "batch of the training below), BPPSA vs BP:"
    )
    print(f"   max |g - g_BP| / max |g_BP| over the parameters: {gradient_check(task):.1e}\n")

    print(
        f"2. Training, BP and BPPSA in lockstep: T = {config.length}, B = {config.batch}, "
        f"H = {config.hidden}, {config.num_iterations()} iterations, same seed, init and "
        f"batches; {training.description}"
    )
    initial = task.evaluate(task.params)["test_accuracy"]
    runs = rnn_synthetic.train(
        config,
        methods,
        args.out / "train",
        overwrite=True,
        task=task,
        optimizer=training.optimizer,
        recorded=training.recorded,
    )
    print(_report.loss_table(runs))
    numbers = summary(runs, initial, config)
    for other, quarters in numbers["quarters"].items():
        print(
            f"   the same per quarter of the run ({other}): "
            + ", ".join(f"{q:.1e}" for q in quarters)
        )
    for method, accuracy in numbers["final_accuracy"].items():
        print(
            f"{method}: test accuracy ({config.eval_samples} samples) {initial:.1%} before "
            f"training, {accuracy:.1%} after"
        )
    print(learned_line(numbers))
    print(_report.timing_table(compare(runs, skip=1)) + "\n")

    points = rnn_synthetic.sweep_points(
        "both", preset.lengths, preset.batches, preset.sweep_batch, preset.sweep_length
    )
    sweep_config = dataclasses.replace(
        preset.sweep, length=preset.sweep_length, batch=preset.sweep_batch
    )
    print(
        f"3. Speed sweeps ({preset.sweep.iterations} iterations per point and method; medians; "
        "forward and backward each its own program):"
    )
    rows = rnn_synthetic.sweep(points, sweep_config, methods, args.out / "sweep", overwrite=True)
    print(_report.sweep_table(rows))
    print("   (a shared, loaded machine makes these times noisy: compare within a run.)\n")

    figures = args.out / "figures"
    paths = _style.save(fig7.draw(fig7.load_runs(args.out / "train")), figures, "fig7")
    paths += _style.save(fig8.draw(*fig8.load_sweep(args.out / "sweep")), figures, "fig8")
    print("4. Figures (from the result files above):")
    for path in paths:
        print(f"   {path}")
    accuracy = numbers["final_accuracy"][method_names.BP]
    print(
        f"\nDone in {time.perf_counter() - start:.0f} s (test accuracy {initial:.1%} -> "
        f"{accuracy:.1%}); results under {args.out}/."
    )


if __name__ == "__main__":
    main()
