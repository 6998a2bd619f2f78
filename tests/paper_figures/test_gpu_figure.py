"""The GPU figure (the paper's Fig. 8 on a GPU): drawn from the committed H200 results, with the
speed grid's backward (a difference of two programs) refused; drawn from a small file in the
layout of the timing harness, whose backward is its own program; laid out without overlaps; and
without JAX or bppsa."""

import json
import os
import pathlib
import subprocess
import sys

import matplotlib.pyplot as plt
import pytest

from paper_figures import _style, gpu
from paper_figures.result_files import read_json, read_rows
from tests.paper_figures.test_layout import problems

ROOT = pathlib.Path(__file__).resolve().parents[2]
H200 = ROOT / "benchmarks" / "results" / "gpu-h200"
BLELLOCH = _style.COLORS["blelloch"]
AUTO = _style.COLORS["bppsa"]


def _series(ax, facecolor=None):
    """``{(marker, colour): [(T, speedup), ...]}`` of a panel's data lines (not the baseline),
    those with markers filled (``facecolor="filled"``) or hollow (``"white"``) if asked."""
    found = {}
    for line in ax.lines:
        if line.get_marker() in (None, "None", ""):
            continue
        filled = line.get_markerfacecolor() != "white"
        if facecolor is not None and filled != (facecolor == "filled"):
            continue
        found[line.get_marker(), line.get_color()] = list(
            zip(map(int, line.get_xdata()), map(float, line.get_ydata()))
        )
    return found


def _same(drawn, expected):
    """Whether drawn ``(T, speedup)`` points are the expected ones (speedups to rounding)."""
    return [t for t, _ in drawn] == [t for t, _ in expected] and [s for _, s in drawn] == (
        pytest.approx([s for _, s in expected])
    )


def _harness(backward_on="file", bp_under_methods=("rnn",)):
    """A speed file in the harness's layout: every quantity its own program, BP's under
    ``methods["bp"]`` for the cells in ``bp_under_methods`` and as ``bp_`` keys for the others.
    Blelloch's backward is 10x BP's, Auto's 5x; whole gradients 2x and 2.5x."""
    rows = []
    for cell in ("rnn", "gru"):
        for length in (100, 1000, 10_000):
            t = length / 100
            bp = dict(total_ms=2 * t, forward_ms=t, backward_ms=t)
            blelloch = dict(total_ms=t, forward_ms=0.9 * t, backward_ms=t / 10, runs="Blelloch()")
            auto = dict(total_ms=0.8 * t, forward_ms=0.6 * t, backward_ms=t / 5, runs="Blelloch()")
            for entry in (bp, blelloch, auto):
                entry |= {
                    f"{k[:-3]}_min_ms": 0.9 * v for k, v in list(entry.items()) if k != "runs"
                }
            methods = {"blelloch": blelloch, "auto": auto}
            row = dict(cell=cell, length=length, batch=16, hidden=20, status="ok", methods=methods)
            if cell in bp_under_methods:
                methods["bp"] = bp
            else:
                row |= {f"bp_{k}": v for k, v in bp.items()}
            if backward_on == "rows":
                row["backward"] = "pullback"
            rows.append(row)
    # Another batch size: in the file, not in the figure.
    rows.append(rows[0] | {"batch": 1})
    payload = dict(device="Test GPU", platform="gpu", jax="0.11.2", bppsa="0.1.0", repeats=3)
    if backward_on == "file":
        payload["backward"] = "pullback"
    return payload | {"t_sweep": rows, "b_sweep": [], "h_sweep": []}


def _write(folder, payload, name="speed_gpu.json"):
    path = folder / name
    path.write_text(json.dumps(payload))
    return path


def test_committed_results_backward_from_the_pullbacks_only():
    sources = gpu.load(H200)
    assert [s.path.name for s in sources] == ["speed_gpu.json", "gpu_backward.jsonl"]
    speed, direct = sources
    assert speed.backward == [] and "speed_gpu.json" in speed.refused
    assert direct.backward and direct.refused is None
    fig = gpu.draw(sources)
    try:
        ax_backward, ax_total = fig.axes
        rows = read_rows(H200 / "gpu_backward.jsonl")

        def direct_speedups(cell, key):
            return [
                (r["T"], r[f"bp_{key}"] / r[f"bppsa_{key}"])
                for r in sorted(rows, key=lambda r: r["T"])
                if r["cell"] == cell and r["H"] == 20 and r["B"] == 16
            ]

        # (a): Blelloch's pullback against BP's, timed alone; nothing else.
        backward = _series(ax_backward)
        assert set(backward) == {("o", BLELLOCH), ("s", BLELLOCH)}
        assert _same(backward["o", BLELLOCH], direct_speedups("rnn", "bwd_min_ms"))
        assert _same(backward["s", BLELLOCH], direct_speedups("gru", "bwd_min_ms"))
        assert [round(s) for _, s in backward["o", BLELLOCH]] == [25, 63, 89]
        # (b): the speed grid's totals (filled) and the direct value_and_grad (hollow).
        grid = read_json(H200 / "speed_gpu.json")["t_sweep"]
        totals = _series(ax_total, "filled")
        for marker, cell in (("o", "rnn"), ("s", "gru")):
            for method in ("auto", "blelloch", "chunked"):
                colour = _style.color("bppsa" if method == "auto" else method)
                expected = [
                    (r["length"], r["bp_total_ms"] / r["methods"][method]["total_ms"])
                    for r in grid
                    if r["cell"] == cell and r["batch"] == 16 and r["hidden"] == 20
                ]
                assert len(expected) == 8
                assert _same(totals[marker, colour], expected)
        hollow = _series(ax_total, "white")
        assert _same(hollow["o", BLELLOCH], direct_speedups("rnn", "vg_min_ms"))
        caption = " ".join(fig.texts[-1].get_text().split())
        assert "Not drawn in (a): the backward of speed_gpu.json" in caption
        assert "two different programs" in caption
        assert problems(fig) == []
    finally:
        plt.close(fig)


