"""The speed benchmark's command line on a tiny grid: it runs, and its JSON holds what the
README quotes (no timing is asserted)."""

import json

import pytest

from benchmarks import speed


def test_tiny_grid_writes_rows_for_every_method(tmp_path):
    out = tmp_path / "speed.json"
    grid = ["--cells", "rnn", "--lengths", "5", "--t-batch", "2", "--batches", "--repeats", "1"]
    speed.main([*grid, "--methods", "auto", "blelloch", "chunked-2", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["b_sweep"] == []
    (row,) = payload["t_sweep"]
    assert (row["cell"], row["length"], row["batch"]) == ("rnn", 5, 2)
    assert set(row["methods"]) == {"auto", "blelloch", "chunked-2"}
    assert row["methods"]["auto"]["runs"].startswith("Blocked(method=Sequential(jacobians=True)")
    assert row["methods"]["chunked-2"]["runs"] == "Chunked(chunks=2)"
    for method in row["methods"].values():
        assert method["total_ms"] > 0 and method["backward_speedup"] > 0


@pytest.mark.parametrize("flag", ["--hidden", "--repeats", "--t-batch", "--b-length"])
def test_bad_sizes_are_refused_before_any_work(flag, capsys):
    with pytest.raises(SystemExit):
        speed.main([flag, "0"])
    assert flag in capsys.readouterr().err
