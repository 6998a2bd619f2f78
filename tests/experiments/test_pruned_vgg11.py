"""Experiment 3 (pruned VGG-11) end to end on tiny settings: the command line's errors, every
command's result files (FLOP counts against an independent count, Jacobians checked against
autodiff, measured backwards, BP and BPPSA re-training in agreement), resume, and the figures."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.models import Chain, Conv2d, Flatten, Linear, MaxPool2d, ReLU, magnitude_prune
from experiments import _vgg_analysis, _vgg_jacobians, _vgg_model, pruned_vgg11
from paper_figures import fig10, table1
from paper_figures.result_files import JsonLines

TINY = ["--input-size", "8", "--width-divisor", "8", "--no-progress"]


def run(*argv):
    return pruned_vgg11.main([str(a) for a in argv])


def points(path):
    return [r for r in JsonLines(path).read() if r.get("kind") == "point"]


def test_help_of_every_command(capsys):
    for command in ([], ["analyze"], ["jacobians"], ["benchmark"], ["retrain"]):
        with pytest.raises(SystemExit) as info:
            run(*command, "--help")
        assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Fig. 10" in out and "Table 1" in out and "--memory-limit-mib" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze", "--sparsity", "1.5"], "argument --sparsity: expected a number in"),
        (["analyze", "--input-size", "12"], "argument --input-size: expected one of"),
        (["analyze", "--width-divisor", "3"], "argument --width-divisor: expected a power"),
        (["analyze", "--levels", "two"], "argument --levels: expected a number of levels"),
        (["analyze", "--quick", "--paper"], "argument --paper: not allowed"),
        (["analyze", "--checkpoint", "{tmp}/none.npz"], "argument --checkpoint: no file"),
        (["analyze", "--scope", "row"], "argument --scope: invalid choice"),
        (["jacobians", "--layers", "softmax"], "argument --layers: invalid choice"),
        (["benchmark", "--batches", "0"], "argument --batches: expected a positive integer"),
        (["benchmark", "--methods", "chunked"], "argument --methods/--method: method 'chunked'"),
        (
            ["benchmark", "--method", "blelloch-x"],
            "argument --methods/--method: method 'blelloch-x'",
        ),
        (["retrain", "--data", "fixture"], "argument --root: --data fixture writes"),
        (["retrain", "--data", "cifar10"], "argument --root: --data cifar10 needs"),
        (["retrain", "--data", "cifar10", "--root", "{tmp}/nowhere"], "argument --data/--root"),
        (["retrain", "--data", "imagenet"], "argument --data: invalid choice"),
        (["retrain", "--batch", "5000"], "argument --batch: batch size 5000 exceeds"),
    ],
)
def test_bad_arguments_fail_before_work(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as info:
        run(*argv, "--out", out)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not out.exists()  # nothing written


# -- analyze (Fig. 10) -------------------------------------------------------------------------


def _structure(layer, params, mask, x) -> np.ndarray:
    """The boolean structure ``(n_in, n_out)`` of a layer's ``J^T``, from ``jax.jacrev``: a conv
    with every kept weight made positive (so no sum cancels), a ReLU's full diagonal and a
    pooling's window slots (the patterns store their zeros: data independent)."""
    n_in = x.size
    if isinstance(layer, Conv2d):
        positive = {"weight": jnp.abs(params["weight"]) + 1.0, "bias": params["bias"]}
        f = lambda v: layer(positive, v.reshape(x.shape), mask).reshape(-1)
        return np.asarray(jax.jacrev(f)(x.reshape(-1))).T != 0
    if isinstance(layer, ReLU):
        return np.eye(n_in, dtype=bool)
    # MaxPool2d on a ramp of distinct values in every window slot: each slot is the max once.
    (kh, kw) = layer.kernel_size
    out = layer.output_shape(x.shape[1:])
    structure = np.zeros((n_in, math.prod(out)), bool)
    c, h, w = x.shape[1:]
    for ch in range(c):
        for oy in range(out[1]):
            for ox in range(out[2]):
                for ky in range(kh):
                    for kx in range(kw):
                        row = ch * h * w + (oy * kh + ky) * w + ox * kw + kx
                        structure[row, ch * out[1] * out[2] + oy * out[2] + ox] = True
    return structure


