"""benchmarks/deer.py with a stand-in for DEER's package (DEER is not a dependency): the
plumbing, the iteration counts and the refusal of a folder without it."""

import json
import sys
import textwrap

import pytest

from benchmarks import deer

# The interface the benchmark uses: seq1d(func, y0, xs, params, method=DEER(max_iter=...)) with
# .value and .success; this stand-in solves sequentially and "succeeds" from max_iter = 3 on.
STAND_IN = """
import jax
import jax.numpy as jnp


class DEER:
    def __init__(self, max_iter=10000):
        self.max_iter = max_iter


class _Result:
    def __init__(self, value, success):
        self.value, self.success = value, success


def seq1d(func, y0, xs, params, method):
    _, ys = jax.lax.scan(lambda h, x: (func(h, x, params),) * 2, y0, xs)
    return _Result(ys, jnp.full(ys.shape, method.max_iter > 2))
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    package = tmp_path / "scratch" / "deer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fseq1d.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m == "deer" or m.startswith("deer.")]:
        monkeypatch.delitem(sys.modules, name)
    yield package.parent
    for name in [m for m in sys.modules if m == "deer" or m.startswith("deer.")]:
        del sys.modules[name]


def test_a_row_times_both_and_counts_their_iterations(stand_in, tmp_path):
    out = tmp_path / "deer.json"
    argv = ["--deer-path", str(stand_in), "--length", "12", "--batch", "2", "--rounds", "1"]
    assert deer.main([*argv, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["hidden"], row["length"], row["batch"]) == (2, 12, 2)
    assert row["deer_iterations"] == 2  # succeeds from max_iter = 3
    assert row["deer_max_abs_difference"] == 0.0  # the stand-in is lax.scan itself
    for name in ("auto", "blelloch"):
        assert row[f"newton_{name}_converged"] and 1 <= row[f"newton_{name}_iterations"] <= 12
        assert row[f"newton_{name}_max_abs_difference"] < 1e-5
    for name in ("newton_auto", "newton_blelloch", "deer"):
        expected = row[f"{name}_median_s"] / row[f"{name}_iterations"]
        assert row[f"{name}_per_iteration_s"] == pytest.approx(expected)


def test_a_folder_without_deer_is_refused_naming_the_argument(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        deer.main(["--deer-path", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert error.value.code == 2
    assert "argument --deer-path: no folder 'deer' in" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
