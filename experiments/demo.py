"""The main job, ``make demo``: the paper's first experiment at a CPU-sized scale.

1. checks that BPPSA's gradient of the RNN classifier equals back-propagation's (one batch);
2. trains the RNN on the synthetic bitstreams with BP and with BPPSA in lockstep (T = 1000,
   B = 16, the quick configuration of ``experiments.rnn_synthetic`` with Adam's learning rate
   raised to ``DEMO_LR`` so that 300 iterations visibly learn) and prints the per-iteration loss
   agreement, the test accuracy before and after, and the per-phase times;
3. runs the quick T sweep (B = 16) and B sweep (T = 1000) and prints the speedup table;
4. draws Fig. 7 and Fig. 8 from the result files.

Everything is written under ``results/demo/`` (replaced on every run; figures in
``results/demo/figures/``). A few minutes on a 2-core CPU. Uses only the public API.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Sequence

import jax
import numpy as np

import bppsa
from bppsa.models import SequenceClassifier
from experiments import _cli, _report, rnn_synthetic
from experiments._records import cpu_model
from experiments._sweep import compare
from paper_figures import _style, fig7, fig8
from results_io import methods as method_names

DEFAULT_OUT = pathlib.Path("results/demo")
# The demo's learning rate. With the paper's 1e-5, 300 iterations of Adam leave the loss at
# ln 10. Measured at T = 1000, B = 16, 300 iterations (loss at iteration 299 from 2.38; largest
# relative BP/BPPSA loss difference): 1e-4 -> 2.31, 2.0e-7; 3e-4 -> 2.06, 2.2e-7; 1e-3 -> ~1.8
# but 2.5e-1: from there float32 rounding differences grow through Adam's normalized steps and
# the two curves part. 3e-4 learns visibly and keeps them identical.
DEMO_LR = 3e-4


def gradient_check(length: int = 1000, batch: int = 16, hidden: int = 20) -> float:
    """Max normwise relative difference of BPPSA's gradient leaves from BP's, on one batch."""
    data = rnn_synthetic.Config(length=length, batch=batch, hidden=hidden).data()
    xs, labels = data.batch("train", 0, batch)
    model = SequenceClassifier(1, hidden, rnn_synthetic.NUM_CLASSES)
    params = model.init(key=jax.random.key(0))
    bp = jax.jit(bppsa.grad(model.loss, method="sequential"))(params, xs, labels)
    ours = jax.jit(bppsa.grad(model.loss))(params, xs, labels)
    return max(
        float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(bp), strict=True)
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = _cli.parser("experiments.demo", __doc__)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    preset = rnn_synthetic.PRESETS["quick"]
    methods = [method_names.BP, method_names.BPPSA]
    device = jax.devices()[0]
    name = cpu_model() if device.platform == "cpu" else device.device_kind
    print(f"bppsa {bppsa.__version__}, jax {jax.__version__} on {device.platform} ({name})")
    chosen = bppsa.Auto().choose(1000, 20, batch=16, element=20)  # RNN Jacobian: 20 floats
    print(
        f"BPPSA here is bppsa.Auto(), which runs {chosen!r} at T = 1000, B = 16 (and plain BP "
        "where the batch is too large for BPPSA to pay on this backend; see the table).\n"
    )

    print("1. Gradient of the RNN classifier (T = 1000, B = 16), BPPSA vs BP:")
    print(f"   max |g - g_BP| / max |g_BP| over the parameters: {gradient_check():.1e}\n")

    config = dataclasses.replace(preset.train, lr=DEMO_LR)
    print(
        f"2. Training, BP and BPPSA in lockstep: T = {config.length}, B = {config.batch}, "
        f"H = {config.hidden}, Adam lr = {config.lr:g}, {config.iterations} iterations, same "
        f"seed, init and batches. (lr {config.lr:g}, not the paper's {preset.train.lr:g}: "
        f"with that, {config.iterations} iterations leave the loss at ln 10 = 2.30; "
        "`python -m experiments.rnn_synthetic train --paper` runs the paper's.)"
    )
    task = rnn_synthetic.make_task(config)
    initial = task.evaluate(task.params)["test_accuracy"]
    runs = rnn_synthetic.train(config, methods, args.out / "train", overwrite=True)
    print(_report.loss_table(runs))
    for name, rows in runs.items():
        evals = [r for r in rows if r.get("kind") == "eval"]
        if evals:
            print(
                f"{name}: test accuracy ({config.eval_samples} samples) {initial:.1%} before "
                f"training, {evals[-1]['test_accuracy']:.1%} after"
            )
    print(_report.timing_table(compare(runs, skip=1)) + "\n")

    points = rnn_synthetic.sweep_points(
        "both", preset.lengths, preset.batches, preset.sweep_batch, preset.sweep_length
    )
    sweep_config = dataclasses.replace(
        preset.sweep, length=preset.sweep_length, batch=preset.sweep_batch
    )
    print(
        f"3. Speed sweeps ({preset.sweep.iterations} iterations per point and method; medians; "
        "backward = value_and_grad - forward):"
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
    print(f"\nDone in {time.perf_counter() - start:.0f} s; results under {args.out}/.")


if __name__ == "__main__":
    main()