def test_scan_flops_match_an_independent_count_on_a_tiny_chain():
    """Three layers A1 (conv), A2 (ReLU), A3 (pool). The full modified Blelloch scan over
    [g, A3, A2, A1] forms, by hand: A3 g (up 1, the spine), A1 A2 (up 1, the one pair),
    (A1 A2)(A3 g) (up 2, the spine: g_0) and A2 (A3 g) (down 1: g_1)."""
    chain = Chain([Conv2d(3, 4, 3, padding=1), ReLU(), MaxPool2d(2)])
    params = chain.init(jax.random.key(0))
    masks = magnitude_prune(params, 0.5)
    x = jax.random.normal(jax.random.key(1), (1, 3, 4, 4))
    maps = _vgg_analysis.layer_maps(chain, params, masks, batch=1, input_size=4)
    inputs = [x, chain[0](params[0], x, masks[0])]
    inputs.append(jax.nn.relu(inputs[1]))
    a1, a2, a3 = (
        _structure(layer, p, m, xi).astype(np.int64)
        for layer, p, m, xi in zip(chain, params, masks, inputs)
    )
    nnz = [int(a.sum()) for a in (a1, a2, a3)]
    assert [m.pattern.nnz for m in maps] == nnz
    pairs = int((a1 @ a2).sum())  # matched index pairs of A1 @ A2
    nnz_12 = int(((a1 @ a2) > 0).sum())
    expected = 2 * nnz[2] + 2 * pairs + 2 * nnz_12 + 2 * nnz[1]
    totals = _vgg_analysis.scan_totals(_vgg_analysis.scan_rows(maps, None, batch=1))
    assert totals["flops"] == expected
    assert totals["products"] == 4
    # Critical path: A3 g -> (A1 A2)(A3 g), or A1 A2 -> (A1 A2)(A3 g): the larger.
    assert totals["critical_path_flops"] == max(2 * nnz[2], 2 * pairs) + 2 * nnz_12
    sequential = _vgg_analysis.scan_totals(_vgg_analysis.scan_rows(maps, 0, batch=1))
    assert sequential["flops"] == 2 * sum(nnz) == sequential["critical_path_flops"]
    # Dense BP, as XLA runs it: conv input gradient 2 Cout Cin k^2 Ho Wo, ReLU n, pool n_in.
    layers = _vgg_analysis.layers_table(chain, maps, batch=1, input_size=4)
    base = _vgg_analysis.baselines(layers)
    conv = 2 * 4 * 3 * 9 * 4 * 4
    assert base["bp"]["flops"] == conv + 64 + 64
    assert base["bp"]["first_input_gradient_flops"] == conv
    assert base["weight_gradient_flops"] == conv + 4 * 4 * 4
    assert base["sparse_chain"]["flops"] == 2 * sum(nnz)


def _independent_bp_flops(chain, input_size: int) -> int:
    total, shape = 0, (3, input_size, input_size)
    for layer in chain:
        out = layer.output_shape(shape)
        if isinstance(layer, Conv2d):
            total += 2 * layer.out_channels * layer.in_channels * 9 * out[1] * out[2]
        elif isinstance(layer, Linear):
            total += 2 * layer.in_features * layer.out_features
        elif isinstance(layer, ReLU | MaxPool2d):
            total += math.prod(shape)
        else:
            assert isinstance(layer, Flatten)
        shape = out
    return total