def test_a_difference_style_backward_is_refused_naming_the_file(tmp_path):
    payload = _harness(backward_on=None)
    path = _write(tmp_path, payload, "old_speed.json")
    with pytest.raises(ValueError, match=r"old_speed\.json.*two different programs"):
        gpu.speed_backward(payload, path)
    with pytest.raises(ValueError, match=r"speed_gpu\.json"):
        gpu.speed_backward(read_json(H200 / "speed_gpu.json"), H200 / "speed_gpu.json")
    # One row that does not say so is enough.
    mixed = _harness(backward_on="rows")
    del mixed["t_sweep"][2]["backward"]
    with pytest.raises(ValueError, match="1 of its 7"):
        gpu.speed_backward(mixed, path)
    # Drawn alone, such a file gives the totals and an empty backward panel that says why.
    (source,) = gpu.load(path)
    fig = gpu.draw([source])
    try:
        assert _series(fig.axes[0]) == {}
        assert [t.get_text() for t in fig.axes[0].texts] == [
            "no backward timed as its own program\nin these files"
        ]
        assert len(_series(fig.axes[1])) == 4
        assert "the backward of old_speed.json" in " ".join(fig.texts[-1].get_text().split())
        assert problems(fig) == []
    finally:
        plt.close(fig)


@pytest.mark.parametrize("backward_on", ["file", "rows"])
def test_harness_file_draws_both_panels(tmp_path, backward_on, capsys):
    path = _write(tmp_path, _harness(backward_on))
    paths = gpu.main([str(path), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in paths) == ["gpu.pdf", "gpu.png"]
    assert "not drawn" not in capsys.readouterr().out
    fig = gpu.draw(gpu.load(path))
    try:
        ax_backward, ax_total = fig.axes
        lengths = [100, 1000, 10_000]
        for marker in ("o", "s"):  # BP's times under methods["bp"] (RNN) or bp_ keys (GRU)
            backward = _series(ax_backward)
            assert _same(backward[marker, BLELLOCH], [(t, 10.0) for t in lengths])
            assert _same(backward[marker, AUTO], [(t, 5.0) for t in lengths])
            totals = _series(ax_total)
            assert _same(totals[marker, BLELLOCH], [(t, 2.0) for t in lengths])
            assert _same(totals[marker, AUTO], [(t, 2.5) for t in lengths])
        caption = " ".join(fig.texts[-1].get_text().split())
        assert "Not drawn" not in caption
        assert "each its own program, medians of 3 interleaved rounds" in caption
        assert "Blelloch() at T = 100, 1k, 10k" in caption
        assert problems(fig) == []
    finally:
        plt.close(fig)


def test_the_command_line_refuses_and_names(tmp_path, capsys):
    path = _write(tmp_path, _harness(backward_on=None), "old_speed.json")
    gpu.main([str(path), "--out", str(tmp_path / "out")])
    assert "old_speed.json" in capsys.readouterr().out
    for missing in (tmp_path / "nowhere.json", tmp_path / "out"):
        with pytest.raises(SystemExit) as exit_info:
            gpu.main([str(missing)])
        assert exit_info.value.code == 2
        assert missing.name in capsys.readouterr().err


SCRIPT = """
import json, sys
from paper_figures import gpu
gpu.main([sys.argv[1], "--out", sys.argv[2]])
print(json.dumps(sorted(sys.modules)))
"""


def test_drawn_without_jax_or_bppsa(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(H200), str(tmp_path)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.splitlines()[-1])
    assert [m for m in modules if m.partition(".")[0] in ("jax", "jaxlib", "bppsa")] == []
    assert {p.name for p in tmp_path.iterdir()} == {"gpu.png", "gpu.pdf"}
