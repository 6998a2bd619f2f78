"""The generic training loop: BP and BPPSA training curves coincide, and an interrupted run
resumes without duplicated or lost rows and continues exactly.

Tolerance of the curve test. BPPSA's float32 gradients differ from BP's by rounding only
(normwise ~3e-7, docs/accuracy.md), so the two runs see the same losses up to about one ulp
(measured: max relative loss difference 1.1e-7 over 50 iterations at lr 1e-3 and at the
paper's 1e-5; final parameters within 2e-7, normwise, after moving by ~0.04). We assert 1e-5:
a 50x margin, while an ordering bug (gradient errors of ~1e-2) shifts Adam's updates by ~1e-2
of lr per step and the parameters by ~1e-3 relative after 50 steps. The learning rate is 1e-3,
not larger: Adam normalizes each update, so a rounding-level difference in a near-zero
gradient component can flip that update's sign; in a stable run this stays at rounding level,
but at lr 1e-2 this tiny model's training turns unstable after ~35 iterations and then any
difference, rounding included, grows exponentially (measured: 0.4 after 50 iterations).
"""

import dataclasses
import itertools

import numpy as np
import pytest

import bppsa
import experiments._training as training
from experiments import rnn_synthetic
from experiments._records import load_checkpoint
from experiments._training import Trainer, run_together, step_rows
from paper_figures.result_files import JsonLines

RTOL = 1e-5


def _losses(rows):
    return np.array([row["loss"] for row in step_rows(rows)])


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_bp_and_bppsa_training_curves_coincide(tmp_path):
    config = rnn_synthetic.Config(
        length=30, batch=8, lr=1e-3, num_samples=1000, iterations=50, epochs=None
    )
    trainers = rnn_synthetic.make_trainers(
        config, ["bp", "bppsa", "blelloch"], tmp_path, progress=False
    )
    run_together(list(trainers.values()), chunk=20)
    losses = {name: _losses(t.rows()) for name, t in trainers.items()}
    like = (trainers["bp"].task.params, trainers["bp"].optimizer.init(trainers["bp"].task.params))
    params = {
        name: load_checkpoint(tmp_path / name / "checkpoint.npz", like)[0][0] for name in trainers
    }
    assert len(losses["bp"]) == 50
    for name in ("bppsa", "blelloch"):
        assert _relative(losses[name], losses["bp"]) <= RTOL, name
        for leaf, ref in zip(_leaves(params[name]), _leaves(params["bp"]), strict=True):
            assert _relative(leaf, ref) <= RTOL, name
    moved = max(_relative(a, b) for a, b in zip(_leaves(params["bp"]), _leaves(like[0])))
    assert moved > 1e-2  # the run trained: parameters moved far beyond the tolerance


def _leaves(tree):
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


# ----------------------------------------------------------------------------- timing


def test_each_phase_is_its_own_program_with_the_trainers_method(tmp_path):
    config = rnn_synthetic.Config(length=9, batch=4, num_samples=100, iterations=4, epochs=None)
    config = dataclasses.replace(config, forward_every=2)
    trainers = rnn_synthetic.make_trainers(config, ["blelloch"], tmp_path, progress=False)
    (trainer,) = trainers.values()
    with bppsa.trace_plans() as plans:
        trainer.start()
    # The gradient's forward and its backward, each compiled apart, run the trainer's method.
    assert plans and {repr(p.backward) for p in plans if p.backward} == {"Blelloch()"}
    trainer.run()
    (session,) = [r for r in trainer.rows() if r["kind"] == "session"]
    assert session["backward"] == "pullback"
    assert set(session["compile_s"]) == {"grad", "forward", "backward", "update"}
    for row in step_rows(trainer.rows()):
        extra = row["iteration"] % 2 == 0  # the forward and the backward every 2nd iteration
        assert (row["forward_s"] is not None) == extra == (row["backward_s"] is not None)
        if extra:
            assert row["forward_s"] > 0 and row["backward_s"] > 0
        assert row["grad_s"] > 0 and row["update_s"] > 0
        assert row["step_s"] == pytest.approx(row["grad_s"] + row["update_s"], abs=1e-6)


# ----------------------------------------------------------------------------- resume

