"""Drawing a figure reads result files through ``paper_figures.result_files`` only: in a fresh
interpreter, every figure script imported and three of them drawn (one from a small results file,
two from the committed CPU results) leave neither JAX, ``bppsa`` nor ``experiments`` in
``sys.modules``."""

import json
import os
import pathlib
import subprocess
import sys

from tests.paper_figures.test_fig7_fig8 import _run_rows, _write

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIGURES = ("accuracy", "fig7", "fig8", "fig9", "fig10", "fig13", "gpu", "table1", "width")
FORBIDDEN = ("jax", "jaxlib", "bppsa", "experiments")
SCRIPT = """
import importlib, json, sys

run, out, analysis, figures = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
modules = {name: importlib.import_module(f"paper_figures.{name}") for name in figures}
modules["fig7"].main([run, "--out", out])
modules["fig10"].main([analysis, "--out", out])
modules["accuracy"].main(["--out", out])
modules["gpu"].main(["--out", out])
print(json.dumps(sorted(sys.modules)))
"""


def test_figures_import_neither_jax_nor_the_experiments(tmp_path):
    run = tmp_path / "train"
    _write(run / "bp" / "metrics.jsonl", _run_rows("bp", 0.010))
    _write(run / "bppsa" / "metrics.jsonl", _run_rows("bppsa", 0.004))
    analysis = ROOT / "benchmarks" / "results" / "pruned_vgg11" / "analyze_cpu.json"
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), str(out), str(analysis), *FIGURES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.splitlines()[-1])
    assert "paper_figures.result_files" in modules and "matplotlib" in modules
    assert [m for m in modules if m.partition(".")[0] in FORBIDDEN] == []
    drawn = {p.name for p in out.iterdir()}
    assert {"fig7.png", "fig10.png", "accuracy.png", "accuracy.md", "gpu.png"} <= drawn
