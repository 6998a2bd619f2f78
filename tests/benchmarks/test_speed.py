"""The speed benchmark's command line on a tiny grid: it runs, and its JSON holds what
docs/performance.md quotes (no timing is asserted); each quantity is its own program's time
(a clock whose durations are all odd: no time is the difference of two others)."""

import json
import math

import pytest

from benchmarks import speed
from tests.benchmarks.odd_clock import QUANTITIES, OddClock, odd_seconds


def test_tiny_grid_writes_rows_for_every_method(tmp_path):
    out = tmp_path / "speed.json"
    grid = ["--cells", "rnn", "--lengths", "5", "--t-batch", "2", "--batches", "--repeats", "1"]
    speed.main([*grid, "--methods", "auto", "blelloch", "chunked-2", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["backward"] == "pullback"  # each backward timed as its own program
    assert payload["b_sweep"] == []
    (row,) = payload["t_sweep"]
    assert (row["cell"], row["length"], row["batch"]) == ("rnn", 5, 2)
    assert row["backward"] == "pullback" and row["rounds"] == 1
    assert set(row["methods"]) == {"auto", "blelloch", "chunked-2"}
    assert row["methods"]["auto"]["runs"].startswith("Blocked(method=SequentialScan()")
    assert row["methods"]["chunked-2"]["runs"] == "Chunked(chunks=2)"
    for quantity in QUANTITIES:
        assert 0 < row[f"bp_{quantity}_min_ms"] <= row[f"bp_{quantity}_ms"]
    assert row["bp_backward_kernel_ms"] is None  # the profiler's kernels: on a GPU only
    assert 0 < row["standalone_forward_min_ms"] <= row["standalone_forward_ms"]
    assert set(row["compile_s"]["bp"]) == set(QUANTITIES)
    for method in row["methods"].values():
        assert method["status"] == "ok" and method["error"] is None
        for quantity in QUANTITIES:
            assert 0 < method[f"{quantity}_min_ms"] <= method[f"{quantity}_ms"]
        assert method["backward_kernel_ms"] is None
        assert method["backward_speedup"] == pytest.approx(
            row["bp_backward_ms"] / method["backward_ms"]
        )
        assert method["overall_speedup"] == pytest.approx(row["bp_total_ms"] / method["total_ms"])
        assert method["achieved_gflops"] > 0 and "backward_resolved" not in method
        # The model beside the measurement: its floor and the backward program's HLO count.
        assert method["floor_ms"] > 0 and method["model_ms"] > 0
        assert method["hlo_backward"]["steps"] > 0 and method["hlo_backward"]["flops"] > 0
        assert method["page_faults"] >= 0  # minor faults per call (a median)
    assert 0 < row["chain_min_ms"] <= row["chain_ms"] and row["bp_floor_ms"] > 0
    # The parts timed alone: the chain and the steps' VJP over Auto()'s blocks, and their sum.
    assert 0 < row["parts_min_ms"] <= row["parts_ms"] and row["parts_block"] == 8192
    assert row["parts_sum_ms"] == pytest.approx(row["chain_ms"] + row["parts_ms"])
    assert row["bp_over_parts"] == pytest.approx(row["bp_backward_ms"] / row["parts_sum_ms"])
    assert row["bp_hlo_backward"]["unknown_loops"] == 0
    assert row["bp_page_faults"] >= 0
    assert payload["complete"] and payload["h_sweep"] == []


def test_a_dry_run_measures_the_three_quantities_of_every_gradient(tmp_path):
    out = tmp_path / "speed.json"
    speed.main(
        ["--dry-run", "--cells", "gru", "--batches", "--methods", "blelloch", "--out", str(out)]
    )
    payload = json.loads(out.read_text())
    assert payload["backward"] == "pullback" and payload["complete"]
    assert [row["length"] for row in payload["t_sweep"]] == speed.DRY_RUN["lengths"]
    for row in payload["t_sweep"]:
        assert row["backward"] == "pullback" and row["status"] == "ok"
        for quantity in QUANTITIES:
            assert row[f"bp_{quantity}_ms"] > 0
            assert row["methods"]["blelloch"][f"{quantity}_ms"] > 0


def test_no_time_is_a_difference_of_two_programs():
    config = speed.Config("t_sweep", "gru", 5, 2, 2)
    methods = {name: speed.parse_method(name) for name in ("auto", "blelloch")}
    row = speed.measure(config, methods, 1, clock=OddClock())
    assert row["status"] == "ok", row["error"]
    entries = [{f"{q}_ms": row[f"bp_{q}_ms"] for q in QUANTITIES}, *row["methods"].values()]
    for entry in entries:
        assert all(odd_seconds(entry[f"{q}_ms"]) for q in QUANTITIES), entry
        # total - forward, forward + backward: even, so never a quantity reported.
        assert not odd_seconds(entry["total_ms"] - entry["forward_ms"])
    assert odd_seconds(row["standalone_forward_ms"]) and odd_seconds(row["chain_ms"])
    for method in row["methods"].values():
        assert method["backward_speedup"] == row["bp_backward_ms"] / method["backward_ms"]
        assert method["overall_speedup"] == row["bp_total_ms"] / method["total_ms"]


def test_the_profile_is_fitted_to_a_speed_run(tmp_path, capsys):
    from benchmarks.tools import fit_profile

    out = tmp_path / "speed.json"
    grid = ["--cells", "rnn", "gru", "--lengths", "5", "--t-batch", "2", "--batches"]
    speed.main([*grid, "--methods", "auto", "blelloch", "--repeats", "1", "--out", str(out)])
    fitted = tmp_path / "profile.json"
    # Every backward is measured as its own program, so the fit takes every one of them.
    measured = fit_profile.samples(json.loads(out.read_text()))
    assert len(measured) == 2 * 3  # cells x (BP and two methods)
    fit_profile.main([str(out), "--out", str(fitted)])
    payload = json.loads(fitted.read_text())
    assert [r["label"] for r in payload["rows"]] == [label for label, _, _ in measured]
    assert all(seconds > 0 for _, _, seconds in measured)
    assert all(r["ratio"] > 0 and math.isfinite(r["ratio"]) for r in payload["rows"])
    assert payload["profile"]["step_latency"] > 0
    assert "measured/model" in capsys.readouterr().out


def test_quick_grids_are_the_readmes():
    configs = speed.plan(speed.parse_args(["--quick"]))
    assert [c.length for c in configs if c.sweep == "t_sweep"] == speed.QUICK_T * 2
    assert [c.batch for c in configs if c.sweep == "b_sweep"] == speed.QUICK_B * 2
    assert not [c for c in configs if c.sweep == "h_sweep"]


def test_resume_keeps_the_rows_written_and_measures_the_rest(tmp_path):
    out = tmp_path / "speed.json"
    grid = ["--cells", "rnn", "--lengths", "3", "5", "--t-batch", "2", "--batches", "--hidden", "2"]
    unfinished = speed.empty_row(speed.Config("t_sweep", "rnn", 5, 2, 2), ["blelloch"])
    unfinished.update(status="unfinished", error=speed.UNFINISHED)
    # A row of the older layout (its backward the gradient minus a forward) is measured again.
    older = speed.empty_row(speed.Config("t_sweep", "rnn", 3, 2, 2), ["blelloch"])
    del older["backward"]
    older["seconds"] = -1.0
    out.write_text(json.dumps(dict(attempts=1, t_sweep=[older, unfinished])))
    speed.main([*grid, "--methods", "blelloch", "--repeats", "1", "--resume", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["attempts"] == 2 and payload["complete"]
    assert [(r["length"], r["status"]) for r in payload["t_sweep"]] == [
        (3, "ok"),
        (5, "unfinished"),
    ]
    assert payload["t_sweep"][0]["backward"] == "pullback"
    assert payload["t_sweep"][0]["seconds"] > 0


@pytest.mark.parametrize(
    "flag",
    ["--hidden", "--repeats", "--t-batch", "--b-length", "--h-length", "--row-seconds"],
)
def test_bad_sizes_are_refused_before_any_work(flag, capsys):
    with pytest.raises(SystemExit):
        speed.main([flag, "0"])
    assert flag in capsys.readouterr().err


def test_unknown_methods_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        speed.main(["--methods", "no-such-method"])
    assert "no-such-method" in capsys.readouterr().err


@pytest.mark.parametrize("cell", ["rnn", "gru"])
@pytest.mark.parametrize("block", [3, 7, 20])
def test_the_parts_are_the_steps_vjp_over_blocks(cell, block):
    import jax
    import jax.numpy as jnp

    from benchmarks import _speed_model

    fn, (params, carries, xs, cts) = _speed_model.parts(speed.CELLS[cell], 7, 2, 3, block)
    steps = jax.vmap(jax.vmap(speed.CELLS[cell], in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    expected = jax.grad(lambda p: jnp.sum(cts * steps(p, carries, xs)))(params)
    got = fn(params, carries, xs, cts)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_profile_fit_refuses_a_run_without_a_positive_backward(tmp_path, capsys):
    from benchmarks.tools import fit_profile

    out = tmp_path / "speed.json"
    grid = ["--cells", "rnn", "--lengths", "5", "--t-batch", "2", "--batches"]
    speed.main([*grid, "--methods", "blelloch", "--repeats", "1", "--out", str(out)])
    payload = json.loads(out.read_text())
    for row in payload["t_sweep"]:  # as a busy machine can leave them: all inside the noise
        row["bp_backward_ms"] = -0.01
        for method in row["methods"].values():
            method["backward_ms"] = -0.01
    out.write_text(json.dumps(payload))
    assert fit_profile.samples(payload) == []
    with pytest.raises(SystemExit):
        fit_profile.main([str(out), "--out", str(tmp_path / "profile.json")])
    assert "no row with an HLO count and a measured backward" in capsys.readouterr().err
