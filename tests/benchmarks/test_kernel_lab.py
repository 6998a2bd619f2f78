"""The kernel lab's reading of compiler output, its model, its envelope and its committed
results; the real compile runs in ``make kernels`` (the ``triton`` wheel), not here."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib

import pytest

import bppsa
from benchmarks.kernel_lab import __main__ as cli
from benchmarks.kernel_lab import capture, envelope, lab, model, report, sass
from bppsa.scan._profile import SM90_PROGRAMS, built_in

DATA = pathlib.Path(__file__).parent / "kernel_lab_data"
RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "kernel_lab"


def listing(name: str) -> str:
    with gzip.open(DATA / f"{name}.sass.gz", "rt") as f:
        return f.read()


def log(name: str) -> str:
    return (DATA / f"{name}.log").read_text()


# ---- reading ptxas's log and the SASS -------------------------------------------------------


def test_resources_read_registers_spills_and_stack():
    clean = sass.resources(log("rnn-h20-forward-b.sm90.w4"))
    assert (clean.registers, clean.spill_stores, clean.spill_loads, clean.spills) == (
        40,
        0,
        0,
        False,
    )
    spilling = sass.resources(log("lstm-h128-forward-b.sm90.w4"))
    assert spilling.registers == 168
    assert (spilling.spill_stores, spilling.spill_loads, spilling.stack) == (1624, 1624, 1640)
    assert spilling.spills


def test_resources_refuse_a_log_without_one_kernel():
    with pytest.raises(ValueError, match="Used N registers"):
        sass.resources("ptxas info    : 0 bytes gmem\n")


def test_the_time_loop_of_the_rnn_forward():
    """The RNN H = 20 forward at 4 warps (sm_90a): the step's instructions, counted by hand
    from the committed listing (one load of the step's residuals, one store of the carry,
    layout conversions through shared memory, the butterfly reductions, tanh's exp2/rcp)."""
    code = sass.instructions(listing("rnn-h20-forward-b.sm90.w4"))
    loop = sass.time_loop(code)
    assert loop[-1].base == "BRA" and loop[-1].predicated
    assert loop[0].address < loop[-1].address
    counts = sass.mix(loop)
    assert counts["global_loads"] == 1 and counts["global_stores"] == 1
    assert counts["barriers"] == 6
    assert counts["shuffles"] == 16
    assert counts["special_functions"] == 8
    assert counts["local_loads"] == 0
    assert counts["total"] == len(loop) == 152


def test_control_words_decode_stalls_and_scoreboards():
    """A load sets a scoreboard and the instruction that reads its result waits on it."""
    code = sass.instructions(listing("rnn-h20-forward-b.sm90.w4"))
    loads = [ins for ins in code if ins.base in ("LDG", "LDS")]
    assert loads and all(ins.write != sass.NO_SCOREBOARD for ins in loads)
    waited = {s for ins in code for s in ins.wait}
    assert {ins.write for ins in loads} <= waited
    assert all(0 <= ins.stall <= 15 for ins in code)


def test_the_time_loop_is_the_loop_with_the_step_s_arithmetic():
    """A loop that only stores (LLVM's loop over lanes known to be zero) is wider than the
    time loop here, but it is not the step's."""
    code = sass.instructions(listing("rnn-h20-forward-b.sm90.w4"))
    (loop,) = sass.loops(code)
    stores = [
        dataclasses.replace(op("STG.E"), address=loop[-1].address + 16 * (i + 1))
        for i in range(len(loop) + 5)
    ]
    branch = dataclasses.replace(
        op("BRA"), address=stores[-1].address + 16, operands=hex(stores[0].address)
    )
    found = sass.loops([*code, *stores, branch])
    assert len(found) == 2 and len(found[1]) > len(loop)
    assert sass.time_loop([*code, *stores, branch]) == loop


def counted_loop(count: str, compare: str) -> list[sass.Instruction]:
    """A time loop of one FFMA whose 64-bit counter steps by ``IADD3 count`` and is compared
    by ``ISETP.NE.U32.AND compare`` before the branch back."""
    loop = [
        op("FFMA", stall=4),
        dataclasses.replace(op("IADD3", stall=2), operands=count),
        dataclasses.replace(op("ISETP.NE.U32.AND"), operands=compare),
        op("BRA", stall=5),
    ]
    return [dataclasses.replace(ins, address=16 * (i + 1)) for i, ins in enumerate(loop)]


def test_an_unrolled_time_loop_counts_its_steps():
    """LLVM unrolled this loop 14 times (1000 = 71 x 14 + 6): its 64-bit counter starts at
    -994 (before the loop) and steps by 14 up to zero; the estimate of a step divides the
    iteration's cycles by 14. A counter of bytes compared with a bound (the committed RNN
    loop: 32 bytes a step up to 32000) is one step an iteration."""
    start = dataclasses.replace(op("IMAD.MOV.U32"), operands="R5, RZ, RZ, -0x3e2")
    loop = counted_loop("R5, P0, R5, 0xe, RZ", "P0, PT, R5, RZ, PT")
    assert sass.steps_per_iteration(loop, [start, *loop], 1000) == 14
    assert model.step_cycles(loop, 14) == pytest.approx(model.iteration_cycles(loop) / 14)
    assert sass.steps_per_iteration(loop[:1] + loop[3:], [start, *loop], 1000) == 1
    code = sass.instructions(listing("rnn-h20-forward-b.sm90.w4"))
    assert sass.steps_per_iteration(sass.time_loop(code), code, 1000) == 1


def test_a_counter_counting_down_needs_its_start():
    """A reversed loop's byte offset counts down, 128 bytes a step, to one step below zero:
    its bound alone does not give the span (read as one, it made 1000 steps an iteration and
    a step of 0.0001 us). Where the start (999 steps' bytes) is read, 1000 iterations of one
    step; where it is not (the compiler may set it with a half-precision trick), 1."""
    start = dataclasses.replace(op("MOV"), operands="R42, 0x1f380")
    loop = counted_loop("R42, P2, R42, -0x80, RZ", "P0, PT, R42, -0x80, PT")
    assert sass.steps_per_iteration(loop, [start, *loop], 1000) == 1
    assert sass.steps_per_iteration(loop, loop, 1000) == 1
    unrolled = counted_loop("R42, P2, R42, -0x400, RZ", "P0, PT, R42, -0x80, PT")
    assert sass.steps_per_iteration(unrolled, [start, *unrolled], 1000) == 8


def test_instructions_refuse_an_empty_listing():
    with pytest.raises(ValueError, match="no SASS"):
        sass.instructions("Fatbin elf code:\n")


def test_time_loop_refuses_code_without_a_loop():
    code = sass.instructions(listing("rnn-h20-forward-b.sm90.w4"))
    straight = [ins for ins in code if ins.base != "BRA"]
    with pytest.raises(ValueError, match="no backward branch"):
        sass.time_loop(straight)


# ---- the latency model ------------------------------------------------------------------------


def op(opcode, stall=1, write=7, read=7, wait=()):
    return sass.Instruction(0, opcode, "", False, stall, write, read, frozenset(wait))


def test_the_model_waits_for_a_load_used_in_its_own_step():
    """A load whose result the same step uses: the step is the load's latency plus the
    stalls around it."""
    loop = [op("LDG.E", write=0), op("FFMA", stall=4, wait=[0]), op("BRA", stall=5)]
    cycles = model.iteration_cycles(loop)
    assert cycles == model.LATENCY["LDG"] + 4 + 5


def test_the_model_hides_a_load_issued_a_step_ahead():
    """The same load used by the next step (issued after the use): a step lasts the cycles from
    the use to the load's issue plus its latency where that is longer than the step's own work,
    else the step's work."""
    ahead = [op("FFMA", stall=4, wait=[0]), op("LDG.E", write=0), op("BRA", stall=5)]
    assert model.iteration_cycles(ahead) == 4 + model.LATENCY["LDG"]
    short = model.Constants(latency={**model.LATENCY, "LDG": 3})
    assert model.iteration_cycles(ahead, short) == 4 + 1 + 5


def test_the_model_counts_barriers_and_stalls():
    loop = [op("FADD", stall=2), op("BAR.SYNC.DEFER_BLOCKING", stall=6), op("BRA", stall=5)]
    assert model.iteration_cycles(loop) == 2 + model.BARRIER + 6 + 5


def test_the_rnn_forward_estimate_is_the_schedule_s():
    loop = sass.time_loop(sass.instructions(listing("rnn-h20-forward-b.sm90.w4")))
    cycles = model.iteration_cycles(loop)
    stalls = sum(max(ins.stall, 1) for ins in loop)
    assert stalls < cycles < stalls + model.LATENCY["LDG"] + 10 * model.BARRIER
    assert model.step_seconds(loop, 90) == pytest.approx(cycles / 1.98e9)


# ---- the envelope from rows ----------------------------------------------------------------


def row(warps, tile, resident, spill=0, status="compiled"):
    return {
        "arch": 90,
        "num_warps": warps,
        "tile": tile,
        "resident": resident,
        "spill_stores": spill,
        "spill_loads": spill,
        "status": status,
    }


def test_the_envelope_stops_below_the_smallest_spilling_kernel():
    rows = [
        row(1, 1024, 1100),
        row(1, 4096, 4300),
        row(1, 4096, 12000, spill=8),
        row(1, 16384, 20000),  # spill-free, but beyond a spilling one: not admitted
        row(4, 4096, 12000),
        row(4, 16384, 16640),
        row(4, 16384, 49000, status="too large"),
        row(8, 16384, 16640),  # no more than 4 warps hold: not listed
    ]
    assert envelope.programs(rows, 90) == [(1, 4096, 4300), (4, 16384, 16640)]
    listed = envelope.programs(rows, 90)
    assert envelope.admitted(row(0, 1024, 4000), listed) == (1, 4096, 4300)
    assert envelope.admitted(row(0, 1024, 5000), listed) == (4, 16384, 16640)
    assert envelope.admitted(row(0, 1024, 17000), listed) is None


def test_a_program_s_step_is_the_slowest_of_the_kernels_it_launches():
    listed = [(1, 4096, 4300), (4, 16384, 16640)]
    rows = [
        {**row(1, 1024, 1100), "step_us": 0.2},
        {**row(1, 4096, 4300), "step_us": 0.3},
        {**row(4, 4096, 4300), "step_us": 9.0},  # launched at 1 warp, not 4
        {**row(4, 16384, 16640), "step_us": 0.5},
        {**row(4, 16384, 20000), "step_us": 7.0},  # refused
    ]
    assert envelope.step_estimates(rows, listed, 90) == pytest.approx({1: 0.3e-6, 4: 0.5e-6})


def test_a_program_whose_smallest_kernel_spills_is_not_listed():
    rows = [row(1, 1024, 1100, spill=4), row(2, 1024, 1100)]
    assert envelope.programs(rows, 90) == [(2, 1024, 1100)]


# ---- the committed results -------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    rows = lab.read_rows(str(RESULTS / "kernels.jsonl"))
    assert rows, f"no committed rows in {RESULTS}"
    return rows


def test_the_profile_s_programs_are_the_lab_s(results):
    derived = envelope.programs(results, 90)
    assert [(p.num_warps, p.max_tile, p.max_resident) for p in SM90_PROGRAMS] == derived
    assert built_in("cuda").kernels.fused_programs == SM90_PROGRAMS


def test_the_profile_s_step_estimates_are_the_lab_s(results):
    """Each program's ``step_latency`` is the slowest estimate of the lab's kernels it launches
    (3 significant digits)."""
    listed = envelope.programs(results, 90)
    estimates = envelope.step_estimates(results, listed, 90)
    assert {p.num_warps: p.step_latency for p in SM90_PROGRAMS} == pytest.approx(
        estimates, rel=5e-3
    )


def test_no_kernel_the_profile_admits_spills(results):
    assert report.admitted_spills(results) == []


def test_the_rows_cover_every_cell_loop_and_target(results):
    kinds = {(r["cell"], r["loop"], r["arch"]) for r in results}
    assert kinds == {(c, lp, a) for c in capture.CELLS for lp in capture.LOOPS for a in lab.ARCHS}
    compiled = [r for r in results if r["status"] == "compiled"]
    assert all(r["mix"]["total"] > 0 and r["step_us"] > 0 for r in compiled)


def test_a_planted_spill_within_the_envelope_is_caught(results):
    """The check that guards CI: a row the profile admits, made to spill, is reported."""
    admitted = [k for k in report.launched(results) if not k["refused"]]
    assert admitted
    planted = dict(admitted[0], spill_stores=8, spill_loads=8)
    assert report.admitted_spills([planted]) == [planted]


def test_the_summary_and_figure_are_redrawn_from_the_rows(results, tmp_path):
    out = tmp_path / "lab"
    out.mkdir()
    (out / "kernels.jsonl").write_text((RESULTS / "kernels.jsonl").read_text())
    assert cli.main(["--out", str(out), "--report-only", "--check"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["admitted_spilling"] == []
    assert summary["profile_programs"] == [list(p) for p in envelope.programs(results, 90)]
    assert (out / "kernels.png").stat().st_size > 10_000


def test_the_cli_refuses_unknown_cells(tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path), "--cells", "no-such-cell", "--report-only"])


# ---- capture (no compiler needed) --------------------------------------------------------


def test_capture_holds_the_kernel_s_triton_ir_and_footprint():
    """The RNN H = 8 forward lowered for CUDA under the abstract H200: one Pallas Triton kernel
    whose TTIR has the step loop, and the footprint the envelope compares (W 8x8 and the
    carry, padded to powers of two, and the residuals' constants)."""
    spec = capture.Spec("rnn", 8, "forward", True)
    captured = capture.capture(spec)
    assert "tt.func" in captured.ttir and "scf.for" in captured.ttir
    assert captured.grid == capture.BATCH
    size = capture.footprint(spec)
    assert size.tile == 64 and size.resident >= 64 + 8
    loop, why_not = capture.planned(spec, built_in("cuda"))
    assert loop.launch.num_warps == SM90_PROGRAMS[0].num_warps
    assert why_not is None


def test_capture_records_a_kernel_the_profile_refuses():
    """Past the envelope (an empty one here) the kernel is still captured, and the reason
    kept."""
    tiny = bppsa.FusedProgram(num_warps=1, max_tile=1, max_resident=1)
    gpu = built_in("cuda")
    profile = dataclasses.replace(
        gpu, kernels=dataclasses.replace(gpu.kernels, fused_programs=(tiny,))
    )
    spec = capture.Spec("rnn", 8, "backward", False)
    captured = capture.capture(spec, profile)
    loop, why_not = capture.planned(spec, profile)
    assert loop is None
    assert "beyond the envelope" in why_not
    assert "scf.for" in captured.ttir
