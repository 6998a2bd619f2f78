"""Figure scripts of experiment 1 run on small results files (written here in the format of
``experiments.rnn_synthetic``) and produce non-empty PNG and PDF images."""

import json
import pathlib

import matplotlib.image
import matplotlib.pyplot as plt
import pytest

from paper_figures import fig7, fig8

META = {
    "config": {"length": 1000, "batch": 16, "hidden": 20, "lr": 1e-5},
    "versions": {"jax": "0.10.2", "bppsa": "0.1.0"},
    "platform": "cpu",
    "device": "cpu",
    "cpus": 2,
    "cpu_model": "Test CPU",
    "started": "2026-01-01T00:00:00+00:00",
}


def _write(path: pathlib.Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _run_rows(method: str, step_s: float, iterations: int = 40):
    config = META["config"] | {"method": method, "resolved": "Auto() -> Chunked(chunks=1)"}
    rows = [{"kind": "session", "iteration": 0} | META | {"config": config}]
    for i in range(iterations):
        rows.append(
            dict(
                kind="step",
                iteration=i,
                epoch=0,
                loss=2.3 - 1e-3 * i + 0.01 * ((i * 7) % 5),
                forward_s=0.001,
                backward_s=step_s - 0.0012,
                grad_s=step_s - 0.0002,
                update_s=0.0002,
                step_s=step_s,
                wall_clock_s=step_s * (i + 1),
                elapsed_s=1.0 + step_s * (i + 1),
            )
        )
    return rows


def _point(sweep: str, length: int, batch: int, bp_step: float, bppsa_step: float):
    forward = 0.1 * bp_step

    def method(step):
        backward = step - forward - 1e-4
        return dict(
            iterations=39,
            step_s=step,
            grad_s=step - 1e-4,
            update_s=1e-4,
            backward_s=backward,
            backward_speedup=(bp_step - forward - 1e-4) / backward,
            overall_speedup=bp_step / step,
            quartiles={},
        )

    return {
        "kind": "point",
        "point": {"sweep": sweep, "length": length, "batch": batch},
        "forward_s": forward,
        "methods": {"bp": method(bp_step), "bppsa": method(bppsa_step)},
    }


def _assert_images(paths, name):
    assert sorted(p.name for p in paths) == [f"{name}.pdf", f"{name}.png"]
    for path in paths:
        assert path.stat().st_size > 10_000
    image = matplotlib.image.imread(next(p for p in paths if p.suffix == ".png"))
    assert image.shape[0] > 300 and image.shape[1] > 600 and image.std() > 0.01


def test_fig7(tmp_path):
    run = tmp_path / "train"
    _write(run / "bp" / "metrics.jsonl", _run_rows("bp", 0.010))
    _write(run / "bppsa" / "metrics.jsonl", _run_rows("bppsa", 0.004))
    _assert_images(fig7.main([str(run), "--out", str(tmp_path / "figures")]), "fig7")


@pytest.mark.parametrize("sweeps", [("T", "B"), ("T",)])
def test_fig8(tmp_path, sweeps):
    rows = [{"kind": "sweep"} | META | {"config": {"hidden": 20, "resolved": {}}}]
    if "T" in sweeps:
        rows += [_point("T", t, 16, 1e-5 * t, 0.6e-5 * t) for t in (10, 100, 1000, 10_000)]
    if "B" in sweeps:
        rows += [_point("B", 1000, b, 1e-3 * b, 1.5e-3 * b) for b in (2, 16, 128)]
    _write(tmp_path / "sweep" / "sweep.jsonl", rows)
    paths = fig8.main([str(tmp_path / "sweep")])  # default folder: <sweep>/figures
    assert paths[0].parent == tmp_path / "sweep" / "figures"
    _assert_images(paths, "fig8")


def test_missing_results_are_named(tmp_path, capsys):
    for module in (fig7, fig8):
        with pytest.raises(SystemExit) as exit_info:
            module.main([str(tmp_path / "nowhere")])
        assert exit_info.value.code == 2
        assert "nowhere" in capsys.readouterr().err


def test_fig8_leaves_out_unresolved_backward_times_and_says_so():
    points = [_point("T", t, 16, 1e-5 * t, 0.6e-5 * t) for t in (100, 1000, 10_000)]
    unresolved = points[0]["methods"]["bppsa"]
    unresolved.update(backward_s=-2.8e-4, backward_resolved=False, backward_speedup=None)
    figure = fig8.draw({"config": {"hidden": 20, "resolved": {}}} | META, points)
    texts = " ".join(" ".join(t.get_text().split()) for t in figure.texts)  # wrapped caption
    assert "Not drawn in (a), (b) and the breakdown: 1 backward time" in texts
    assert "BPPSA at T = 100." in texts
    time_axes = figure.axes[0]
    heights = [bar.get_height() for bar in time_axes.patches]
    assert sum(h != h for h in heights) == 1  # the one left-out bar is NaN, no bar below 0
    assert all(h != h or h > 0 for h in heights)
    clean = fig8.draw({"config": {"hidden": 20, "resolved": {}}} | META, points[1:])
    assert "Not drawn" not in " ".join(t.get_text() for t in clean.texts)


def test_fig7_names_the_demo_recipe_instead_of_one_learning_rate(tmp_path):
    """The demo's learning rates differ per parameter group: the title says so and the caption
    spells the recipe out; the paper's single rate stays in the title otherwise."""
    recipe = {"optimizer": "Adam from lr 0.01 (head) and 0.0001 (cell)", "inputs": "2 * bits - 1"}
    runs = {}
    for method, scale in (("bp", 0.010), ("bppsa", 0.004)):
        rows = _run_rows(method, scale)
        rows[0]["config"] = rows[0]["config"] | {"recipe": recipe}
        runs[method] = rows
    fig = fig7.draw(runs)
    try:
        title = fig._suptitle.get_text()
        assert "demo recipe (caption)" in title and "Adam lr" not in title
        caption = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
        assert "optimizer: Adam from lr 0.01 (head) and 0.0001 (cell)" in caption
    finally:
        plt.close(fig)
    fig = fig7.draw({m: _run_rows(m, s) for m, s in (("bp", 0.010), ("bppsa", 0.004))})
    try:
        assert f"Adam lr = {META['config']['lr']:g}" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
