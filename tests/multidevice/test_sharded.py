"""``bppsa.Sharded`` on 2, 4 and 8 emulated CPU devices (run by tests/core/test_sharded.py in a
subprocess with ``JAX_NUM_CPU_DEVICES=8``): gradients equal ``jax.grad`` through ``lax.scan``
for every cell, both loss placements, uneven ``T`` and ``T < P``, ``reverse``, pytree carries,
vmap and jit, both exchanges, and a two-axis mesh with the batch sharded on the other axis."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import bppsa
from bppsa.models import GRU, LSTM, RNN
from bppsa.scan._core.forward import SequentialForward
from tests.helpers import assert_trees_close, cell_loss, cell_problem, spread


class Autodiff(RNN):
    """An RNN cell written by hand, without its analytic Jacobian: autodiff Jacobians."""

    def __call__(self, params, state, x):
        return jnp.tanh(x @ params["weight_ih"].T + state @ params["weight_hh"].T)


CELLS = {"rnn": RNN(), "gru": GRU(), "lstm": LSTM(), "autodiff": Autodiff()}
ARGNUMS = (0, 1, 3)


def mesh_of(devices, names=("t",)):
    shape = (devices,) if len(names) == 1 else (2, devices // 2)
    return Mesh(np.array(jax.devices()[:devices]).reshape(shape), names)


def check(cell_name, method, length, where, dtype, batch=3, hidden=5, place=None, forward=None):
    cell = CELLS[cell_name]
    params, xs, heads, init = cell_problem(cell, length, batch, hidden, dtype)
    if place is not None:
        xs = jax.device_put(xs, place)
    args = (params, xs, heads, init)
    expected = jax.jit(jax.grad(cell_loss(cell, jax.lax.scan, where), argnums=ARGNUMS))(*args)
    loss = cell_loss(cell, bppsa.scan, where)
    grad = bppsa.grad(loss, argnums=ARGNUMS, method=method, forward=forward)
    with bppsa.trace_plans() as plans:
        actual = jax.jit(grad)(*args)
    assert [p.requested for p in plans] == [method]
    # an unset local method is the scan's policy's choice for a device's slice, in the plan
    assert [dataclasses.replace(p.backward, local=method.local) for p in plans] == [method]
    assert plans[0].backward.local is not None
    assert [p.jacobians for p in plans] == ["autodiff" if cell_name == "autodiff" else "analytic"]
    assert "shard_map" in str(jax.make_jaxpr(grad)(*args))
    assert_trees_close(actual, expected, dtype)


def test_eight_devices():
    assert len(jax.devices()) == 8


@pytest.mark.parametrize(
    "cell,devices,length,where",
    spread(sorted(CELLS), [2, 4, 8], [(17, "every"), (3, "last"), (16, "last")], crossed=2),
)
def test_cells_match_back_propagation(cell, devices, length, where, dtype):
    check(cell, bppsa.Sharded(mesh_of(devices), "t"), length, where, dtype)


# "last": a cotangent on the final carry only, which crosses every device's aggregate; "every":
# cotangents on the outputs only (none on the carry).
@pytest.mark.parametrize("length,where", [(1, "last"), (5, "every"), (23, "last")])
@pytest.mark.parametrize("local", [None, bppsa.Blelloch(), bppsa.Chunked(2)], ids=str)
def test_exchange_by_ppermute_and_local_methods(local, length, where):
    for exchange in ("all_gather", "ppermute"):
        method = bppsa.Sharded(mesh_of(8), "t", local=local, exchange=exchange)
        check("gru", method, length, where, jnp.float32)


@pytest.mark.parametrize("length,where", [(17, "every"), (3, "last")])
@pytest.mark.parametrize("cell", ["rnn", "lstm", "autodiff"])
def test_pipelined_forward(cell, length, where):
    """Device after device: the same gradients, and the same forward as lax.scan."""
    method, forward = bppsa.Sharded(mesh_of(4), "t"), bppsa.Pipelined(mesh_of(4), "t")
    check(cell, method, length, where, jnp.float32, forward=forward)
    params, xs, _, init = cell_problem(CELLS[cell], length, 2, 5, jnp.float32)

    def states(scan, **options):
        body = lambda s, x: (CELLS[cell](params, s, x), CELLS[cell].output(s))
        return jax.vmap(lambda x, i: scan(body, i, x, **options))(xs, init)

    actual = jax.jit(lambda: states(bppsa.scan, method=method, forward=forward))()
    assert_trees_close(actual, states(jax.lax.scan), jnp.float32)


def test_batch_sharded_on_another_axis_of_the_mesh():
    mesh = mesh_of(8, ("data", "t"))  # 2 x 4
    place = NamedSharding(mesh, P("data", "t"))  # xs: (batch, T, inputs)
    check("rnn", bppsa.Sharded(mesh, "t"), 24, "every", jnp.float32, batch=4, place=place)
    # (device_put itself needs T divisible by the axis; uneven T is tested above, unplaced)
    check("lstm", bppsa.Sharded(mesh, "t"), 12, "last", jnp.float32, batch=2, place=place)


@pytest.mark.parametrize("pipelined", [False, True])
def test_pytree_carry_with_an_integer_leaf_reverse_and_both_cotangents(pipelined):
    method = bppsa.Sharded(mesh_of(4), "t")
    forward = bppsa.Pipelined(mesh_of(4), "t") if pipelined else "sequential"
    xs = {"a": jnp.linspace(-1, 1, 22).reshape(11, 2), "n": jnp.arange(11)}

    def loss(scan, w, init):
        def body(carry, x):
            h, count = carry["h"], carry["count"]
            h = jnp.tanh(w @ h + x["a"] + 0.1 * count + 0.01 * x["n"])
            return {"h": h, "count": count + 1}, jnp.sum(h**2)

        carry, ys = scan(body, {"h": init, "count": jnp.int32(0)}, xs, reverse=True)
        return jnp.sum(carry["h"] ** 3) + jnp.sum(ys)

    w = jnp.array([[0.5, -0.4], [0.3, 0.2]])
    init = jnp.array([0.1, -0.2])
    expected = jax.grad(functools.partial(loss, jax.lax.scan), argnums=(0, 1))(w, init)
    grad = bppsa.grad(
        functools.partial(loss, bppsa.scan), argnums=(0, 1), method=method, forward=forward
    )
    with bppsa.trace_plans() as plans:
        actual = jax.jit(grad)(w, init)
    assert plans[0].forward == (forward if pipelined else SequentialForward())
    assert_trees_close(actual, expected, jnp.float32)


def test_the_finiteness_check_names_the_step():
    method = bppsa.Sharded(mesh_of(4), "t")
    xs = jnp.ones((19, 2)).at[13, 1].set(jnp.nan)

    def loss(w):
        return bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), jnp.zeros(2), xs)[0].sum()

    with pytest.raises(FloatingPointError, match=r"Jacobian is that of time step xs\[13\]"):
        bppsa.grad(loss, method=method, check_finite=True)(0.5)


@pytest.mark.parametrize("forward", ["sequential", "newton"])
def test_forward_mode_and_the_newton_forward(forward):
    """jax.jvp through a Sharded scan (its tangents by the local scan) and gradients after the
    Newton forward equal lax.scan's."""
    cell = CELLS["gru"]
    params, xs, heads, init = cell_problem(cell, 17, 3, 5, jnp.float32)
    scan = functools.partial(bppsa.scan, method=bppsa.Sharded(mesh_of(4), "t"), forward=forward)
    loss, loss_ref = cell_loss(cell, scan, "every"), cell_loss(cell, jax.lax.scan, "every")
    args = (params, xs, heads, init)
    tangent = jax.tree.map(jnp.ones_like, params)

    def jvp(loss):
        return jax.jvp(lambda p: loss(p, *args[1:]), (params,), (tangent,))

    assert_trees_close(jax.jit(lambda: jvp(loss))(), jax.jit(lambda: jvp(loss_ref))(), jnp.float32)
    actual = jax.jit(jax.grad(loss, argnums=ARGNUMS))(*args)
    expected = jax.jit(jax.grad(loss_ref, argnums=ARGNUMS))(*args)
    assert_trees_close(actual, expected, jnp.float32)
