"""The GRU-on-IRMAS experiment on the synthetic fixture: command line, breakdown, training,
resume, batch order, and the Jacobian overhead's forward."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa.data import irmas, irmas_fixture
from bppsa.models import GRU, SequenceClassifier, gru_cell
from experiments import _irmas_breakdown, gru_irmas
from experiments._irmas_data import Clips
from paper_figures import fig9, fig13


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("irmas") / "fixture"
    irmas_fixture.write_fixture(path, 1, seed=0)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def run(*argv):
    return gru_irmas.main([str(a) for a in argv])


def test_help_of_every_command(capsys):
    for command in ([], ["breakdown"], ["train"], ["fixture"]):
        with pytest.raises(SystemExit) as info:
            run(*command, "--help")
        assert info.value.code == 0
    assert "Fig. 13" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["breakdown", "--data", "{tmp}/nowhere"], "argument --data: IRMAS root .* does not exist"),
        (["breakdown", "--data", "{tmp}", "--batches", "0"], "expected a positive integer"),
        (["train", "--data", "{root}", "--batch", "12"], "batch size 12 exceeds the 11 clips"),
        (["train", "--data", "{root}", "--variants", "XL"], "variant must be one of S, M, L"),
        (["train", "--data", "{root}", "--method", "magic"], "method 'magic' is not known"),
        (["train", "--data", "{tmp}"], "argument --data: .* is empty; expected"),
        (["fixture", "--out", "{root}/cel"], "argument --out: .* not a synthetic fixture"),
    ],
)
def test_bad_arguments_fail_before_work(argv, message, tmp_path, root, capsys):
    argv = [a.format(tmp=tmp_path, root=root) for a in argv]
    with pytest.raises(SystemExit) as info:
        run(*argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_fixture_command(tmp_path, capsys):
    run("fixture", "--out", tmp_path / "fx", "--clips-per-class", 1)
    assert "SYNTHETIC" in capsys.readouterr().out
    assert len(irmas.find_clips(tmp_path / "fx")[0]) == 11


def test_the_jacobians_from_the_states_match_autodiff():
    model = SequenceClassifier(3, 4, 5, cell=GRU())
    params = model.init(key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (2, 6, 3))
    before = _irmas_breakdown.step_states(model, params, xs)
    assert before.shape == (2, 6, 4) and not jnp.any(before[:, 0])  # h_0 = 0 enters step 1
    d, e = _irmas_breakdown.jacobians(model, params, xs, before)
    assert d.shape == (2, 6, 12) and e.shape == (2, 6, 4)
    # J_t^T v of every step of example 0 against a VJP of the cell at h_{t-1}.
    cell = params["cell"]
    v = jnp.arange(1.0, 5.0)

    @jax.jit
    def vjps(x):
        def body(h, x_t):
            return gru_cell(cell, h, x_t), jax.vjp(lambda h_: gru_cell(cell, h_, x_t), h)[1](v)[0]

        return jax.lax.scan(body, jnp.zeros(4), x)[1]

    actual = (d[0] * jnp.tile(v, 3)) @ cell["weight_hh"] + e[0] * v
    np.testing.assert_allclose(actual, vjps(xs[0]), rtol=1e-5, atol=1e-6)


def test_batch_order_is_a_function_of_seed_and_iteration(root, cache):
    features = irmas.load(root, "S", cache_dir=cache, progress=False)
    clips = Clips(features, seed=3)
    per_epoch = clips.batches_per_epoch(4)
    assert per_epoch == 2  # 11 clips: the incomplete last batch is dropped
    first = [clips.indices(i, 4) for i in range(4)]
    again = Clips(features, seed=3)
    assert all(np.array_equal(a, again.indices(i, 4)) for i, a in enumerate(first))
    assert len(set(np.concatenate(first[:2]))) == 8  # no clip twice in an epoch
    assert not np.array_equal(first[0], Clips(features, seed=4).indices(0, 4))
    with pytest.raises(ValueError, match="batch size 12 exceeds the 11 usable clips"):
        clips.batches_per_epoch(12)


def test_breakdown_resumes_and_draws(root, cache, tmp_path, capsys):
    argv = ["breakdown", "--data", root, "--variants", "S", "--batches", 4, "--repeats", 2]
    argv += ["--out", tmp_path, "--cache-dir", cache, "--no-progress"]
    run(*argv)
    log = tmp_path / "breakdown-quick" / "breakdown.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows[0]["kind"] == "sweep" and rows[0]["config"]["data"]["S"]["synthetic"]
    assert "versions" in rows[0] and "device" in rows[0]
    (point,) = [r for r in rows if r["kind"] == "point"]
    assert point["point"] == {"variant": "S", "batch": 4}
    assert (point["frames"], point["features"], point["repeats"]) == (259, 38, 2)
    # Every part is its own program's median, none a difference of two.
    assert point["backward"] == "pullback"
    parts = ("bp", "bppsa", "bp_forward", "bppsa_forward", "bp_backward", "bppsa_backward")
    for key in (*parts, "jacobians"):
        assert point[f"{key}_s"] > 0
        assert point["quartiles"][f"{key}_s"]["median"] == pytest.approx(point[f"{key}_s"])
    assert "forward_s" not in point and "forward_jacobians_s" not in point
    assert set(point["compile_s"]) == {"bp", "bppsa", "jacobians"}
    assert "Jacobians" in capsys.readouterr().out  # the printed table
    run(*argv)  # resumes: nothing left to measure
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["sweep", "point", "sweep"]
    with pytest.raises(SystemExit):  # another configuration in the same folder
        run(*argv[:-1], "--seed", 1, "--no-progress")
    paths = fig9.main([str(log.parent), "--out", str(tmp_path / "figures")])
    assert [p.name for p in paths] == ["fig9.png", "fig9.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_train_resumes_without_duplicates_and_draws(root, cache, tmp_path):
    argv = ["train", "--data", root, "--variants", "S", "--batch", 4, "--out", tmp_path]
    argv += ["--cache-dir", cache, "--no-progress", "--checkpoint-every", 2, "--name", "t"]
    run(*argv, "--iterations", 3)
    run(*argv, "--iterations", 5)  # extends the same runs
    folder = tmp_path / "t" / "S-B4"
    losses = {}
    for method in ("bp", "bppsa"):
        rows = [
            json.loads(x) for x in (folder / method / "metrics.jsonl").read_text().split("\n") if x
        ]
        assert rows[0]["kind"] == "session" and rows[0]["config"]["lr"] == 3e-4
        assert rows[0]["config"]["hidden"] == 20 and rows[0]["config"]["data"]["synthetic"]
        steps = [r for r in rows if r["kind"] == "step"]
        assert [r["iteration"] for r in steps] == [0, 1, 2, 3, 4]
        assert all(r["wall_clock_s"] > 0 for r in steps)
        evals = [r for r in rows if r["kind"] == "eval"]
        assert evals and 0 <= evals[-1]["train_accuracy"] <= 1
        losses[method] = np.array([r["loss"] for r in steps])
    np.testing.assert_allclose(losses["bppsa"], losses["bp"], rtol=1e-5)
    paths = fig13.main([str(tmp_path / "t"), "--out", str(tmp_path / "figures")])
    assert [p.name for p in paths] == ["fig13.png", "fig13.pdf"]


def test_smoke_writes_the_fixture_and_draws_the_figure(tmp_path, capsys):
    """``breakdown --smoke`` without ``--data``: the SYNTHETIC fixture under ``--out``, the
    breakdown in ``breakdown-smoke`` and Fig. 9 beside it (one point, one round, to be quick)."""
    argv = ["breakdown", "--smoke", "--variants", "S", "--batches", 4, "--repeats", 1]
    run(*argv, "--out", tmp_path, "--cache-dir", tmp_path / "cache", "--no-progress")
    assert (tmp_path / "fixture" / irmas.SYNTHETIC_MARKER).exists()
    folder = tmp_path / "breakdown-smoke"
    assert (folder / "breakdown.jsonl").exists()
    assert (folder / "figures" / "fig9.png").stat().st_size > 0
    assert "SYNTHETIC" in capsys.readouterr().out
