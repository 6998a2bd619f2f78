"""The backward methods' names (``paper_figures.result_files.methods``): every form becomes its
``bppsa`` method in one place (``experiments.methods``), each command takes its forms and refuses
the others naming the valid ones, and the names in the figures and in the committed result files are
the vocabulary's."""

import json
import pathlib

import pytest

import bppsa
from benchmarks import _speed_cli, width
from experiments import _vgg_model
from experiments.methods import OVER_LAYERS, OVER_TIME, parse_method
from paper_figures import _style
from paper_figures.result_files import methods as method_names

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# benchmarks.sharded names the exchanges of bppsa.Sharded (and "bp"), not methods by name;
# experiments.char_lm names its runs (bppsa-newton: Auto's backward after a Newton forward).
NOT_BY_NAME = {"sharded_cpu.json"}
RUN_FOLDERS = ("char_lm",)


@pytest.mark.parametrize(
    "name, method",
    [
        ("bp", bppsa.Sequential()),
        ("sequential", bppsa.Sequential()),
        ("bppsa", bppsa.Auto()),
        ("auto", bppsa.Auto()),
        ("blelloch", bppsa.Blelloch()),
        ("blelloch-0", bppsa.Blelloch(levels=0)),
        ("blelloch-2", bppsa.Blelloch(levels=2)),
        ("blelloch-b16", bppsa.Blocked(bppsa.Blelloch(), 16)),
        ("chunked", bppsa.Chunked()),
        ("chunked-3", bppsa.Chunked(3)),
        ("chunked-3-b512", bppsa.Blocked(bppsa.Chunked(3), 512)),
        ("sequential-jacobians", bppsa.SequentialScan()),
        ("sequential-jacobians-b128", bppsa.Blocked(bppsa.SequentialScan(), 128)),
    ],
)
def test_every_form_builds_its_method(name, method):
    assert parse_method(name, method_names.FORMS) == method


def test_plain_names_are_the_librarys():
    # One table of method names: the library's; the experiments' plain names map onto it,
    # and every method with a name is one of them, but the blocked methods (named with their
    # block, "-b<K>"), the sharded one (the experiments run on one device) and the fused
    # sequential backward (a GPU kernel no experiment runs yet).
    library = set(bppsa.scan.METHODS) - {"blocked", "sharded", "fused-sequential"}
    assert set(method_names.LIBRARY.values()) == library
    assert set(method_names.LIBRARY) | {
        method_names.BLELLOCH_LEVELS,
        method_names.BLELLOCH_BLOCKED,
        method_names.CHUNKED_CHUNKS,
        method_names.CHUNKED_BLOCKED,
        method_names.SEQUENTIAL_JACOBIANS_BLOCKED,
    } == set(method_names.FORMS)


@pytest.mark.parametrize(
    "name", ["magic", "Blelloch", "bp ", "chunked-0", "chunked-x", "chunked-2-b0", "blelloch-"]
)
def test_other_names_are_refused_listing_the_forms(name):
    with pytest.raises(ValueError, match=r"is not known; expected one of: bp, bppsa, auto, "):
        method_names.parse(name)


def test_each_command_takes_its_forms():
    over_time, over_layers = parse_method, _vgg_model.parse_method
    assert over_time("chunked-4") == bppsa.Chunked(4)
    assert over_layers("blelloch-2") == bppsa.Blelloch(levels=2)
    with pytest.raises(ValueError, match=r"'blelloch-2' .* chunked-C \(C chunks\)"):
        over_time("blelloch-2")  # levels exist only over layers
    with pytest.raises(ValueError, match=r"'chunked' .* blelloch-K \(K parallel levels\)"):
        over_layers("chunked")  # a chain of layers has no chunked scan
    assert _speed_cli.parse_method("chunked-2-b64") == bppsa.Blocked(bppsa.Chunked(2), 64)
    for baseline in ("bp", "bppsa"):  # the benchmark measures BP itself, and names Auto "auto"
        with pytest.raises(ValueError, match=f"{baseline!r} is not known"):
            _speed_cli.parse_method(baseline)


def test_an_alias_has_the_labels_of_its_name():
    assert (
        method_names.canonical("auto") == "bppsa"
        and method_names.canonical("blelloch") == "blelloch"
    )
    assert method_names.label("auto") == method_names.label("bppsa") == "BPPSA (bppsa.Auto)"
    assert method_names.in_table("auto") == method_names.in_table("bppsa") == "Auto()"
    assert method_names.label("bppsa", "Auto() -> Chunked(chunks=1)") == (
        "BPPSA (bppsa.Auto) = Chunked(chunks=1)"
    )
    assert method_names.label("chunked-8") == method_names.short("chunked-8") == "chunked-8"


def _committed_names():
    found = set()
    for path in RESULTS.rglob("*.json"):
        if path.name in NOT_BY_NAME or path.parent.name.startswith(RUN_FOLDERS):
            continue
        payload = json.loads(path.read_text())
        rows = [r for key in ("t_sweep", "b_sweep", "h_sweep", "rows", "points") for r in
                payload.get(key, [])]  # fmt: skip
        for row in rows:
            for key in ("methods", "end_to_end", "backward_only"):
                found |= set(row.get(key) or ())
        found |= set(payload.get("methods") or ())
    return found


def test_the_figures_and_the_committed_results_use_the_vocabulary():
    committed = _committed_names()
    assert {"bp", "bppsa", "auto", "blelloch-2", "sequential-jacobians"} <= committed
    for name in [
        *committed,
        *_style.COLORS,
        *method_names.LABELS,
        *method_names.SHORT,
        *method_names.TABLE,
    ]:
        method_names.parse(name)  # raises for a name outside the vocabulary


def test_a_method_bound_in_a_loss_runs_in_a_pullback_traced_apart():
    import jax
    import jax.numpy as jnp

    from experiments.methods import bind
    from experiments.timing import GradientPrograms

    xs = jnp.linspace(-1.0, 1.0, 17)

    def loss(w, xs):
        return bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), 0.0, xs)[0]

    bound = bind(loss, method="blelloch")
    with bppsa.trace_plans() as plans:
        programs = GradientPrograms.from_loss(bound, jnp.float32(0.5), xs)
    assert {repr(p.backward) for p in plans if p.backward} == {"Blelloch()"}
    expected = jax.grad(loss)(0.5, xs)  # Auto's, outside any binding
    assert jnp.allclose(programs.backward(programs.pullback, programs.cotangent), expected)
    assert jnp.allclose(jax.value_and_grad(bound)(0.5, xs)[1], expected)
    with pytest.raises(ValueError, match="'magic' is not a known backward method"):
        bind(loss, method="magic")  # refused before any tracing


def test_one_table_of_names_and_every_view_of_it():
    # Each command's forms, the library's names, the labels: views of the one table, NAMES.
    table = method_names.NAMES
    assert tuple(form.name for form in table) == method_names.FORMS
    assert tuple(form.name for form in table if form.over_time) == OVER_TIME
    assert tuple(form.name for form in table if form.over_layers) == OVER_LAYERS
    assert set(method_names.LABELS) == set(method_names.SHORT) == set(method_names.TABLE)
    for form in table:
        assert form.library in bppsa.scan.METHODS, form


@pytest.mark.parametrize(
    ("alias", "name"), [("auto", "bppsa"), ("sequential-scan", "sequential-jacobians")]
)
def test_the_librarys_names_are_aliases_resolved_in_one_place(alias, name):
    assert method_names.canonical(alias) == name
    assert method_names.label(alias) == method_names.label(name)
    assert width.method_of(alias) == parse_method(name, method_names.FORMS)
