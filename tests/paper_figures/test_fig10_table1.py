"""Fig. 10 and Table 1 drawn from hand-written result files in the formats of
``experiments.pruned_vgg11`` (no JAX, nothing measured), and Table 1 of the committed results."""

import json
import pathlib

import matplotlib.image
import pytest

from paper_figures import fig10, table1
from paper_figures.result_files import JsonLines

META = dict(
    platform="cpu",
    device="cpu",
    cpus=2,
    cpu_model="Test CPU 9000",
    versions={"jax": "0.0", "bppsa": "0.1.0"},
    started="2026-01-01T00:00:00+00:00",
)


def _row(index, level, sweep, kind, flops, dense, critical, depends=()):
    return dict(
        index=index, level=level, sweep=sweep, kind=kind, flops=flops, dense_flops=dense,
        critical=critical, depends=list(depends), format="sparse", nnz_out=10, copies=1,
    )  # fmt: skip


def _analysis(empty=()):
    rows = [
        _row(0, 1, "up", "SpGEMM", 2_000, 1e8, True),
        _row(1, 1, "up", "SpMV", 300, 1e5, False),
        _row(2, 2, "up", "SpGEMM", 9_000, 1e9, True, (0,)),
        _row(3, 2, "linear", "SpMV", 800, 1e6, True, (1, 2)),
        _row(4, 1, "down", "SpMV", 500, 1e5, False, (3,)),
    ]
    totals = dict(flops=12_600, critical_path_flops=11_800, products=5, critical_steps=3)
    layers = [dict(bp_input_flops=4e6), dict(bp_input_flops=6e4), dict(bp_input_flops=6e4)]
    return dict(
        metadata={"kind": "sweep"} | META,
        net="VGG-11 at 8x8",
        batch=1,
        config=dict(scope="layer", checkpoint=None),
        sparsity=dict(overall=0.97),
        empty_layers=list(empty),
        layers=layers,
        baselines=dict(
            bp=dict(flops=4.12e6, critical_path_flops=4.12e6),
            sparse_chain=dict(flops=4_000, critical_path_flops=4_000),
            weight_gradient_flops=4e6,
        ),
        scans={"2": dict(rows=rows, totals=totals), "all": dict(rows=rows[:3], totals=totals)},
    )


def _png(paths, name):
    assert [p.name for p in paths][-2:] == [f"{name}.png", f"{name}.pdf"]
    image = matplotlib.image.imread(paths[-2])
    assert image.shape[0] > 300 and image.shape[1] > 500 and image.std() > 0.01


def test_fig10_draws_products_levels_and_totals(tmp_path):
    (tmp_path / "analyze.json").write_text(json.dumps(_analysis(empty=[13])))
    fig = fig10.draw(fig10.load(tmp_path))
    products, totals = fig.axes
    assert len(products.patches) == 5 and products.get_yscale() == "log"
    labels = {t.get_text() for t in products.texts}
    assert {"up 1", "up 2", "linear", "down 1"} <= labels
    edges = [p.get_edgecolor() for p in products.patches]
    assert sum(e[:3] == (0.0, 0.0, 0.0) and e[3] > 0 for e in edges) == 3  # critical ones
    assert [t.get_text() for t in totals.get_xticklabels()][:2] == ["BP\n(dense)", "sparse\nchain"]
    assert "WARNING: layers [13]" in fig.texts[-1].get_text()
    paths = fig10.main([str(tmp_path), "--levels", "all"])
    assert paths[0].parent == tmp_path / "figures"
    _png(paths, "fig10")


def jacobian_rows():
    """A ``jacobians.jsonl`` of three layers (the dense conv and ReLU computed in blocks)."""
    rows = [{"kind": "sweep", "config": {"input_size": 32}} | META]
    for name, title, blocks in (
        ("conv", "Conv2d", 16),
        ("relu", "ReLU", 64),
        ("maxpool", "Max", 1),
    ):
        rows.append(
            dict(
                kind="point",
                point=dict(layer=name, input_size=32),
                layer=title,
                input_shape=[1, 3, 32, 32],
                shape_t=[3072, 65536],
                nnz=1_696_512,
                sparsity=0.99157,
                paper_sparsity=0.99157,
                analytic_s=2e-4,
                dense_s=3.0,
                speedup=15_000.0,
                repeats=5,
                dense_blocks=blocks,
                check=dict(same=name != "maxpool", max_abs_diff=0.5),
            )
        )
    return rows


def test_table1_writes_markdown_and_a_figure(tmp_path):
    JsonLines(tmp_path / "jacobians.jsonl").extend(jacobian_rows())
    paths = table1.main([str(tmp_path), "--out", str(tmp_path / "out")])
    text = paths[0].read_text()
    assert sum(line.startswith("| ") for line in text.splitlines()) == 4  # header, 3 layers
    assert "15,000x" in text and "NO (max diff 0.5)" in text and "Test CPU 9000" in text
    assert "Conv2d, ReLU" in text  # the blocked ones are named
    _png(paths, "table1")


@pytest.mark.parametrize("module", [fig10, table1])
def test_missing_or_wrong_results_are_named(module, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        module.main([str(tmp_path / "nowhere")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument run" in err and "nowhere" in err


def test_fig10_refuses_an_unknown_scan_and_a_foreign_file(tmp_path, capsys):
    (tmp_path / "analyze.json").write_text(json.dumps(_analysis()))
    with pytest.raises(SystemExit):
        fig10.main([str(tmp_path), "--levels", "7"])
    assert "argument --levels: the analysis holds the scans ['2', 'all']" in (
        capsys.readouterr().err
    )
    (tmp_path / "analyze.json").write_text(json.dumps({"points": []}))
    with pytest.raises(SystemExit):
        fig10.main([str(tmp_path)])
    assert "is not an analysis result" in capsys.readouterr().err


def test_committed_table1_is_that_of_the_committed_results():
    root = pathlib.Path(__file__).resolve().parents[2]
    results = root / "benchmarks" / "results" / "pruned_vgg11" / "jacobians_paper_cpu.jsonl"
    committed = root / "paper_figures" / "output" / "table1.md"
    assert table1.markdown(*table1.load(results)) == committed.read_text()
