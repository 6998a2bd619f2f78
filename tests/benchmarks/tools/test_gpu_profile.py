"""The GPU profile against the H200's measurements: Auto()'s picks at the measured rows, the
profile as benchmarks.tools.fit_profile finds it in the committed files, and the device fit's
reading of sound timings (whole gradients, pullbacks timed alone; never total - forward) on
synthetic files whose times a known profile predicts, and the fused envelope checked against a
synthetic compile grid."""

import dataclasses
import json
import pathlib

import pytest

import bppsa
from benchmarks import _fused_compile, _speed_model
from benchmarks.tools import fit_profile, hlo_cost
from bppsa.scan import _profile

H200 = pathlib.Path(__file__).parents[3] / "benchmarks" / "results" / "gpu-h200"
FILES = ["speed_gpu.json", "total_gpu.json", "width_gpu.json", "gpu_backward.jsonl"]
AUTO = bppsa.Auto(profile=_profile.GPU)


def pick(cell, length, batch, hidden):
    fp = _speed_model.footprint(cell, length, batch, hidden)
    return AUTO.scan_method(fp, profile=bppsa.get_profile("gpu"))


@pytest.mark.parametrize(
    ("cell", "length", "batch", "hidden", "fastest"),
    [
        # speed_gpu.json h_sweep, whole gradients: Blelloch 17.9 ms, BP 21.6 ms
        ("rnn", 1000, 1, 1024, bppsa.Blelloch()),
        ("rnn", 1000, 16, 1024, bppsa.Sequential()),  # BP 20.8 ms, Blelloch 202 ms
        ("rnn", 1000, 256, 1024, bppsa.Sequential()),  # BP 47.3 ms, Chunked 2.8 s
        ("rnn", 1000, 256, 256, bppsa.Sequential()),  # BP 23.6 ms, Chunked 123 ms
        ("rnn", 1000, 1, 256, bppsa.Blelloch()),  # Blelloch 6.0 ms, Chunked 7.3, BP 20.8
        ("rnn", 1000, 256, 64, bppsa.Chunked()),  # Chunked 15.5 ms, Blelloch 16.0, BP 21.1
        ("gru", 1000, 256, 20, bppsa.Blelloch()),  # b_sweep: Blelloch 7.7 ms, Chunked 8.7
        ("rnn", 30, 16, 20, bppsa.Sequential()),  # t_sweep: BP 0.54 ms, Blelloch 0.56
    ],
)
def test_auto_picks_the_fastest_measured_gradient(cell, length, batch, hidden, fastest):
    assert pick(cell, length, batch, hidden) == fastest


@pytest.mark.parametrize("cell", ["rnn", "gru"])
@pytest.mark.parametrize("length", [100, 300, 1000, 3000, 10_000, 30_000])
def test_auto_scans_the_small_cells_from_100_steps(cell, length):
    # speed_gpu.json t_sweep, B = 16, H = 20: Blelloch 2-4.5x faster than BP from T = 100
    # (Chunked 1.6% faster at RNN T = 30,000)
    assert pick(cell, length, 16, 20) == bppsa.Blelloch()


def h200_rows():
    measured = [t for name in FILES for t in fit_profile.timings(H200 / name)]
    return measured, fit_profile.choices(measured)


def test_auto_loses_no_more_than_ten_percent_but_on_short_sequences():
    measured, rows = h200_rows()
    assert len(rows) == 66 and all(t.seconds > 0 for t in measured)
    slow = {r.row: r.loss(r.pick(_profile.GPU)) for r in rows if r.loss(r.pick(_profile.GPU)) > 1.1}
    # The model counts a step of BP as one kernel: no rates make Blelloch win at T = 10-30.
    assert sorted(slow) == [
        "speed_gpu.json gru T=10 B=16 H=20",
        "speed_gpu.json gru T=30 B=16 H=20",
        "speed_gpu.json rnn T=10 B=16 H=20",
    ]


def test_the_gpu_profile_is_the_fit_of_the_h200_files():
    measured, rows = h200_rows()
    gemm = fit_profile.gemm_flops([H200 / name for name in FILES])
    fitted = fit_profile.fit_device(measured, "h200", flops=gemm, rows=rows)
    for field in ("step_latency", "flops", "bandwidth"):
        assert getattr(fitted.rates, field) == pytest.approx(
            getattr(_profile.GPU.rates, field), rel=2e-3
        )
    # The best time fit alone ranks BP first where Blelloch's gradient was 1.2x faster.
    plain = fit_profile.fit_device(measured, "plain")
    h1024 = next(r for r in rows if r.row == "speed_gpu.json rnn T=1000 B=1 H=1024")
    assert h1024.fastest() == bppsa.Blelloch() and h1024.pick(plain) == bppsa.Sequential()


