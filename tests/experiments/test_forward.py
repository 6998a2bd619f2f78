"""``--forward newton`` of the training commands: the BPPSA runs solve their forward pass by
Newton iterations (``bppsa.Newton()``) while BP keeps ``lax.scan``, the per-iteration losses
still agree with BP's, each run's log records the forward it ran, and result files written
before the option (no ``forward`` in their configuration) still resume. ``--forward fused``
runs ``bppsa.Fused()`` the same way.

Tolerance: that of tests/experiments/test_training.py (relative 1e-5, at lr 1e-3). The Newton
forward is certified to 64 float32 epsilons per step and falls back to ``lax.scan`` where it
does not converge, so its trajectory, hence the loss and the gradients, differ from
``lax.scan``'s by rounding only (measured on these runs: max relative loss difference ~1e-7).
"""

import json

import numpy as np
import pytest

import bppsa
from bppsa.data import irmas_fixture
from experiments import gru_irmas, rnn_synthetic
from experiments._training import step_rows
from paper_figures.result_files import JsonLines

RTOL = 1e-5  # as in test_training.py
ITERATIONS = 12
TINY_RNN = ["--length", 20, "--batch", 4, "--samples", 100, "--lr", 1e-3, "--no-progress"]


def _main(module, *argv):
    return module.main([str(a) for a in argv])


def _run(folder, method):
    """The rows of one method's run: its first session's configuration and its losses."""
    rows = JsonLines(folder / method / "metrics.jsonl").read()
    session = next(row for row in rows if row["kind"] == "session")
    return session["config"], np.array([row["loss"] for row in step_rows(rows)])


def _checkpoint(folder, method):
    with np.load(folder / method / "checkpoint.npz") as data:
        return [data[k] for k in sorted(data.files) if k.startswith("leaf_")]


def _assert_newton_only_in_bppsa(plans):
    """bp's scans (requested ``Sequential()``) ran ``lax.scan``; BPPSA's (``Auto()``) under
    ``bppsa.value_and_grad`` ran Newton."""
    bp = [p for p in plans if p.requested == bppsa.Sequential()]
    newton = [p for p in plans if isinstance(p.forward, bppsa.Newton)]
    assert bp and not any(isinstance(p.forward, bppsa.Newton) for p in bp)
    assert newton and all(isinstance(p.requested, bppsa.Auto) for p in newton)


def test_rnn_train_with_the_newton_forward_agrees_with_bp(tmp_path, capsys):
    with bppsa.trace_plans() as plans:
        code = _main(
            rnn_synthetic, "train", *TINY_RNN, "--iterations", ITERATIONS,
            "--eval-samples", 0, "--forward", "newton", "--out", tmp_path,
        )  # fmt: skip
    assert code == 0
    assert f"over {ITERATIONS} iterations" in capsys.readouterr().out
    _assert_newton_only_in_bppsa(plans)
    folder = tmp_path / "train-quick-T20-B4"
    (bp_config, bp), (bppsa_config, losses) = _run(folder, "bp"), _run(folder, "bppsa")
    assert bppsa_config["forward"] == "newton"
    assert bp_config["forward"] == "sequential"  # the reference stays lax.scan
    assert len(losses) == len(bp) == ITERATIONS
    np.testing.assert_allclose(losses, bp, rtol=RTOL)
    params, reference = _checkpoint(folder, "bppsa"), _checkpoint(folder, "bp")
    for leaf, ref in zip(params, reference, strict=True):
        np.testing.assert_allclose(leaf, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())


