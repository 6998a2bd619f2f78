"""The width figure drawn from small files in the layout ``benchmarks.width`` writes: medians
over runs with their range, unresolved points left out and named, the command line."""

import json

import matplotlib.pyplot as plt
import pytest

from paper_figures import width


def _entry(us, speedup=None, resolved=True):
    entry = dict(per_step_backward_us=us, backward_resolved=resolved)
    if speedup is not None:
        entry["backward_speedup_median"] = speedup
    return entry


def write_runs(folder, bp_scale=(1.0, 2.0, 3.0)):
    """Three runs of two widths of the diagonal GRU; BPPSA's H = 256 unresolved in run 3."""
    paths = []
    for k, scale in enumerate(bp_scale):
        rows = []
        for hidden in (64, 256):
            resolved = not (k == 2 and hidden == 256)
            bp = scale * hidden
            rows.append(
                dict(
                    cell="diagonal-gru",
                    hidden=hidden,
                    length=512,
                    batch=4,
                    methods={
                        "bp": _entry(bp),
                        "auto": _entry(bp / 4, 4.0 if resolved else None, resolved),
                    },
                )
            )
        data = {"jax": "0.0", "backend": "cpu", "cpus": 2, "rows": rows, "complete": True}
        path = folder / f"run{k}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths


def test_points_are_medians_over_runs_with_their_range(tmp_path):
    fig = width.draw(width.load(write_runs(tmp_path)))
    try:
        ax_time = fig.axes[0]
        bars = {c.get_label(): c for c in ax_time.containers}
        bp = bars["diagonal-gru, BP"]
        xs, ys = bp.lines[0].get_data()
        assert list(xs) == [64, 256]
        assert list(ys) == [2.0 * 64, 2.0 * 256]  # median of 1x, 2x, 3x
        (segments,) = bp.lines[2]
        low, high = segments.get_segments()[1][:, 1]
        assert (low, high) == (256.0, 3.0 * 256)  # the runs' range
        auto = bars["diagonal-gru, BPPSA auto"]
        # H = 256 is unresolved in one run: the median of the two resolved runs
        assert list(auto.lines[0].get_data()[1]) == [2.0 * 64 / 4, 1.5 * 256 / 4]
        caption = fig.texts[-1].get_text().replace("\n", " ")
        assert "diagonal-gru auto H = 256" in caption
        assert "3 run(s)" in caption
    finally:
        plt.close(fig)


def test_reference_line_is_proportional_to_h(tmp_path):
    fig = width.draw(width.load(write_runs(tmp_path)))
    try:
        (line,) = [ln for ln in fig.axes[0].lines if ln.get_label() == "proportional to H"]
        xs, ys = line.get_data()
        assert ys[1] / ys[0] == pytest.approx(xs[1] / xs[0])
    finally:
        plt.close(fig)


def test_command_line_writes_the_figure_and_refuses_other_files(tmp_path, capsys):
    paths = write_runs(tmp_path)
    written = width.main([*map(str, paths), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in written) == ["width.pdf", "width.png"]
    assert all(p.stat().st_size > 0 for p in written)
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit):
        width.main([str(bad)])
    assert "argument runs" in capsys.readouterr().err
