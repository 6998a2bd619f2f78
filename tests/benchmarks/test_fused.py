"""The rows of ``benchmarks/fused.py`` built on this CPU at tiny sizes (the fused kernel in Pallas'
interpreter): their fields, the fused values against ``lax.scan``'s, the cuDNN row up to the
point where cuDNN's LSTM is needed, the compile grid with the envelope lifted, and the real
run's grids as issue 43 asks for them. No timing is asserted beyond "it was measured"."""

import contextlib
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import rnn

import bppsa
from benchmarks import _fused_backends, _fused_compile, _fused_envelope, _fused_lab, fused
from benchmarks._fused_rows import (
    Case,
    cudnn_row,
    final_states,
    forward_row,
    grad_row,
    lstm_params,
    problem,
)
from benchmarks.kernel_lab import capture
from paper_figures.result_files import JsonLines

# float32: the kernel sums its products in another order than XLA's dot (<= 2e-7 measured over
# 9 steps, tests/core/test_fused_forward.py); 1e-5 leaves a margin while a wrong gate or a
# leaked padded lane (errors ~1e-1) fails. Gradients: bppsa's backward against BP's, the same.
RTOL = 1e-5


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


@contextlib.contextmanager
def envelope(**limits):
    """Inside the block, the default backend's profile has one fused program, its largest with
    ``limits`` (``max_tile``, ``max_resident``)."""
    backend = jax.default_backend()
    profile = bppsa.get_profile(backend)
    program = dataclasses.replace(profile.kernels.fused_programs[-1], **limits)
    kernels = dataclasses.replace(profile.kernels, fused_programs=(program,))
    bppsa.set_profile(backend, dataclasses.replace(profile, kernels=kernels))
    try:
        yield
    finally:
        bppsa.set_profile(backend, None)


@pytest.mark.parametrize(("cell", "hidden", "inputs"), [("rnn", 20, 1), ("lstm", 20, 3),
                                                         ("diagonal-gru", 8, 4)])  # fmt: skip
def test_a_forward_row_times_each_forward_and_the_fused_values_agree(cell, hidden, inputs):
    row = forward_row(Case(cell, hidden, 9, 2, inputs), rounds=1)
    assert (row["part"], row["cell"], row["hidden"], row["length"]) == ("forward", cell, hidden, 9)
    assert row["device_kind"] and row["platform"] == jax.default_backend()
    assert row["fused_why_not"] is None and row["fused_forward"] == "Fused()"
    assert row["fused_difference"] <= RTOL
    for name in ("lax_scan", "fused", "default"):
        assert row[f"{name}_ms"] > 0 and row[f"{name}_min_ms"] > 0, name
        assert row[f"{name}_min_us_per_step"] == pytest.approx(1e3 * row[f"{name}_min_ms"] / 9)
        assert row[f"{name}_compile_s"] > 0
    assert row["fused_speedup_min"] == pytest.approx(row["lax_scan_min_ms"] / row["fused_min_ms"])
    assert row["default_forward"] and row["default_method"]
    if jax.default_backend() == "cpu":  # the default forward is lax.scan here: one program
        assert row["default_forward"] == "'sequential'"


def test_a_diagonal_row_times_the_split_lanes_against_one_program():
    row = forward_row(Case("diagonal-gru", 200, 3, 2, 2), rounds=1)
    assert row["fused_why_not"] is None and row["fused_difference"] <= RTOL
    assert "fused_one_program_same_program_as" not in row  # two programs: 2 tiles against 1
    assert row["lanes_speedup_min"] == pytest.approx(
        row["fused_one_program_min_ms"] / row["fused_min_ms"]
    )
    assert "lanes split" in fused.describe(row)


def test_a_forward_row_outside_the_envelope_says_why_and_does_not_time_the_kernel():
    with envelope(max_tile=16):
        row = forward_row(Case("rnn", 20, 5, 2, 1), rounds=1)
    assert "max_tile: 16" in row["fused_why_not"]
    assert row["fused_forward"] == "'sequential'" and row["fused_difference"] is None
    assert row["fused_ms"] is None and row["fused_speedup_min"] is None
    assert row["lax_scan_ms"] > 0 and row["default_ms"] > 0


