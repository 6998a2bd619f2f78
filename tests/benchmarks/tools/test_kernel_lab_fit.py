"""``fit_profile --kernel-lab``: the kernel lab's model fitted to synthetic device rows of
``benchmarks.fused --parts lab``: a scale factor from (estimate, measured) pairs, and the model's
constants from the time loops of the committed SASS listings (tests/benchmarks/kernel_lab_data),
whose measured steps a known set of constants predicts."""

import argparse
import gzip
import json
import pathlib

import pytest

from benchmarks import _fused_lab
from benchmarks.kernel_lab import model, sass
from benchmarks.tools import fit_kernel_lab, fit_profile

DATA = pathlib.Path(__file__).parents[1] / "kernel_lab_data"


def device_row(kernel, measured, estimates=None, warps=(1, 4)):
    """A device row of part ``lab``: ``measured[variant]`` us a step (``None``: refused)."""
    cell, hidden, loop, _ = fit_kernel_lab.parse_kernel(kernel)
    row = {"part": "lab", "cell": cell, "hidden": hidden, "loop": loop, "kernel": kernel,
           "status": "ok"}  # fmt: skip
    for name, (num_warps, prefetch) in _fused_lab.VARIANTS.items():
        us = measured.get(name)
        row[f"{name}_num_warps"] = warps[0] if num_warps == "auto" else warps[1]
        row[f"{name}_prefetch"] = prefetch
        row[f"{name}_why_not"] = None if us is not None else "beyond the envelope"
        row[f"{name}_measured_us_per_step"] = us
        row[f"{name}_estimate_us"] = (estimates or {}).get(name)
    return row


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lab_row(kernel, warps, step_us, **more):
    return {"kernel": kernel, "arch": 90, "num_warps": warps, "step_us": step_us, **more}


def test_a_few_pairs_fit_one_scale_and_print_before_and_after(tmp_path, capsys):
    # The lab's estimates (from its file, or in the row) are 2.5x short of the measured steps,
    # within +-10%: the scale is their geometric mean.
    lab = [lab_row("rnn-h20-forward-b", 1, 0.2), lab_row("rnn-h20-forward-b", 4, 0.4),
           lab_row("gru-h20-forward-b", 1, 0.3),
           lab_row("rnn-h20-forward-b", 1, 0.25, prefetch=False)]  # fmt: skip
    rows = [
        device_row("rnn-h20-forward-b", {"auto": 0.55, "w4": 1.1, "auto_no_prefetch": 0.625}),
        device_row("gru-h20-forward-b", {"auto": 0.75 * 1.1, "w4": 2.0}),  # w4: no estimate
        device_row("gru-h20-backward-b", {"auto": 9.0}, estimates={"auto": 9.0 / 2.5 / 0.9}),
    ]
    device = write(tmp_path / "fused_lab_gpu.jsonl", rows)
    found = fit_kernel_lab.pairs(rows, lab)
    assert [(p.kernel, p.num_warps, p.prefetch, p.estimate_us) for p in found] == [
        ("gru-h20-backward-b", 1, True, pytest.approx(4.0)),
        ("gru-h20-forward-b", 1, True, 0.3),
        ("gru-h20-forward-b", 4, True, None),
        ("rnn-h20-forward-b", 1, False, 0.25),
        ("rnn-h20-forward-b", 1, True, 0.2),
        ("rnn-h20-forward-b", 4, True, 0.4),
    ]
    assert fit_kernel_lab.fit_scale(found) == pytest.approx(2.5, rel=0.05)
    out = tmp_path / "fit.json"
    lab_path = write(tmp_path / "kernels.jsonl", lab)
    fit_profile.main(["--kernel-lab", str(device), "--lab", str(lab_path), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "kernel lab fit: scale over 6 kernel(s); scale 2.5" in printed
    assert "rnn-h20-forward-b w1" in printed and "measured/estimate   2.75 ->   1.06" in printed
    written = json.loads(out.read_text())
    assert written["fit"] == "scale" and written["scale"] == pytest.approx(2.5, rel=0.05)
    after = {(k["kernel"], k["num_warps"]): k["estimate_after_us"] for k in written["kernels"]}
    assert after[("gru-h20-forward-b", 4)] is None
    assert after[("rnn-h20-forward-b", 4)] == pytest.approx(0.4 * written["scale"])


def test_without_an_estimate_or_a_measured_kernel_it_says_so(tmp_path, capsys):
    rows = [device_row("rnn-h20-forward-b", {"auto": 0.5})]
    with pytest.raises(SystemExit):
        fit_profile.main(["--kernel-lab", str(write(tmp_path / "d.jsonl", rows)),
                          "--lab", str(tmp_path / "missing.jsonl")])  # fmt: skip
    assert "no kernel has the lab's estimate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_profile.main(["--kernel-lab", str(write(tmp_path / "e.jsonl", [{"part": "grad"}]))])
    assert "no fused loop measured on a device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_profile.main(["--kernel-lab", str(tmp_path / "d.jsonl"), str(tmp_path / "d.jsonl"),
                          "--lab", str(tmp_path / "missing.jsonl")])  # fmt: skip


