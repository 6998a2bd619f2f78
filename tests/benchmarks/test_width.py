"""``benchmarks.width`` at a tiny size: every gradient's three quantities each its own program,
the standalone forwards beside them, and no backward derived as a difference of two programs."""

import json

import pytest

from benchmarks import width

QUANTITIES = ("total", "forward", "backward")


def test_each_quantity_is_its_own_measurement(tmp_path):
    out = tmp_path / "width.json"
    argv = ["--cells", "diagonal-gru", "--hiddens", "4", "--lengths", "5", "--batches", "2"]
    argv += ["--inputs", "3", "--methods", "blelloch", "--newton", "--repeats", "2"]
    assert width.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["backward"] == "pullback" and data["complete"]
    (row,) = data["rows"]
    assert (row["cell"], row["hidden"], row["length"], row["batch"]) == ("diagonal-gru", 4, 5, 2)
    # The standalone forwards of interest are their own programs too.
    for name in ("lax_scan", "newton"):
        assert 0 < row[f"{name}_min_ms"] <= row[f"{name}_ms"]
    assert row["newton_speedup_median"] == pytest.approx(row["lax_scan_ms"] / row["newton_ms"])
    bp, ours = row["methods"]["bp"], row["methods"]["blelloch"]
    for entry in (bp, ours):
        for quantity in QUANTITIES:
            assert 0 < entry[f"{quantity}_min_ms"] <= entry[f"{quantity}_ms"]
        assert set(entry["compile_s"]) == set(QUANTITIES)
        assert entry["per_step_backward_us"] == pytest.approx(1e3 * entry["backward_ms"] / 5)
        assert not {"backward_resolved", "grad_median_s", "forward_median_s"} & set(entry)
    # The backward program runs the method bound in the loss.
    assert ours["ran"] == "Blelloch()" and ours["jacobians"] == "analytic, diagonal"
    for stat, suffix in (("median", ""), ("min", "_min")):
        for quantity in ("backward", "total"):
            ms = f"{quantity}{suffix}_ms"
            assert ours[f"{quantity}_speedup_{stat}"] == pytest.approx(bp[ms] / ours[ms])


def test_the_structure_check_s_cost_is_a_ratio_of_two_programs(tmp_path):
    out = tmp_path / "check.json"
    argv = ["--cells", "indrnn-user", "--hiddens", "4", "--lengths", "5", "--batches", "2"]
    argv += ["--inputs", "3", "--methods", "blelloch", "--structure-check", "--repeats", "2"]
    assert width.main([*argv, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    checked, unchecked = row["methods"]["blelloch"], row["unchecked"]["blelloch"]
    assert set(row["methods"]) == {"bp", "blelloch"}  # the method names stay the vocabulary's
    assert checked["jacobians"] == "autodiff, diagonal"  # a found structure: the check runs
    for stat, suffix in (("median", ""), ("min", "_min")):
        for quantity in ("backward", "total"):
            ms = f"{quantity}{suffix}_ms"
            assert checked[f"check_cost_{quantity}_{stat}"] == pytest.approx(
                checked[ms] / unchecked[ms]
            )