def test_the_fused_forward_of_a_row_is_the_reference_forward():
    case = Case("gru", 20, 7, 3, 2)
    params, _, xs = problem(case)
    fused_scan = functools.partial(bppsa.scan, forward="fused")
    fused_states = jax.jit(lambda p, x: final_states(fused_scan, case, p, x))(params, xs)
    reference = final_states(jax.lax.scan, case, params, xs)
    assert fused_states.shape == (3, 20)
    assert float(jnp.max(jnp.abs(fused_states - reference))) <= RTOL * float(
        jnp.max(jnp.abs(reference))
    )


def test_a_grad_row_records_each_runs_plan_and_its_difference_from_bp():
    row = grad_row(Case("gru", 20, 7, 2, 1), rounds=1)
    for name in ("bp", "defaults", "fused_blelloch", "fused_sequential"):
        assert row[f"{name}_ms"] > 0 and row[f"{name}_min_ms"] > 0, name
    assert row["fused_blelloch_forward"] == "Fused()"
    assert row["fused_sequential_method"] == "FusedSequential()"
    assert row["fused_sequential_backward_because"] is None  # its kernel ran
    assert row["fused_sequential_difference"] < 1e-5
    assert row["fused_blelloch_method"] == "Blelloch()"
    assert row["defaults_forward"] and row["defaults_method"]
    for name in ("defaults", "fused_blelloch"):
        assert row[f"{name}_difference"] <= RTOL
        assert row[f"{name}_speedup_min"] == pytest.approx(row["bp_min_ms"] / row[f"{name}_min_ms"])


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="cuDNN runs off the CPU")
def test_a_backends_row_times_each_backend_on_the_same_weights_and_restores_the_profile():
    before = bppsa.get_profile()
    row = _fused_backends.backends_row(Case("lstm", 8, 5, 2, 3), rounds=1)
    assert bppsa.get_profile() is before
    assert row["cudnn_status"].startswith("not available: ") and "cudnn_ms" not in row
    for backend in _fused_backends.BACKENDS:
        assert row[f"{backend}_grad_forward"] == f"Fused(backend={backend!r})", row
        assert row[f"{backend}_grad_method"] == f"FusedSequential(backend={backend!r})", row
        assert row[f"{backend}_forward_forward"] == f"Fused(backend={backend!r})", row
        assert row[f"{backend}_grad_difference"] < 1e-5 and row[f"{backend}_grad_ms"] > 0
    ratio = row["mosaic_gpu_grad_ms"] / row["triton_grad_ms"]
    assert row["mosaic_gpu_over_triton"] == pytest.approx(ratio)
    assert "cuDNN" in _fused_backends.describe(row)


def test_a_backends_row_says_why_a_backend_refuses_a_case():
    row = _fused_backends.backends_row(Case("gru", 512, 3, 2, 2), rounds=1)
    assert "shared memory" in row["mosaic_gpu_grad_forward_because"], row
    assert row["mosaic_gpu_grad_difference"] < 1e-5


def test_a_backend_that_fails_costs_its_programs_not_the_row(monkeypatch):
    """A first device run of kernels no device has compiled: where Mosaic GPU's fail, the row
    records how and still times the others."""
    real = _fused_backends.bppsa.FusedSequential

    def failing(*args, backend="auto", **kwargs):
        if backend == "mosaic_gpu":
            raise RuntimeError("ptxas: planted failure")
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(_fused_backends.bppsa, "FusedSequential", failing)
    row = _fused_backends.backends_row(Case("rnn", 8, 3, 2, 2), rounds=1)
    assert row["mosaic_gpu_error"] == "RuntimeError: ptxas: planted failure"
    assert "mosaic_gpu_grad_ms" not in row and "mosaic_gpu_over_triton" not in row
    assert row["triton_grad_ms"] > 0 and row["bp_ms"] > 0
    assert "mosaic_gpu failed (RuntimeError: ptxas: planted failure)" in (
        _fused_backends.describe(row)
    )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="cuDNN runs off the CPU")
