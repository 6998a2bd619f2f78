"""The demo (``make demo``): what it writes and prints, at a tiny size, and that its training
recipe learns with BP and BPPSA in lockstep."""

import dataclasses

import numpy as np
import pytest

from experiments import _report, demo, rnn_synthetic
from experiments._training import step_rows
from paper_figures.result_files import read_rows

TINY = rnn_synthetic.Preset(
    "quick",
    train=rnn_synthetic.Config(
        length=16, batch=4, num_samples=200, iterations=4, epochs=None, eval_samples=16
    ),
    lengths=(8,),
    batches=(2,),
    sweep=rnn_synthetic.Config(num_samples=200, iterations=3, epochs=None),
    sweep_batch=4,
    sweep_length=16,
)


@pytest.mark.parametrize("paper", [False, True])
def test_demo_writes_runs_sweeps_and_figures(paper, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(rnn_synthetic.PRESETS, "quick", TINY)
    monkeypatch.setattr(demo, "ITERATIONS", 6)
    monkeypatch.setattr(demo, "EVAL_SAMPLES", 16)
    demo.main(["--out", str(tmp_path)] + (["--paper"] if paper else []))
    out = capsys.readouterr().out
    iterations = 4 if paper else 6

    for section in ("1. Gradient", "2. Training", "3. Speed sweeps", "4. Figures", "Done in"):
        assert section in out
    assert f"over {iterations} iterations" in out
    learned = [line for line in out.splitlines() if "learned: which of the 10 bit" in line]
    assert len(learned) == 1  # a few iterations at T = 16 learn nothing
    assert learned[0].startswith("not learned: ") and "(chance 10%)" in learned[0]

    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["bp", "bppsa"]
    for method in ("bp", "bppsa"):
        rows = read_rows(tmp_path / "train" / method / "metrics.jsonl")
        config = next(r for r in rows if r["kind"] == "session")["config"]
        assert config["method"] == method and config["length"] == 16
        if paper:
            assert config["lr"] == TINY.train.lr and "recipe" not in config
        else:
            assert config["lr"] == demo.HEAD_LR and config["recipe"] == demo.RECIPE
        assert [r["iteration"] for r in step_rows(rows)] == list(range(iterations))
        assert [r["iterations_done"] for r in rows if r["kind"] == "eval"] == [iterations]
        assert (tmp_path / "train" / method / "checkpoint.npz").is_file()
    sweep = read_rows(tmp_path / "sweep" / "sweep.jsonl")
    points = [r["point"] for r in sweep if "point" in r]
    assert points == [
        {"sweep": "T", "length": 8, "batch": 4},
        {"sweep": "B", "length": 16, "batch": 2},
    ]
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == ["fig7.pdf", "fig7.png", "fig8.pdf", "fig8.png"]


def test_demo_recipe_keeps_weight_hh_and_starts_as_described():
    config = dataclasses.replace(TINY.train, hidden=5)
    params = demo.demo_params(config)
    cell = params["cell"]
    np.testing.assert_array_equal(cell["weight_hh"], demo.RECURRENCE * np.eye(5, dtype=np.float32))
    assert np.abs(cell["weight_ih"]).max() <= demo.INPUT_SCALE
    assert not np.any(cell["bias_ih"]) and not np.any(cell["bias_hh"])
    training = demo.demo_training(config)
    state = training.optimizer.init(training.task.params)
    grads = {
        part: {name: np.ones_like(value) for name, value in leaves.items()}
        for part, leaves in training.task.params.items()
    }
    updates, _ = training.optimizer.update(grads, state, training.task.params)
    assert not np.any(updates["cell"]["weight_hh"])
    # Adam's first step is -lr * sign(g): the head's lr and the cell's smaller one
    np.testing.assert_allclose(updates["head"]["weight"], -demo.HEAD_LR, rtol=1e-5)
    np.testing.assert_allclose(updates["cell"]["weight_ih"], -demo.CELL_LR, rtol=1e-5)


def test_demo_recipe_learns_with_bp_and_bppsa_in_lockstep(tmp_path):
    """At T = 100 and 300 iterations (seeded, so deterministic) the recipe learns well above
    chance; measured: test accuracy 10% -> about 60%, loss 2.4 -> 1.2, BP/BPPSA 2e-7."""
    config = rnn_synthetic.Config(
        length=100, batch=16, num_samples=5000, iterations=300, epochs=None, eval_samples=500
    )
    training = demo.demo_training(config)
    before = training.task.evaluate(training.task.params)["test_accuracy"]
    runs = rnn_synthetic.train(
        training.config,
        ["bp", "bppsa"],
        tmp_path,
        progress=False,
        task=training.task,
        optimizer=training.optimizer,
        recorded=training.recorded,
    )
    numbers = demo.summary(runs, before, training.config)
    assert before < 0.25
    assert min(numbers["final_accuracy"].values()) > 0.45
    assert numbers["first_loss"] > 2.0 and numbers["last_loss"] < 1.5
    assert demo.learned_line(numbers).startswith("learned: ")
    assert _report.loss_differences(runs)["bppsa"] < 1e-5