def test_rnn_train_with_the_fused_forward_agrees_with_bp(tmp_path):
    """``--forward fused``: the BPPSA runs' scans run ``bppsa.Fused()`` (its kernel
    interpreted on a CPU), BP's ``lax.scan``; the losses agree as with Newton's."""
    argv = ["train", "--smoke", *TINY_RNN, "--iterations", 3, "--eval-samples", 0]
    with bppsa.trace_plans() as plans:
        assert _main(rnn_synthetic, *argv, "--forward", "fused", "--out", tmp_path) == 0
    assert any(isinstance(p.forward, bppsa.Fused) for p in plans)
    assert not any(
        isinstance(p.forward, bppsa.Fused) for p in plans if p.requested == bppsa.Sequential()
    )
    folder = tmp_path / "train-smoke"  # T = 20 and B = 4 are the smoke preset's: no sizes
    (bp_config, bp), (bppsa_config, losses) = _run(folder, "bp"), _run(folder, "bppsa")
    assert (bppsa_config["forward"], bp_config["forward"]) == ("fused", "sequential")
    np.testing.assert_allclose(losses, bp, rtol=RTOL)


def test_rnn_sweep_records_the_forward(tmp_path):
    argv = ["sweep", "t", "--lengths", 8, "--sweep-batch", 2, "--samples", 100, "--iterations", 3]
    assert (
        _main(rnn_synthetic, *argv, "--forward", "newton", "--no-progress", "--out", tmp_path) == 0
    )
    folder = tmp_path / "sweep-quick"
    (sweep,) = [r for r in JsonLines(folder / "sweep.jsonl").read() if r["kind"] == "sweep"]
    assert sweep["config"]["forward"] == "newton"
    run = folder / "runs" / "T8-B2"
    assert _run(run, "bppsa")[0]["forward"] == "newton"
    assert _run(run, "bp")[0]["forward"] == "sequential"


def test_gru_train_with_the_newton_forward_agrees_with_bp(tmp_path):
    root = tmp_path / "fixture"
    irmas_fixture.write_fixture(root, 1, seed=0)
    argv = ["train", "--data", root, "--variants", "S", "--batch", 4, "--iterations", 5]
    argv += ["--cache-dir", tmp_path / "cache", "--no-eval", "--no-progress", "--out", tmp_path]
    with bppsa.trace_plans() as plans:
        assert _main(gru_irmas, *argv, "--forward", "newton", "--name", "t") == 0
    _assert_newton_only_in_bppsa(plans)
    folder = tmp_path / "t" / "S-B4"
    (bp_config, bp), (bppsa_config, losses) = _run(folder, "bp"), _run(folder, "bppsa")
    assert (bppsa_config["forward"], bp_config["forward"]) == ("newton", "sequential")
    assert len(losses) == len(bp) == 5
    np.testing.assert_allclose(losses, bp, rtol=RTOL)


@pytest.mark.parametrize(
    "module, argv",
    [
        (rnn_synthetic, ["train"]),
        (rnn_synthetic, ["sweep"]),
        (gru_irmas, ["train", "--data", "{tmp}"]),
    ],
)
def test_an_unknown_forward_is_refused(module, argv, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as info:
        _main(module, *argv, "--forward", "bogus", "--out", tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --forward: invalid choice: 'bogus'" in err
    assert "sequential" in err and "newton" in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_help_says_that_bp_keeps_lax_scan(capsys):
    with pytest.raises(SystemExit):
        _main(rnn_synthetic, "train", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--forward {sequential,newton,fused}" in help_text
    assert "bp always runs jax.grad through lax.scan" in help_text


def test_a_run_from_before_the_option_resumes_and_refuses_another_forward(tmp_path, capsys):
    """A log whose configuration has no ``forward`` (written before ``--forward``) ran
    ``lax.scan``: it resumes with the default and is refused, naming the key, with newton."""
    argv = ["train", *TINY_RNN, "--eval-samples", 0, "--method", "bppsa", "--out", tmp_path]
    assert _main(rnn_synthetic, *argv, "--iterations", 2) == 0
    log = tmp_path / "train-quick-T20-B4" / "bppsa" / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    del rows[0]["config"]["forward"]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))

    assert _main(rnn_synthetic, *argv, "--iterations", 3) == 0
    assert [r["iteration"] for r in step_rows(JsonLines(log).read())] == [0, 1, 2]
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        _main(rnn_synthetic, *argv, "--iterations", 4, "--forward", "newton")
    assert info.value.code == 2
    assert "forward: 'sequential' there, 'newton' now" in capsys.readouterr().err