def test_a_cudnn_row_without_cudnn_says_so_and_still_times_bppsa():
    row = cudnn_row(Case("lstm", 8, 5, 2, 3), rounds=1)
    assert row["cudnn_status"].startswith("not available: ")
    assert row["bppsa_ms"] > 0 and row["bppsa_forward"] and row["bppsa_method"]
    assert row["cudnn_ms"] is None and row["bppsa_over_cudnn_min"] is None


def test_cudnn_weights_become_the_librarys_lstm_parameters():
    # JAX's own pure-JAX reference of cuDNN's LSTM, on the flat weights, against the library's
    # LSTM on the unpacked ones: the gate order and the layout agree.
    case = Case("lstm", 8, 6, 2, 3)
    _, _, xs = problem(case)
    weights = rnn.init_lstm_weight(jax.random.key(3), case.inputs, case.hidden, 1, False)
    unpacked = rnn.unpack_lstm_weights(weights, case.inputs, case.hidden, 1, False)
    zeros = jnp.zeros((1, case.batch, case.hidden))
    lengths = jnp.full((case.batch,), case.length, jnp.int32)
    _, h, _ = rnn.lstm_ref(xs, zeros, zeros, *unpacked, lengths, case.inputs, case.hidden, 1,
                           0.0, False)  # fmt: skip
    ours = final_states(jax.lax.scan, case, lstm_params(weights, case), xs)
    assert float(jnp.max(jnp.abs(ours - h[0]))) <= RTOL


def test_the_compile_grid_lifts_the_envelope_and_counts_it():
    row = _fused_compile.compile_row(Case("gru", 20, 5, 2, 2))
    assert row["status"] == "compiled" and row["envelope_lifted"]
    assert row["library_why_not"] is None and row["why_not"] is None
    assert row["compile_s"] > 0 and row["difference"] <= RTOL
    # W_hh's three gate blocks: (32, 32) products after padding, three of them kept loaded.
    assert row["tile"] == 32 * 32 and row["resident"] >= 3 * 32 * 32
    assert row["library_envelope"] == _fused_envelope.limits() and row["num_warps"] == 1
    with envelope(max_resident=row["resident"] - 1):
        outside = _fused_compile.compile_row(Case("gru", 20, 5, 2, 2))
        assert bppsa.get_profile().kernels.fused_max_resident == row["resident"] - 1  # restored
    assert "max_resident" in outside["library_why_not"] and outside["num_warps"] is None
    assert outside["status"] == "compiled" and outside["why_not"] is None  # lifted
    (program,) = outside["library_envelope"]["fused_programs"]
    assert program["max_resident"] == row["resident"] - 1


def test_lifting_keeps_the_smaller_programs_and_unbounds_the_largest():
    small = bppsa.FusedProgram(1, 256, 512)
    large = bppsa.FusedProgram(4, 4096, 8192)
    kernels = dataclasses.replace(bppsa.Kernels(), fused_programs=(small, large))
    lifted = _fused_envelope.unbounded(kernels).fused_programs
    assert lifted[0] == small and lifted[1].num_warps == 4
    assert lifted[1].max_tile == lifted[1].max_resident == _fused_envelope.UNBOUNDED
    listed = [dataclasses.asdict(p) for p in (small, large)]
    assert _fused_envelope.admits(listed, 256, 512) == listed[0]
    assert _fused_envelope.admits(listed, 257, 512) == listed[1]
    assert _fused_envelope.admits(listed, 256, 8193) is None
    with _fused_envelope.prefetching(False) as swapped:
        assert swapped and bppsa.get_profile().kernels.fused_prefetch is False
    assert bppsa.get_profile() is bppsa.get_profile(jax.default_backend())
    assert bppsa.get_profile().kernels.fused_prefetch is True  # restored