TRUE = bppsa.Profile("true", bppsa.Rates(flops=4e14, bandwidth=2e12, step_latency=5e-6))
# (cell, T, B, H): latency-bound, flops-bound and bandwidth-bound scans.
CONFIGS = [
    ("rnn", 1000, 16, 20),
    ("rnn", 100, 1, 4096),
    ("rnn", 1000, 256, 256),
    ("gru", 300, 4, 20),
]
METHODS = {"bp": bppsa.Sequential(), "blelloch": bppsa.Blelloch(), "chunked": bppsa.Chunked()}
COUNT = dict(steps=10, flops=1.0, bytes=1.0, unknown_loops=0)  # an HLO count, never used here


def predicted_ms(config, method, *, whole: bool) -> float:
    footprint = fit_profile.footprint(*config)
    return fit_profile.Timing("", method, footprint, whole, 1.0).cost().seconds(TRUE) * 1e3


def speed_row(config) -> dict:
    """A speed row whose times ``TRUE`` predicts (its backward_ms too)."""
    cell, length, batch, hidden = config
    total = {name: predicted_ms(config, m, whole=True) for name, m in METHODS.items()}
    alone = {name: predicted_ms(config, m, whole=False) for name, m in METHODS.items()}
    methods = {
        name: dict(
            status="ok",
            runs=repr(m),
            total_ms=total[name],
            backward_ms=alone[name],
            hlo_backward=COUNT,
        )
        for name, m in METHODS.items()
        if name != "bp"
    }
    methods["auto"] = dict(methods["blelloch"])  # the method Auto ran, timed once more
    return dict(
        cell=cell,
        length=length,
        batch=batch,
        hidden=hidden,
        status="ok",
        bp_total_ms=total["bp"],
        bp_backward_ms=alone["bp"],
        bp_hlo_backward=COUNT,
        methods=methods,
    )


def speed_payload(*, pullback: bool) -> dict:
    """A device's speed JSON; its backward_ms count as timed alone only where ``pullback``."""
    payload = dict(
        backend="gpu", gemm_gflops=TRUE.rates.flops / 1e9, t_sweep=list(map(speed_row, CONFIGS))
    )
    return dict(payload, backward="pullback") if pullback else payload


def test_a_device_fit_recovers_the_profile_that_predicts_its_times(tmp_path, capsys):
    path = tmp_path / "speed_gpu.json"
    path.write_text(json.dumps(speed_payload(pullback=False)))
    out = tmp_path / "fit.json"
    fit_profile.main(["--device", "--choices", str(path), "--out", str(out)])
    result = json.loads(out.read_text())
    for field in ("step_latency", "flops", "bandwidth"):
        assert result["profile"][field] == pytest.approx(getattr(TRUE.rates, field), rel=0.02)
    # Whole gradients only: total - forward is never read, and every pick is the fastest.
    assert all(r["label"].endswith("gradient") for r in result["rows"])
    assert len(result["rows"]) == 3 * len(CONFIGS)
    assert [c["loss"] for c in result["choices"]] == [1.0] * len(CONFIGS)
    assert "measured/model" in capsys.readouterr().out


def test_a_device_backward_counts_only_where_it_was_timed_alone(tmp_path):
    plain, marked = speed_payload(pullback=False), speed_payload(pullback=True)
    assert fit_profile.samples(plain) == []  # the CPU fit refuses a device's differences
    assert len(fit_profile.samples(marked)) == 4 * len(CONFIGS)  # BP, Auto and the methods
    (tmp_path / "marked.json").write_text(json.dumps(marked))
    measured = fit_profile.timings(tmp_path / "marked.json")
    assert sum(not t.whole for t in measured) == 3 * len(CONFIGS)
    gemm = fit_profile.gemm_flops([tmp_path / "marked.json"])
    fitted = fit_profile.fit_device(measured, "x", flops=gemm)
    assert fitted.rates.flops == pytest.approx(TRUE.rates.flops)
    assert fitted.rates.step_latency == pytest.approx(TRUE.rates.step_latency, rel=0.02)


