"""``python -m paper_figures``: lists every figure script, and draws the figures named from
their result files (the defaults, or ``NAME=RUN``), naming the command that writes missing
results."""

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from paper_figures import _catalog
from tests.paper_figures.test_fig7_fig8 import _run_rows, _write

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path):
    """A training run's folder as ``experiments.rnn_synthetic train`` writes it."""
    folder = tmp_path / "train"
    _write(folder / "bp" / "metrics.jsonl", _run_rows("bp", 0.010))
    _write(folder / "bppsa" / "metrics.jsonl", _run_rows("bppsa", 0.004))
    return folder


def test_the_catalog_names_every_figure_script_once():
    scripts = {
        path.stem for path in (ROOT / "paper_figures").glob("*.py") if not path.stem.startswith("_")
    }
    assert set(_catalog.BY_NAME) == scripts
    assert len(_catalog.FIGURES) == len(scripts)
    for figure in _catalog.FIGURES:
        assert callable(importlib.import_module(f"paper_figures.{figure.name}").main)
        assert figure.summary and "\n" not in figure.summary


def test_python_m_paper_figures_lists_the_figures():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for argv in ([], ["--list"]):
        done = subprocess.run(
            [sys.executable, "-m", "paper_figures", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        lines = done.stdout.splitlines()
        for figure in _catalog.FIGURES:
            assert any(line.split()[:1] == [figure.name] for line in lines), figure.name
            assert f"(from {figure.written_by})" in done.stdout


def test_a_figure_is_drawn_from_the_results_given(run, tmp_path, capsys):
    out = tmp_path / "figures"
    assert _catalog.main([f"fig7={run}", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["fig7.pdf", "fig7.png"]
    assert "wrote" in capsys.readouterr().out


def test_a_figure_is_drawn_from_its_default_results(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "rnn_synthetic").mkdir(parents=True)
    run.rename(tmp_path / "results" / "rnn_synthetic" / "train-quick")
    assert _catalog.main(["fig7"]) == 0
    figures = tmp_path / "results" / "rnn_synthetic" / "train-quick" / "figures"
    assert (figures / "fig7.png").stat().st_size > 0


def test_missing_results_name_the_command_that_writes_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        _catalog.main(["fig8"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "skipped fig8: no results at results/rnn_synthetic/sweep-quick" in captured.out
    assert "python -m experiments.rnn_synthetic sweep" in captured.out
    assert "1 figure(s) without results" in captured.err


def test_all_draws_the_figures_whose_results_are_there(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:  # nothing there
        _catalog.main(["all", "--out", str(tmp_path / "none")])
    assert info.value.code == 2
    capsys.readouterr()
    out = tmp_path / "figures"
    assert _catalog.main(["all", f"fig7={run}", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["fig7.pdf", "fig7.png"]
    printed = capsys.readouterr().out
    assert printed.count("skipped ") == len(_catalog.FIGURES) - 1


def test_an_unknown_figure_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        _catalog.main(["fig99"])
    assert info.value.code == 2
    assert "unknown figure 'fig99'; expected one of fig7" in capsys.readouterr().err


@pytest.mark.parametrize("figure", _catalog.FIGURES, ids=lambda figure: figure.name)
def test_every_figure_scripts_help_says_where_out_goes(figure, capsys):
    module = importlib.import_module(f"paper_figures.{figure.name}")
    with pytest.raises(SystemExit):
        module.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--out OUT output folder (default " in help_text