def test_analyze_writes_consistent_totals_resumes_and_draws(tmp_path, capsys):
    argv = ["analyze", *TINY, "--levels", "0", "2", "all", "--out", tmp_path]
    assert run(*argv) == 0
    folder = tmp_path / "analyze-quick-S8-D8"
    result = json.loads((folder / "analyze.json").read_text())
    chain = _vgg_model.vgg11_chain(8, 8)
    assert len(result["layers"]) == len(chain) == 21
    assert result["baselines"]["bp"]["flops"] == _independent_bp_flops(chain, 8)
    sparse = sum(2 * row["nnz"] for row in result["layers"])
    assert result["baselines"]["sparse_chain"]["flops"] == sparse
    scans = result["scans"]
    assert set(scans) == {"0", "2", "all"}
    assert scans["0"]["totals"]["flops"] == sparse
    for scan in scans.values():
        totals, rows = scan["totals"], scan["rows"]
        assert totals["flops"] == sum(r["flops"] for r in rows)
        assert 0 < totals["critical_path_flops"] <= totals["flops"]
        assert all(r["flops"] <= r["dense_flops"] for r in rows)
        assert any(r["critical"] for r in rows)
    assert {r["sweep"] for r in scans["2"]["rows"]} == {"up", "linear", "down"}
    assert scans["all"]["totals"]["critical_steps"] < scans["0"]["totals"]["critical_steps"]
    assert result["sparsity"]["overall"] == pytest.approx(0.97, abs=1e-3)
    out = capsys.readouterr().out
    assert "BPPSA (Blelloch, 2 parallel levels)" in out
    assert len(points(folder / "analyze.jsonl")) == 3
    assert run(*argv) == 0  # resumed: nothing is redone
    assert len(points(folder / "analyze.jsonl")) == 3
    paths = fig10.main([str(folder), "--levels", "all"])
    assert [p.name for p in paths] == ["fig10.png", "fig10.pdf"]
    assert all(p.stat().st_size > 10_000 for p in paths)


# -- jacobians (Table 1) -----------------------------------------------------------------------


def test_jacobians_blocked_and_whole_agree_with_jacrev_and_resume(tmp_path):
    argv = ["jacobians", "--input-size", "4", "--repeats", "2", "--dense-budget-mib", "1"]
    assert run(*argv, "--out", tmp_path, "--no-progress") == 0
    log = tmp_path / "jacobians-quick-S4" / "jacobians.jsonl"
    rows = points(log)
    assert [r["point"]["layer"] for r in rows] == ["conv", "relu", "maxpool"]
    for row in rows:
        assert row["check"]["same"] and row["check"]["nonzeros_outside_pattern"] == 0
        assert row["dense_blocks"] > 1 and "blocks" in row["dense_how"]
        assert row["analytic_s"] > 0 and row["dense_s"] > 0 and row["speedup"] > 0
        n_in, n_out = row["shape_t"]
        assert row["sparsity"] == pytest.approx(1 - row["nnz"] / (n_in * n_out))
    assert rows[1]["nnz"] == 64 * 4 * 4  # the ReLU's full diagonal
    assert rows[2]["nnz"] == 64 * 4 * 4  # every window slot of the pooling
    assert run(*argv, "--out", tmp_path, "--no-progress") == 0
    assert len(points(log)) == 3  # resumed
    whole = _vgg_jacobians.measure("relu", 4, 0, repeats=1)
    assert whole["dense_how"] == "jax.jacrev (whole)" and whole["check"]["same"]
    paths = table1.main([str(tmp_path / "jacobians-quick-S4")])
    assert [p.name for p in paths] == ["table1.md", "table1.png", "table1.pdf"]
    text = paths[0].read_text()
    assert text.count("| yes |") == 3 and "blocks of rows" in text


# -- benchmark ---------------------------------------------------------------------------------