def test_a_pullback_slower_than_its_whole_gradient_is_left_out(tmp_path):
    row = dict(cell="rnn", H=20, T=1000, B=1)
    for prefix, vg in (("bp", 20.0), ("bppsa", 5.0)):
        row.update({f"{prefix}_vg_min_ms": vg, f"{prefix}_vg_med_ms": vg})
    row.update(bp_bwd_min_ms=25.0, bp_bwd_med_ms=26.0, bppsa_bwd_min_ms=0.4, bppsa_bwd_med_ms=0.5)
    path = tmp_path / "gpu_backward.jsonl"
    path.write_text(json.dumps(row) + "\n")
    measured = fit_profile.timings(path)
    alone = [(t.method, t.seconds) for t in measured if not t.whole]
    assert alone == [(bppsa.Blelloch(), pytest.approx(0.5e-3))]  # BP's 26 ms is an artefact
    assert {t.method for t in measured if t.whole} == {bppsa.Sequential(), bppsa.Blelloch()}


def test_the_device_fit_refuses_a_run_without_sound_timings(tmp_path, capsys):
    path = tmp_path / "speed_gpu.json"
    path.write_text(json.dumps(dict(backend="gpu", t_sweep=[])))
    with pytest.raises(SystemExit):
        fit_profile.main(["--device", str(path)])
    assert "no whole gradient" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(rows=[dict(cell="rnn")])))
    with pytest.raises(ValueError, match="not a speed"):
        fit_profile.timings(other)


def compile_point(cell, hidden, status, tile, resident, **more):
    return dict(part="compile", cell=cell, hidden=hidden, status=status, compile_s=1.0,
                tile=tile, resident=resident, **more)  # fmt: skip


def compile_file(tmp_path, points):
    """A compile grid's results file, its summary row last (as ``benchmarks.fused`` writes it)."""
    path = tmp_path / "fused_compile_gpu.jsonl"
    rows = [*points, _fused_compile.summary(points)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# An envelope of one program (4096 entries a tile, 8192 resident): the RNN compiled up to
# H = 64 and failed beyond it at 128; the GRU compiled at H = 32 and at 48 beyond the envelope
# (room to grow), and failed beyond it at 64; the LSTM's row has no counts and its profile
# refused it.
ENVELOPE = (bppsa.FusedProgram(num_warps=1, max_tile=4096, max_resident=8192),)
POINTS = [
    compile_point("rnn", 16, "compiled", 256, 300),
    compile_point("rnn", 64, "compiled", 4096, 4200),
    compile_point("rnn", 128, "failed", 16384, 16500),
    compile_point("gru", 32, "compiled", 1024, 3200),
    compile_point("gru", 48, "compiled", 4096, 9000),
    compile_point("gru", 64, "failed", 4096, 12500),
    compile_point("lstm", 16, "not fused", None, None, library_why_not="beyond"),
]


@pytest.fixture
def small_envelope():
    """The built-in GPU profile with :data:`ENVELOPE` (for ``fit_profile.main``)."""
    kernels = dataclasses.replace(_profile.GPU.kernels, fused_programs=ENVELOPE)
    bppsa.set_profile("gpu", dataclasses.replace(_profile.GPU, kernels=kernels))
    yield dataclasses.replace(_profile.GPU, kernels=kernels)
    bppsa.set_profile("gpu", None)


def test_the_envelope_check_reads_every_admitted_point_of_the_compile_grid(
    tmp_path, capsys, small_envelope
):
    path = compile_file(tmp_path, POINTS)
    check = fit_profile.envelope_check(path, small_envelope)
    assert [label.split(" (")[0] for label in check.verified] == [
        "rnn H = 16 compiled", "rnn H = 64 compiled", "gru H = 32 compiled"
    ]  # fmt: skip
    assert check.failed == [] and check.unverified == []
    assert check.beyond == ["gru H = 48 compiled (tile 4096, resident 9000)"]
    # The built-in envelope admits the RNN at 128 and the GRU at 64, which failed: the check
    # says so.
    wide = fit_profile.envelope_check(path, _profile.GPU)
    assert [label.split(" (")[0] for label in wide.failed] == [
        "rnn H = 128 failed", "gru H = 64 failed"
    ]  # fmt: skip
    speed = tmp_path / "speed_gpu.json"
    speed.write_text(json.dumps(speed_payload(pullback=False)))
    out = tmp_path / "fit.json"
    fit_profile.main(["--device", str(speed), "--compile", str(path), "--out", str(out)])
    written = json.loads(out.read_text())["envelope_check"]
    assert len(written["verified"]) == 3 and written["failed"] == []
    assert "3 admitted point(s) compiled and ran right, 0 failed" in capsys.readouterr().out


def test_an_admitted_point_that_failed_fails_the_check(tmp_path, capsys, small_envelope):
    inside = compile_point("lstm", 20, "ran wrong", 1024, 4000)  # within both limits
    skipped = compile_point("lstm", 32, "skipped", None, None, library_why_not=None)
    path = compile_file(tmp_path, [*POINTS, inside, skipped])
    check = fit_profile.envelope_check(path, small_envelope)
    assert check.failed == ["lstm H = 20 ran wrong (tile 1024, resident 4000)"]
    assert check.unverified == ["lstm H = 32 skipped"]
    speed = tmp_path / "speed_gpu.json"
    speed.write_text(json.dumps(speed_payload(pullback=False)))
    with pytest.raises(SystemExit) as exited:
        fit_profile.main(["--device", str(speed), "--compile", str(path)])
    assert exited.value.code == 1
    assert "admitted, lstm H = 20 ran wrong" in capsys.readouterr().out
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"part": "forward"}) + "\n")
    with pytest.raises(ValueError, match="no point of the compile grid"):
        fit_profile.envelope_check(empty, small_envelope)
    with pytest.raises(SystemExit):
        fit_profile.main([str(path), "--compile", str(path)])  # a device's, not the CPU's


