"""The fused loops' seam: a Pallas backend JAX dropped is a fallback with a reason, plans
travel in the scan's decision (no module-level cache changes while scans are traced and run),
and the decision asks capabilities, not classes."""

from __future__ import annotations

import ast
import inspect
import pathlib
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa.models import RNN, rnn_cell
from bppsa.scan._core import decision
from bppsa.scan._core.fused import dispatch, triton
from bppsa.scan._core.fused.backend import Interpreted

ROOT = pathlib.Path(__file__).resolve().parents[2]

WITHOUT_TRITON = textwrap.dedent(
    """
    import sys, warnings
    sys.modules["jax.experimental.pallas.triton"] = None  # JAX without Pallas' Triton backend
    import jax, jax.numpy as jnp
    import bppsa
    from bppsa.models import RNN, rnn_cell

    params = RNN().init(3, 8, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (7, 3))

    def loss(p, scan):
        return scan(lambda h, x: (rnn_cell(p, h, x), h), jnp.zeros(8), xs)[0].sum()

    ours = bppsa.grad(loss)(params, bppsa.scan)
    theirs = jax.grad(loss)(params, jax.lax.scan)
    assert all(jax.tree.leaves(jax.tree.map(jnp.allclose, ours, theirs)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = lambda b, i, x: bppsa.scan(b, i, x, forward="fused")
        bppsa.grad(loss)(params, fused)
    print([str(w.message) for w in caught if issubclass(w.category, bppsa.FallbackWarning)])
    """
)


def test_without_pallas_triton_import_and_gradients_work_and_fused_falls_back():
    """With ``jax.experimental.pallas.triton`` unimportable, ``import bppsa`` and the default
    gradients work, and ``forward="fused"`` runs ``lax.scan`` with the reason naming it."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Pallas' Triton backend cannot be imported here" in out.stdout
    assert "runs lax.scan" in out.stdout


def test_the_triton_backend_is_here_and_its_table_read():
    assert triton.Triton().missing() is None and triton.has_rule("tanh")
    assert dispatch.backend_named("triton") == triton.Triton()
    assert "no fused kernel backend named 'nope'" in dispatch.backend_named("nope")
    assert dispatch.runners(triton.Triton()) == {
        "cuda": triton.Triton(),
        "cpu": Interpreted(triton.Triton()),
    }


def test_only_the_backend_modules_import_pallas_backends():
    """Every import of a Pallas backend is in one module of its backend (guarded there):
    ``triton.py``, and Mosaic GPU's kernel module."""
    for path in (ROOT / "bppsa").rglob("*.py"):
        text = path.read_text()
        if path.name != "triton.py":
            assert "pallas.triton" not in text and "pallas import triton" not in text, path
        if path.name != "mosaic_kernel.py":
            assert "pallas.mosaic_gpu" not in text and "pallas import mosaic_gpu" not in text, path


def _containers() -> dict:
    """Every module-level container of ``bppsa`` (dicts, lists, sets, weak dictionaries, the
    sizes of ``functools`` caches), as comparable snapshots."""
    seen = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("bppsa") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if attr.startswith("__"):
                continue
            if isinstance(value, dict | list | set | weakref.WeakKeyDictionary):
                keys = list(value.keys()) if hasattr(value, "keys") else list(value)
                seen[name, attr] = (len(keys), tuple(id(k) for k in keys))
            elif hasattr(value, "cache_info"):
                seen[name, attr] = value.cache_info().currsize
    return seen


def _gradients(method, hidden):
    params = RNN().init(3, hidden, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (6, 3))

    def loss(p):
        return bppsa.scan(lambda h, x: (rnn_cell(p, h, x), h), jnp.zeros(hidden), xs)[0].sum()

    return jax.block_until_ready(bppsa.grad(loss, method=method)(params))


def test_no_module_level_container_changes_while_scans_are_traced_and_run():
    """A default scan, and one on the GPU profile (its fused forward and reverse loop, run
    here interpreted), traced and run: every plan travels in the decision."""
    gpu = bppsa.Auto(profile=bppsa.get_profile("gpu"))
    with bppsa.trace_plans() as plans:
        _gradients(gpu, 5)  # imports and first-use set-up happen here
    assert plans[0].backward == bppsa.FusedSequential() and plans[0].forward == bppsa.Fused()
    before = _containers()
    _gradients(None, 4)
    _gradients(gpu, 4)
    assert _containers() == before


def test_the_decision_asks_capabilities_not_classes():
    """``decide`` checks what was asked (a policy, the forward's policy), never which
    concrete method or forward it is."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(decision)))
    classes = {
        node.args[1].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and isinstance(node.args[1], ast.Name)
    }
    assert classes <= {"Policy", "AutoForward", "str"}, classes


@pytest.mark.parametrize("method", [bppsa.FusedSequential(), bppsa.Blelloch()], ids=repr)
def test_declarations(method):
    assert method.keeps_carries
    assert method.forms_jacobians is not isinstance(method, bppsa.FusedSequential)
    assert not bppsa.Sequential().keeps_carries and not bppsa.Sequential().forms_jacobians
    assert bppsa.Blocked(bppsa.FusedSequential()).kernel_loop


def test_the_backward_plan_builds_what_its_run_builds(monkeypatch):
    """A backward whose hoisted parts cannot be evaluated is refused by its plan (why_not
    says so), not when the gradient is traced: the gradient then comes from the sequential
    scan over the Jacobians, equal to back-propagation's."""
    from bppsa.scan._core.fused import backward as fused_backward

    params = RNN().init(3, 4, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (5, 3))

    def loss(p, scan):
        return scan(lambda h, x: (rnn_cell(p, h, x), h), jnp.zeros(4), xs)[0].sum()

    def planted(*args):
        raise NotImplementedError("planted")

    monkeypatch.setattr(fused_backward, "residuals", planted)
    method = bppsa.FusedSequential()
    with pytest.warns(bppsa.FallbackWarning, match="the backward could not be built"):
        ours = bppsa.grad(loss, method=method)(params, bppsa.scan)
    theirs = jax.grad(loss)(params, jax.lax.scan)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "method", [bppsa.FusedSequential(), bppsa.Blocked(bppsa.FusedSequential())], ids=repr
)
def test_each_plan_is_made_once_with_the_decisions_profile(method, monkeypatch):
    """A gradient with ``forward=Fused(num_warps=2)`` and the reverse loop (alone or in
    ``Blocked``): each kernel's plan is made once per scan, by the decision, for that forward
    and on the scan's profile; the forward and the backward run what the decision carries."""
    made = []
    for cls in (bppsa.Fused, bppsa.FusedSequential):
        original = cls.prepare

        def spy(self, problem, profile=None, _original=original):
            made.append((self, profile))
            return _original(self, problem, profile)

        monkeypatch.setattr(cls, "prepare", spy)
    forward = bppsa.Fused(num_warps=2)
    params = RNN().init(3, 4, key=jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (5, 3))

    def loss(p):
        body = lambda h, x: (rnn_cell(p, h, x), h)
        return bppsa.scan(body, jnp.zeros(4), xs, forward=forward)[0].sum()

    with bppsa.trace_plans() as plans:
        jax.block_until_ready(bppsa.grad(loss, method=method)(params))
    profile = bppsa.get_profile()
    assert plans[0].forward == forward and plans[0].backward == method
    made.sort(key=lambda planned: type(planned[0]).__name__)
    assert made == [(forward, profile), (bppsa.FusedSequential(), profile)], made