def test_the_envelope_module_still_reads_the_library():
    # It reads internals: when they move, this fails loudly (the benchmark falls back).
    limits = _fused_envelope.limits()
    programs = bppsa.get_profile().kernels.fused_programs
    assert limits == {
        "fused_programs": [
            dict(
                num_warps=p.num_warps,
                max_tile=p.max_tile,
                max_resident=p.max_resident,
                step_latency=p.step_latency,
            )
            for p in programs
        ]
    }
    body = lambda h, x: (jnp.tanh(jnp.ones((20, 20)) @ h + x), None)
    assert _fused_envelope.sizes(body, jnp.zeros(20), jnp.ones((4, 20))) == {
        "tile": 32 * 32,
        "resident": 32 * 32 + 32,
        "num_warps": 1,
    }


def _point(cell, hidden, status, compile_s=1.0, tile=1, resident=1, why_not=None):
    return {"part": "compile", "cell": cell, "hidden": hidden, "status": status,
            "compile_s": compile_s, "tile": tile, "resident": resident,
            "library_why_not": why_not}  # fmt: skip


def test_a_cell_stops_at_its_first_failure_and_the_summary_reads_the_largest_compiled():
    rows = [
        {"part": "compile", "cell": "rnn", "hidden": 16, "event": "started"},
        _point("rnn", 16, "compiled", tile=256, resident=300),
        _point("gru", 16, "compiled", compile_s=99.0, tile=256, resident=800),
        _point("rnn", 64, "compiled", tile=4096, resident=4200),
        _point("rnn", 128, "failed", tile=16384, resident=16500, why_not="beyond"),
        _point("gru", 64, "ran wrong", tile=4096, resident=12500),
        _point("lstm", 16, "not fused"),
    ]
    assert _fused_compile.stopped(rows) == {
        "gru": "H = 16 compiled in 99 s",
        "rnn": "H = 128 failed",
    }
    summary = _fused_compile.summary(rows)
    assert summary["cells"]["rnn"]["largest_compiled"]["hidden"] == 64
    assert summary["cells"]["rnn"]["smallest_failed"]["hidden"] == 128
    assert summary["cells"]["lstm"]["largest_compiled"] is None
    assert (summary["largest_tile_compiled"], summary["smallest_tile_failed"]) == (4096, 4096)
    # The check: of the 5 points the profile admits, the GRU at 64 ran wrong (the RNN at 128
    # failed beyond the envelope, as it may).
    assert summary["admitted"] == 5
    assert [(p["cell"], p["hidden"]) for p in summary["admitted_failed"]] == [("gru", 64)]
    assert any(line.startswith("rnn ") for line in _fused_compile.report(rows))


def test_a_rerun_records_the_case_a_crash_ended_and_skips_it(tmp_path):
    log = JsonLines(tmp_path / "fused.jsonl")
    (case,) = fused.plan("cudnn", dry_run=True)
    log.append({"part": "cudnn", **case.fields(), "event": fused.STARTED})
    rows = fused.run_part("cudnn", log, rounds=1, dry_run=True, deadline=None)
    assert [r["status"] for r in rows] == ["crashed"]
    assert fused.run_part("cudnn", log, rounds=1, dry_run=True, deadline=None) == rows
    assert "crashed" in fused.describe(rows[0])


def test_without_the_backend_asked_for_nothing_is_measured(tmp_path, capsys):
    out = tmp_path / "fused.jsonl"
    assert fused.main(["--require-backend", "no-such-backend", "--out", str(out)]) == 2
    assert "needs JAX's 'no-such-backend' backend" in capsys.readouterr().err
    assert not out.exists()


def test_the_real_grids_are_issue_43s():
    forward = fused.plan("forward")
    paper = [c for c in forward if c.cell != "diagonal-gru"]
    assert {(c.cell, c.length) for c in paper} == {
        (cell, t) for cell in ("rnn", "gru", "lstm") for t in (1_000, 10_000, 30_000)
    }
    assert all((c.hidden, c.batch) == (20, 16) for c in paper)
    assert [c.length for c in forward[:3]] == [10_000] * 3  # the target row first
    wide = [(c.hidden, c.length, c.batch) for c in forward if c.cell == "diagonal-gru"]
    assert wide == [(1024, 4096, 8), (4096, 4096, 8)]
    grads = {(c.cell, c.hidden, c.length, c.batch) for c in fused.plan("grad")}
    assert grads == {(c, 20, t, 16) for c in ("rnn", "gru") for t in (10_000, 30_000)}
    cudnn = {(c.cell, c.hidden, c.length, c.batch) for c in fused.plan("cudnn")}
    assert cudnn == {("lstm", h, t, 16) for h in (20, 128) for t in (1_000, 10_000)}
    grid = fused.plan("compile")
    assert {c.cell for c in grid} == {"rnn", "gru", "lstm", "diagonal-gru"}
    assert sorted({c.hidden for c in grid}) == sorted([2**k for k in range(4, 13)] + [20, 100])
    assert [c.hidden for c in grid] == sorted(c.hidden for c in grid)  # smallest first