def forward_point(cell, hidden, length, fused_ms, why_not=None):
    return dict(part="forward", cell=cell, hidden=hidden, length=length, batch=16, inputs=1,
                fused_ms=fused_ms, fused_why_not=why_not)  # fmt: skip


def test_the_fused_step_latency_is_what_the_forward_rows_measured(tmp_path, capsys):
    """Set from the forward rows of the dense cells where the kernel ran, the model's fused
    forward gives back their median time; the diagonal GRU, a fallback and the LSTM (no
    footprint) do not count."""
    rows = [
        forward_point("rnn", 20, 10_000, 9.0),
        forward_point("gru", 20, 10_000, 12.0),  # the median of three
        forward_point("rnn", 20, 30_000, 45.0),
        forward_point("gru", 20, 30_000, 1.0, why_not="the envelope"),
        forward_point("diagonal-gru", 1024, 4096, 0.01),
        forward_point("lstm", 20, 10_000, 0.01),
    ]
    path = tmp_path / "fused_forward_gpu.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    latency = fit_profile.fused_latency(path, _profile.GPU)
    fitted = fit_profile.with_fused_latency(_profile.GPU, latency)
    fp = fit_profile.footprint("gru", 10_000, 16, 20)
    assert bppsa.scan._core.cost.fused_forward(fp, fitted) == pytest.approx(12.0e-3)
    assert 1.1e-6 < latency < 1.2e-6  # 12 ms over 10k steps, less a little arithmetic
    assert fitted.rates.step_latency == _profile.GPU.rates.step_latency
    speed = tmp_path / "speed_gpu.json"
    speed.write_text(json.dumps(speed_payload(pullback=False)))
    out = tmp_path / "fit.json"
    fit_profile.main(["--device", str(speed), "--fused", str(path), "--out", str(out)])
    result = json.loads(out.read_text())["profile"]  # its arithmetic on the fitted rates
    names = ("flops", "bandwidth", "step_latency", "fused_step_latency")
    written = dataclasses.replace(_profile.GPU, rates=bppsa.Rates(**{k: result[k] for k in names}))
    assert bppsa.scan._core.cost.fused_forward(fp, written) == pytest.approx(12.0e-3)
    assert "fused_step_latency=" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no forward row of a dense cell"):
        fit_profile.fused_latency(compile_file(tmp_path, POINTS), _profile.GPU)


def test_a_device_fit_keeps_the_fused_step_latency():
    fitted = hlo_cost.with_rates(_profile.GPU, "fit", (2e-6, 1e14, 1e12))
    assert fitted.rates.fused_step_latency == _profile.GPU.rates.fused_step_latency
    assert fitted.rates.step_latency == 2e-6
