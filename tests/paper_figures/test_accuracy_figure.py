"""The accuracy figure and table, from a small results file in the format of
``benchmarks.accuracy`` and from the committed CPU results (which give the committed table)."""

import json
import pathlib

import matplotlib.image
import pytest

from paper_figures import accuracy

METHODS = ("bp", "blelloch", "chunked", "auto")
COMMITTED = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "accuracy_cpu.json"


def _row(cell, regime, length, error):
    def errors(scale):
        return {
            m: {"median": None if error is None else scale * error * (1 + i), "max": None}
            for i, m in enumerate(METHODS)
        }

    return dict(
        cell=cell,
        regime=regime,
        gain=0.9 if regime == "contractive" else 1.25,
        length=length,
        grad_norm=0.5 * length,
        end_to_end=errors(2.0),
        backward_only=errors(1.0),
    )


def _payload():
    rows = [
        _row(cell, regime, length, 1e-7 * length**0.5)
        for cell in ("rnn", "gru")
        for regime in ("contractive", "expansive")
        for length in (10, 1000, 30_000)
    ]
    rows[-1] = _row("gru", "expansive", 30_000, None)  # float32 overflowed
    return dict(batch=16, hidden=20, device="cpu", jax="0.10.2", rows=rows)


def test_figure_and_table(tmp_path):
    results = tmp_path / "accuracy.json"
    results.write_text(json.dumps(_payload()))
    paths = accuracy.main([str(results), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in paths) == ["accuracy.md", "accuracy.pdf", "accuracy.png"]
    image = matplotlib.image.imread(tmp_path / "out" / "accuracy.png")
    assert image.shape[0] > 500 and image.shape[1] > 800 and image.std() > 0.01

    lines = (tmp_path / "out" / "accuracy.md").read_text().splitlines()
    assert len(lines) == 2 + 12
    first = lines[2].split(" | ")
    # RNN, contractive, T = 10: |g| 5, then BP .. Auto end to end, then backward only.
    assert first[:4] == ["| RNN", "contractive (0.9)", "10", "5.0e+00"]
    assert first[4:7] == ["6.3e-07", "1.3e-06", "1.9e-06"]
    assert "overflow" in lines[-1] and lines[-1].startswith("| GRU | expansive (1.25) | 30,000")


def test_table_of_selected_lengths():
    text = accuracy.table(_payload(), lengths=[1000])
    assert text.count("\n| ") == 4  # one row per cell and weights, after the header


def test_missing_results_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        accuracy.main([str(tmp_path / "nowhere.json")])
    assert exit_info.value.code == 2
    assert "nowhere.json" in capsys.readouterr().err


def test_committed_results_cover_the_study():
    payload = accuracy.load(COMMITTED)
    keys = {(r["cell"], r["regime"], r["length"]) for r in payload["rows"]}
    for cell in ("rnn", "gru"):
        for regime in ("contractive", "expansive"):
            for length in (10, 1000, 10_000, 30_000):
                assert (cell, regime, length) in keys
    assert accuracy.table(payload, lengths=[1000, 10_000, 30_000]).count("\n| ") == 12


def test_committed_table_is_that_of_the_committed_results():
    table = COMMITTED.parents[2] / "paper_figures" / "output" / "accuracy.md"
    assert accuracy.table(accuracy.load(COMMITTED)) == table.read_text()