ITERATIONS = 30
# 63 samples: a training split of 40, so with B = 4 an epoch is 10 iterations and the run
# evaluates (on 8 test samples) at the end of each epoch: iterations 10, 20 and 30.
CONFIG = rnn_synthetic.Config(
    length=12, batch=4, lr=1e-3, num_samples=63, iterations=ITERATIONS, epochs=None, eval_samples=8
)


def _trainer(out_dir, **kwargs):
    kwargs = dict(checkpoint_every=10, progress=False) | kwargs
    (trainer,) = rnn_synthetic.make_trainers(CONFIG, ["bp"], out_dir, **kwargs).values()
    return trainer


def _eval_points(rows):
    return [row["iterations_done"] for row in rows if row.get("kind") == "eval"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run: its folder and rows."""
    out_dir = tmp_path_factory.mktemp("reference")
    trainer = _trainer(out_dir)
    trainer.run()
    return out_dir, trainer.rows()


def _assert_same_run(rows, reference):
    steps = step_rows(rows)
    assert [row["iteration"] for row in steps] == list(range(ITERATIONS))
    np.testing.assert_array_equal(_losses(rows), _losses(reference))
    assert _eval_points(rows) == _eval_points(reference) == [10, 20, 30]
    wall = [row["wall_clock_s"] for row in steps]
    assert all(b > a for a, b in itertools.pairwise(wall))  # resumed clocks continue


class Interrupt(Exception):
    pass


def test_interrupted_runs_resume_without_duplicated_or_lost_rows(tmp_path, reference, monkeypatch):
    """Three interruptions of one run, each resumed by a new trainer (as a new process would):
    an exception, an early stop, and a hard crash between the log and the checkpoint. The
    result equals the uninterrupted run row for row, loss for loss."""
    log = tmp_path / "bp" / "metrics.jsonl"

    def fail_at_7(trainer, row):
        if row["iteration"] == 7:
            raise Interrupt

    with pytest.raises(Interrupt):  # 1. an exception: finished iterations are saved
        _trainer(tmp_path).run(callback=fail_at_7)
    assert [r["iteration"] for r in step_rows(JsonLines(log).read())] == list(range(8))

    stopped = _trainer(tmp_path)  # 2. an early stop, not at a checkpoint multiple
    assert stopped.start() == 8
    stopped.run(until=17)
    stopped.close()

    # 3. a hard crash after the rows of iterations 20..29 reached the log but before their
    # checkpoint, leaving a torn line too: the resumed run drops and regenerates them.
    save, calls = training.save_checkpoint, []

    def crash_on_second_save(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 2:
            raise SystemExit("simulated crash")
        save(*args, **kwargs)

    monkeypatch.setattr(training, "save_checkpoint", crash_on_second_save)
    with pytest.raises(SystemExit):
        _trainer(tmp_path).run()
    monkeypatch.setattr(training, "save_checkpoint", save)
    with open(log, "ab") as f:
        f.write(b'{"kind": "step", "iterat')
    assert max(r["iteration"] for r in step_rows(JsonLines(log).read())) == ITERATIONS - 1

    resumed = _trainer(tmp_path)
    assert resumed.start() == 20
    resumed.run()
    rows = resumed.rows()
    _assert_same_run(rows, reference[1])
    assert [r["iteration"] for r in rows if r["kind"] == "session"] == [0, 8, 17, 20]

    done = _trainer(tmp_path)  # a finished run: nothing to do, nothing appended
    done.run()
    assert done.rows() == rows


def test_another_configuration_is_refused(reference):
    out_dir, _ = reference
    other = dataclasses.replace(CONFIG, lr=1e-2)
    (trainer,) = rnn_synthetic.make_trainers(other, ["bp"], out_dir, progress=False).values()
    with pytest.raises(ValueError, match=r"another configuration .*lr: 0.001 there, 0.01 now"):
        trainer.start()


@pytest.mark.parametrize("name", ["num_iterations", "checkpoint_every", "forward_every"])
def test_bad_trainer_arguments_are_named(tmp_path, name):
    task = rnn_synthetic.make_task(CONFIG)
    kwargs = dict(num_iterations=5) | {name: 0}
    with pytest.raises(ValueError, match=name):
        Trainer(task, None, method="sequential", out_dir=tmp_path, config={}, **kwargs)
