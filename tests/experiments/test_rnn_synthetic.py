"""The command line of experiment 1: clear errors before any heavy work, and a tiny train and
sweep whose result files the figure scripts draw."""

import pathlib

import matplotlib.image
import pytest

from experiments import rnn_synthetic
from paper_figures import fig7, fig8


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        rnn_synthetic.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "sweep" in out


@pytest.mark.parametrize(
    "argv, argument",
    [
        (["train", "--length", "0"], "--length"),
        (["train", "--batch", "x"], "--batch"),
        (["train", "--method", "bp", "fancy"], "--method"),
        (["train", "--lr", "-1"], "--lr"),
        (["train", "--train-fraction", "1.5"], "--train-fraction"),
        (["train", "--iterations", "5", "--epochs", "2"], "--epochs"),
        (["train", "--quick", "--paper"], "--paper"),
        (["train", "--batch", "40000"], "--batch"),
        (["sweep", "sideways"], "which"),
        (["sweep", "--batches", "2", "0"], "--batches"),
        (["sweep", "--samples", "10", "--batches", "8"], "--batch"),
    ],
)
def test_bad_input_names_the_argument(argv, argument, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        rnn_synthetic.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"argument {argument}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # failed before writing anything


def _png_ok(path: pathlib.Path) -> None:
    assert path.stat().st_size > 10_000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 600


def test_tiny_train_and_sweep_write_results_that_the_figures_draw(tmp_path, capsys):
    common = ["--samples", "100", "--no-progress", "--out", str(tmp_path)]
    assert (
        rnn_synthetic.main(
            [
                "train",
                "--length",
                "8",
                "--batch",
                "4",
                "--iterations",
                "4",
                "--eval-samples",
                "4",
                *common,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "max |loss_bppsa - loss_bp| / |loss_bp| over 4 iterations" in out
    run = tmp_path / "train-quick-T8-B4"  # named after the sizes given
    assert sorted(p.name for p in run.iterdir()) == ["bp", "bppsa"]

    sweep = [
        "sweep",
        "--lengths",
        "8",
        "--batches",
        "2",
        "--sweep-batch",
        "4",
        "--sweep-length",
        "8",
        "--iterations",
        "3",
        *common,
    ]
    assert rnn_synthetic.main(sweep) == 0
    rows = fig8.load_sweep(tmp_path / "sweep-quick")[1]
    assert [r["point"] for r in rows] == [
        {"sweep": "T", "length": 8, "batch": 4},
        {"sweep": "B", "length": 8, "batch": 2},
    ]
    for r in rows:
        # Every phase is its own program's median: the backward is the pullback's, never
        # value_and_grad - forward, so every method has one and a speedup.
        assert r["backward"] == "pullback" and "forward_s" not in r
        ours, bp = r["methods"]["bppsa"], r["methods"]["bp"]
        for m in (ours, bp):
            assert m["forward_s"] > 0 and m["backward_s"] > 0 and m["grad_s"] > 0
            assert m["step_s"] == pytest.approx(m["grad_s"] + m["update_s"])
        assert ours["backward_speedup"] == pytest.approx(bp["backward_s"] / ours["backward_s"])
        assert ours["overall_speedup"] == pytest.approx(bp["step_s"] / ours["step_s"])
    assert rnn_synthetic.main(sweep) == 0  # resumed: every point is done, none is rerun
    assert len(fig8.load_sweep(tmp_path / "sweep-quick")[1]) == 2

    figures = tmp_path / "figures"
    paths = fig7.main([str(run), "--out", str(figures)])
    paths += fig8.main([str(tmp_path / "sweep-quick"), "--out", str(figures)])
    assert sorted(p.name for p in paths) == ["fig7.pdf", "fig7.png", "fig8.pdf", "fig8.png"]
    for path in paths:
        assert path.stat().st_size > 10_000
    _png_ok(figures / "fig7.png")
    _png_ok(figures / "fig8.png")
