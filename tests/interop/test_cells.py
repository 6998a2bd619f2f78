"""equinox, flax linen and flax nnx cells through ``bppsa.scan`` under ``bppsa.grad`` with every
method, vmapped over a batch, against ``jax.grad`` through ``jax.lax.scan``: gradients with
respect to the module's parameters and the initial carry."""

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("equinox")
pytest.importorskip("flax")

import bppsa
from tests.helpers import assert_close_to_back_propagation
from tests.interop.cells import CELLS, B, loss_fn, problem

# Every method, each at one length (1, 5, 17: not powers of two; 17 > the block of 4), so that
# every cell meets every method and every length without compiling all 18 pairs per cell.
METHOD_LENGTHS = [
    (bppsa.Auto(), 5),
    (bppsa.Blelloch(), 17),
    (bppsa.Chunked(), 1),
    (bppsa.Sequential(), 5),
    (bppsa.SequentialScan(), 17),
    (bppsa.Blocked(bppsa.Blelloch(), 4), 17),
]
LENGTHS = sorted({length for _, length in METHOD_LENGTHS})


@pytest.mark.parametrize("cell", CELLS)
def test_every_method_matches_back_propagation(x64, subtests, cell):
    problems = {length: problem(CELLS[cell], length) for length in LENGTHS}
    args = {length: (params, init, xs) for length, (params, step, init, xs) in problems.items()}
    steps = {length: step for length, (_, step, _, _) in problems.items()}

    # One compilation for all methods (and one for the references): compiling is all the time.
    @jax.jit
    def gradients(args):
        return [
            bppsa.grad(loss_fn(bppsa.scan, steps[n]), argnums=(0, 1), method=method)(*args[n])
            for method, n in METHOD_LENGTHS
        ]

    @jax.jit
    def references(args):
        grad = lambda n: jax.grad(loss_fn(jax.lax.scan, steps[n]), argnums=(0, 1))
        return {n: grad(n)(*args[n]) for n in LENGTHS}

    with bppsa.trace_plans() as plans:
        actual = gradients(args)
    expected = references(args)
    assert [plan.requested for plan in plans] == [method for method, _ in METHOD_LENGTHS]
    for (method, length), grads, plan in zip(METHOD_LENGTHS, actual, plans):
        with subtests.test(method=str(method), length=length):
            assert plan.batch == B and plan.jacobians == "autodiff"  # no analytic builder
            reference_fn = jax.grad(loss_fn(jax.lax.scan, steps[length]), argnums=(0, 1))
            assert_close_to_back_propagation(
                grads, expected[length], jnp.float64, reference_fn, args[length]
            )