def loops():
    out = {}
    for name in ("rnn-h20-forward-b", "rnn-h20-backward-b"):
        with gzip.open(DATA / f"{name}.sm90.w4.sass.gz", "rt") as f:
            loop = sass.time_loop(sass.instructions(f.read()))
            out[(name, 4, True)] = fit_kernel_lab.TimeLoop(tuple(loop))
    return out


def truth():
    constants = fit_kernel_lab._with(model.Constants(), "global", 520)
    return fit_kernel_lab._with(constants, "barrier", 45)


def test_the_constants_fit_gives_back_the_steps_known_constants_predict():
    found_loops = loops()
    keys = list(found_loops)
    measured = fit_kernel_lab.estimates_us(
        [fit_kernel_lab.Pair(*k, 1.0, None) for k in keys], found_loops, truth()
    )
    found = [fit_kernel_lab.Pair(*k, m, None) for k, m in zip(keys, measured, strict=True)]
    start = fit_kernel_lab.estimates_us(found, found_loops, model.Constants())
    fitted = fit_kernel_lab.fit_constants(found, found_loops)
    after = fit_kernel_lab.estimates_us(found, found_loops, fitted)
    assert fit_kernel_lab.log_error(found, after) < 0.01 * fit_kernel_lab.log_error(found, start)
    for p, estimate in zip(found, after, strict=True):
        assert estimate == pytest.approx(p.measured_us, rel=0.03)
    assert fitted.read == model.Constants().read  # not a fitted constant
    assert set(fit_kernel_lab.used(found_loops)) >= {"global", "barrier"}


def test_refit_moves_the_constants_only_with_enough_kernels():
    # Twelve kernels sharing the two loops (their steps as known constants predict): enough
    # for the six constants the loops use; two are too few, and the scale alone is fitted.
    two = loops()
    many = {(f"rnn-h{h}-{loop}-b", w, True): two[(f"rnn-h20-{loop}-b", 4, True)]
            for h in (20, 64, 128) for loop in ("forward", "backward") for w in (1, 4)}  # fmt: skip
    rows = []
    for (kernel, warps, _), loop in many.items():
        us = 1e6 * model.step_seconds(loop.instructions, 90, constants=truth())
        estimate = 1e6 * model.step_seconds(loop.instructions, 90)
        rows.append(device_row(kernel, {"auto": us}, {"auto": estimate}, warps=(warps, 8)))
    printed = []
    args = argparse.Namespace(refit=True)
    fitted = fit_kernel_lab.report(args, rows, [], lambda keys: many, printed.append)
    assert fitted["fit"] == "constants" and len(fitted["kernels"]) == 12
    for kernel in fitted["kernels"]:
        assert kernel["estimate_after_us"] == pytest.approx(kernel["measured_us"], rel=0.03)
    assert any("measured/estimate" in line for line in printed)
    few = fit_kernel_lab.report(args, rows[:2], [], lambda keys: two | many, printed.append)
    assert few["fit"] == "scale" and "too few, the scale alone" in "\n".join(printed)

    def broken(keys):
        raise ImportError("no triton")

    assert fit_kernel_lab.report(args, rows, [], broken, printed.append)["fit"] == "scale"
    assert "no time loops (ImportError: no triton)" in "\n".join(printed)