def test_benchmark_measures_skips_over_the_limit_and_resumes(tmp_path, capsys):
    argv = [
        "benchmark",
        *TINY,
        "--sparsities",
        "0.9",
        "--batches",
        "2",
        "--repeats",
        "2",
        "--methods",
        "sequential-jacobians",
        "blelloch",
        "--memory-limit-mib",
        "2",
        "--out",
        tmp_path,
    ]
    assert run(*argv) == 0
    folder = tmp_path / "benchmark-quick-S8-D8"
    (row,) = points(folder / "benchmark.jsonl")
    assert row["point"] == {"sparsity": 0.9, "batch": 2}
    methods = row["methods"]
    assert list(methods) == ["bp", "sequential-jacobians", "blelloch"]  # bp added first
    assert row["backward"] == "pullback" and "forward_s" not in row
    for name in ("bp", "sequential-jacobians"):
        m = methods[name]
        for quantity in ("total", "forward", "backward"):  # each its own program
            assert 0 < m[f"{quantity}_min_ms"] <= m[f"{quantity}_ms"]
            assert set(m["quartiles_ms"][quantity]) == {"median", "q1", "q3"}
        assert set(m["compile_s"]) == {"total", "forward", "backward"}
        assert m["memory"]["peak"] > 0 and m["estimate_bytes"] > 0
        assert m["ratio"] == pytest.approx(m["backward_ms"] / methods["bp"]["backward_ms"])
    assert methods["sequential-jacobians"]["max_grad_diff_relative"] < 1e-5
    assert methods["sequential-jacobians"]["ran"]  # what the traced backward reported
    assert methods["bp"]["ratio"] in (1.0, None)
    skipped = methods["blelloch"]
    assert skipped["skipped"] == "MemoryLimitError" and skipped["estimate_bytes"] > 2 << 20
    summary = json.loads((folder / "benchmark.json").read_text())
    assert summary["backward"] == "pullback"
    crossover = summary["crossover"]["sequential-jacobians"]
    assert len(crossover["wins"] + crossover["losses"] + crossover["below_noise"]) == 1
    assert "sequential-jacobians vs dense BP" in crossover["summary"]
    assert summary["crossover"]["blelloch"]["skipped"] == [[0.9, 2]]
    assert "MemoryLimitError" in capsys.readouterr().out
    assert run(*argv) == 0  # resumed: the point is not measured again
    assert len(points(folder / "benchmark.jsonl")) == 1


# -- retrain -----------------------------------------------------------------------------------


def test_retrain_on_the_fixture_gives_the_same_losses_with_bp_and_bppsa(tmp_path, capsys):
    argv = [
        "retrain",
        *TINY,
        "--data",
        "fixture",
        "--root",
        tmp_path / "fixture",
        "--pretrain-iterations",
        "4",
        "--iterations",
        "5",
        "--batch",
        "4",
        "--chunk",
        "2",
        "--scope",
        "layer",
        "--out",
        tmp_path,
    ]
    assert run(*argv) == 0
    folder = tmp_path / "retrain-quick-S8-D8-B4"
    summary = json.loads((folder / "retrain.json").read_text())
    assert summary["data"]["synthetic"] and summary["data"]["name"] == "cifar10"
    assert set(summary["final"]) == {"bp", "sequential-jacobians", "blelloch-2"}
    assert summary["sparsity"]["overall"] == pytest.approx(0.97, abs=1e-3)
    for name, diff in summary["loss_max_relative_difference"].items():
        assert diff <= 1e-6, name  # float32 rounding only
    assert all(final["iterations"] == 5 for final in summary["final"].values())
    assert (folder / "pretrained.npz").exists()
    assert "SYNTHETIC" in capsys.readouterr().out
    steps = [r for r in JsonLines(folder / "runs" / "bp" / "metrics.jsonl").read()]
    assert sum(r.get("kind") == "step" for r in steps) == 5
    assert run(*argv) == 0  # resumed: no iteration is redone
    steps = JsonLines(folder / "runs" / "bp" / "metrics.jsonl").read()
    assert sum(r.get("kind") == "step" for r in steps) == 5
    # analyze accepts the pretrained checkpoint, pruned globally by default
    assert run("analyze", *TINY, "--checkpoint", folder / "pretrained.npz", "--out", tmp_path) == 0
    result = json.loads((tmp_path / "analyze-quick-S8-D8" / "analyze.json").read_text())
    assert result["config"]["scope"] == "global" and result["config"]["checkpoint"]
    checkpoint = folder / "pretrained.npz"
    for size, width, message in (
        ("16", "8", "argument --checkpoint: it holds a VGG-11 at 8x8, widths / 8"),
        ("8", "4", "argument --checkpoint: .* does not match"),
    ):
        with pytest.raises(SystemExit):  # another network than the checkpoint's
            run("analyze", "--input-size", size, "--width-divisor", width,
                "--checkpoint", checkpoint, "--out", tmp_path)  # fmt: skip
        assert re.search(message, capsys.readouterr().err)