def test_the_language_models_defaults_pick_the_fused_forward_on_a_gpu(tmp_path):
    from experiments import _char_lm_runs as runs
    from experiments import char_lm
    from experiments._char_lm_fixture import write_fixture

    write_fixture(tmp_path, speeches=50)
    parser = char_lm._parser()
    args = parser.parse_args(["--gpu", "--dry-run", "--length", "256", "--batch", "2",
                              "--eval-batches", "1", "--data", str(tmp_path)])  # fmt: skip
    experiment = runs.make_experiment(char_lm._config(parser, args), runs.load_corpus(tmp_path))
    bppsa.set_profile("cpu", bppsa.get_profile("gpu"))
    try:
        on_gpu = runs.planned_forward(experiment, "bppsa")
    finally:
        bppsa.set_profile("cpu", None)
    assert on_gpu["forward_plan"] == "Fused()", on_gpu
    assert on_gpu["forward_because"].startswith("predicted: the fused kernel")
    here = runs.planned_forward(experiment, "bppsa")
    assert here["forward_plan"] == "'sequential'"  # the CPU's defaults: lax.scan
    assert runs.planned_forward(experiment, "bp")["forward_plan"] == "'sequential'"


def test_the_lab_rows_read_the_labs_estimate_of_the_kernel_launched(tmp_path):
    path = tmp_path / "kernels.jsonl"
    assert _fused_lab.estimate("rnn-h20-forward-b", 1, True, path) is None  # no file
    rows = [
        {"kernel": "rnn-h20-forward-b", "arch": 90, "num_warps": 1, "step_us": 0.2},
        {"kernel": "rnn-h20-forward-b", "arch": 80, "num_warps": 4, "step_us": 0.9},
        {"kernel": "rnn-h20-forward-b", "arch": 90, "num_warps": 4, "step_us": 0.3},
        {"kernel": "rnn-h20-forward-b", "arch": 90, "num_warps": 4, "step_us": 0.5,
         "prefetch": False},
        {"kernel": "rnn-h20-forward-b", "arch": 90, "num_warps": 8, "status": "too large"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = lambda *a: (_fused_lab.estimate(*a, path) or {}).get("step_us")
    assert step("rnn-h20-forward-b", 1, True) == 0.2
    assert step("rnn-h20-forward-b", 4, True) == 0.3
    assert step("rnn-h20-forward-b", 4, False) == 0.5
    assert step("rnn-h20-forward-b", 1, False) is None  # the lab's rows are at prefetch True
    assert step("rnn-h20-forward-b", 8, True) is None  # not compiled
    assert step("rnn-h20-forward-b", None, True) is None  # refused: no warps
    assert step("gru-h20-forward-b", 1, True) is None


def test_the_lab_rows_are_each_library_cells_loops_at_the_labs_sizes():
    cases = fused.plan("lab")
    assert len(cases) == 3 * 6 * 2
    assert [c.hidden for c in cases[:12]] == [20] * 12  # H = 20 first: the lab's targets
    assert {(c.length, c.batch, c.inputs) for c in cases} == {(1000, 16, 8)}
    assert {c.cell for c in cases} == set(capture.CELLS)
    assert {c.loop for c in cases} == {"forward", "backward"}
    assert _fused_lab.kernel_name("lstm", 64, "backward") == "lstm-h64-backward-b"
    assert set(_fused_lab.VARIANTS.values()) == {(w, p) for w in ("auto", 4) for p in (True, False)}
