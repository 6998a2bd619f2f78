"""Figs. 9 and 13 drawn from hand-written result files (no JAX, no training)."""

import pytest

from paper_figures import fig9, fig13
from paper_figures.result_files import JsonLines

META = dict(
    platform="cpu",
    device="cpu",
    cpus=2,
    cpu_model="Test CPU 9000",
    versions={"jax": "0.0", "bppsa": "0.1.0"},
    started="2026-01-01T00:00:00+00:00",
)


def breakdown_rows(synthetic=True, skip=()):
    data = {v: {"synthetic": synthetic, "frames": 10, "features": 4} for v in "SML"}
    rows = [dict(kind="sweep", config=dict(hidden=20, repeats=3, data=data)) | META]
    for v, scale in zip("SML", (1, 2, 4), strict=True):
        for b in (16, 32, 64):
            if (v, b) in skip:
                continue
            f, fo, scan, bp = 1e-3 * scale, 0.5e-3 * scale, 1e-3 * scale, 3e-3 * scale
            rows.append(
                dict(
                    kind="point",
                    point=dict(variant=v, batch=b),
                    frames=259 * scale,
                    features=38 // scale,
                    forward_s=f,
                    forward_jacobians_s=f + fo,
                    jacobians_s=fo,
                    bppsa_backward_s=scan if b != 64 else -1e-4,  # noise can make it negative
                    bp_backward_s=bp,
                    bp_s=f + bp,
                    bppsa_s=f + fo + scan,
                    resolved="Auto() -> Chunked(chunks=1, block=1024)",
                )
            )
    return rows


def test_fig9_draws_the_grid_and_names_machine_and_fixture(tmp_path):
    JsonLines(tmp_path / "breakdown.jsonl").extend(breakdown_rows(skip={("M", 32)}))
    meta, points = fig9.load_breakdown(tmp_path)
    assert len(points) == 8
    fig = fig9.draw(meta, points)
    title = fig._suptitle.get_text()
    assert "Test CPU 9000" in title and "SYNTHETIC FIXTURE, NOT IRMAS" in title
    assert len(fig.axes) == 9
    assert any(t.get_text() == "not measured" for t in fig.axes[4].texts)
    paths = fig9.main([str(tmp_path)])
    assert [p.name for p in paths] == ["fig9.png", "fig9.pdf"]
    assert all(p.parent == tmp_path / "figures" and p.stat().st_size > 0 for p in paths)


def test_fig9_on_real_data_has_no_fixture_label(tmp_path):
    JsonLines(tmp_path / "breakdown.jsonl").extend(breakdown_rows(synthetic=False))
    fig = fig9.draw(*fig9.load_breakdown(tmp_path))
    assert "SYNTHETIC" not in fig._suptitle.get_text()


def test_fig9_errors_name_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fig9.main([str(tmp_path)])
    assert "no results file" in capsys.readouterr().err
    JsonLines(tmp_path / "breakdown.jsonl").extend(breakdown_rows()[:1])
    with pytest.raises(SystemExit):
        fig9.main([str(tmp_path)])
    assert "no measured point yet" in capsys.readouterr().err


def write_runs(folder, batch=16):
    for v, frames in zip("SML", (259, 517, 1034), strict=True):
        for method in ("bp", "bppsa"):
            config = dict(
                hidden=20,
                lr=3e-4,
                batch=batch,
                method=method,
                data=dict(frames=frames, features=12, synthetic=True),
            )
            rows = [dict(kind="session", iteration=0, config=config) | META]
            speed = 1.0 if method == "bp" else 0.5
            for i in range(40):
                loss = 2.4 - 0.01 * i
                rows.append(dict(kind="step", iteration=i, loss=loss, wall_clock_s=speed * i))
                if i % 10 == 9:
                    rows.append(
                        dict(kind="eval", iterations_done=i + 1, wall_clock_s=speed * i)
                        | dict(train_loss=loss, train_accuracy=0.2)
                    )
            JsonLines(folder / f"{v}-B{batch}" / method / "metrics.jsonl").extend(rows)


def test_fig13_draws_one_panel_per_variant(tmp_path):
    write_runs(tmp_path)
    write_runs(tmp_path, batch=32)
    runs = fig13.load_runs(tmp_path, batch=16)
    assert list(runs) == ["S", "M", "L"] and list(runs["S"]) == ["bp", "bppsa"]
    fig = fig13.draw(runs)
    assert "Test CPU 9000" in fig._suptitle.get_text()
    assert "SYNTHETIC FIXTURE, NOT IRMAS" in fig._suptitle.get_text()
    assert [ax.get_title() for ax in fig.axes] == [
        "S: T = 259, F = 12, B = 16",
        "M: T = 517, F = 12, B = 16",
        "L: T = 1034, F = 12, B = 16",
    ]
    paths = fig13.main([str(tmp_path), "--batch", "32", "--out", str(tmp_path / "f")])
    assert [p.name for p in paths] == ["fig13.png", "fig13.pdf"]
    with pytest.raises(SystemExit):
        fig13.main([str(tmp_path), "--batch", "64"])
