"""``Sharded(mesh, axis_name)``: the backward's time axis split across the devices of a mesh.

Algorithm summary (sequence parallelism for BPPSA's backward). The ``T`` steps are split into
``P`` contiguous slices of ``L = ceil(T / P)`` steps, one per device along ``axis_name`` (the
earliest slice padded at its start; padded steps get zero cotangents, so they contribute
nothing). Inside one ``jax.shard_map``, every device

1. evaluates its slice's steps at once: their VJP and transposed Jacobians (as on one device);
2. composes its slice into one affine map ``g_start = M g_end + o`` (``L`` dependent ``n x n``
   steps, :func:`bppsa.scan.aggregate`);
3. exchanges: ONE ``all_gather`` of the ``P`` aggregates, then a local fold from the last device
   back gives the cotangent entering its slice (``P`` matrix-vector products); or, with
   ``exchange="ppermute"``, ``ceil(log2 P)`` rounds of neighbour exchanges composing aggregates
   (a Hillis-Steele scan; ``ppermute`` fills non-receivers with zeros, so they keep their own);
4. scans its slice from that cotangent with the local method and takes the VJP; the parameter
   cotangents are summed over the devices (``psum``), those of ``xs`` stay sharded.

Critical path: about ``2 L`` local dependent steps (aggregate, then the local scan) plus the
exchange, instead of ``T``. The forward pass is the usual sequential one, replicated on every
device (a nonlinear recurrence cannot be split without a parallel forward); each device then
reads only its slice of the kept carries. The ``all_gather`` exchange is the default: one
collective of ``P - 1`` aggregates (``(n^2 + n)`` floats each per example) against
``ceil(log2 P)`` dependent rounds of a ``n x n`` product and a message each for ``ppermute``;
for the ``P`` of one host and the paper's ``n``, one collective is cheaper
(``benchmarks/sharded.py`` measures both).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from bppsa.scan._algorithms import aggregate, apply, combine
from bppsa.scan._core import backward, cost, debug
from bppsa.scan._core.forward import Forward, SequentialForward
from bppsa.scan._core.methods.auto import Auto
from bppsa.scan._core.methods.base import Method, Supports, require
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.profiles import platform_of, profile_of
from bppsa.scan._elements import Dense

EXCHANGES = ("all_gather", "ppermute")


@dataclasses.dataclass(frozen=True)
class Sharded(Method):
    """Shards the time axis of the backward over the mesh axis ``axis_name``.

    Use it as ``bppsa.grad(loss, method=bppsa.Sharded(mesh, "t"))`` or
    ``bppsa.scan(..., method=...)``; see the module docstring for the algorithm.

    Attributes:
        mesh: a ``jax.sharding.Mesh`` (other axes, e.g. ``"data"``, stay with XLA: the scan's
            ``shard_map`` is manual over ``axis_name`` only); ``None``: one axis ``axis_name``
            over all devices of the default backend (what ``"sharded"`` names).
        axis_name: the mesh axis the steps are split over.
        local: the Jacobian method each device runs on its slice (``None``: what ``Auto()``
            would pick for a slice, on the mesh's platform). The tangent recurrence of forward
            mode is not sharded: it runs on one device by this method's scan
            (``SequentialScan()``'s for ``None``; :meth:`scan`).
        exchange: ``"all_gather"`` (default) or ``"ppermute"``.

    The forward runs as on one device, XLA keeping each device's slice of the stacked carries;
    ``forward=bppsa.Pipelined(mesh, "t")`` runs it device after device instead
    (:class:`Pipelined`).

    Example:
        >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("t",))
        >>> loss = lambda w: bppsa.scan(lambda h, x: (jnp.tanh(w * h + x), None), 0.0,
        ...                             jnp.ones(9))[0]
        >>> g = bppsa.grad(loss, method=bppsa.Sharded(mesh, "t"))(0.5)
    """

    mesh: Mesh = None  # type: ignore[assignment]  # None: filled in by __post_init__
    axis_name: str = "t"
    local: Method | None = None
    exchange: str = "all_gather"
    name: ClassVar[str] = "sharded"
    # Each example's slices are sharded on their own; the tangents run on one device.
    # Every device forms the Jacobians of its own slice of the steps.
    supports: ClassVar[Supports] = Supports(whole_batch=False, forward_jacobians=False)

    def __post_init__(self):
        object.__setattr__(self, "mesh", _checked_mesh("Sharded", self.mesh, self.axis_name))
        if self.local is not None and (
            isinstance(self.local, Sharded)
            or not isinstance(self.local, Method)
            or not self.local.keeps_carries
        ):
            raise TypeError(
                "Sharded: local must be a method that scans Jacobians on one device (e.g. "
                f"bppsa.Blelloch(), bppsa.Chunked(), bppsa.SequentialScan()); got "
                f"{self.local!r}."
            )
        if self.exchange not in EXCHANGES:
            raise ValueError(
                f"Sharded: exchange must be one of {EXCHANGES}, got {self.exchange!r}."
            )

    @property
    def devices(self) -> int:
        """``P``, the devices along ``axis_name``."""
        return self.mesh.shape[self.axis_name]

    def resolved(self, fp, policy, profile) -> Sharded:
        """This method with its local method, where unset, the choice of the scan's
        ``policy`` (on ``profile``) for one device's slice of a scan of footprint ``fp``."""
        if self.local is not None:
            return self
        slice_fp = dataclasses.replace(fp, length=math.ceil(fp.length / self.devices))
        local = policy.scan_method(slice_fp, math.inf, profile=profile, jacobians=True)
        return dataclasses.replace(self, local=local)

    def local_method(self, fp) -> Method:
        """The method each device runs on its slice of a scan of footprint ``fp`` (unset
        outside a scan's decision, which sets it by :meth:`resolved`: ``Auto()``'s on the
        mesh's platform)."""
        if self.local is not None:
            return self.local
        platform = platform_of(self.mesh.devices.flat[0])
        slice_fp = dataclasses.replace(fp, length=math.ceil(fp.length / self.devices))
        return Auto().scan_method(slice_fp, profile=profile_of(platform), jacobians=True)

    def scan(self, g_last, maps, offsets):
        # A stack already on one device: the local method's scan.
        return (self.local or SequentialScan()).scan(g_last, maps, offsets)

    def memory(self, fp):
        """Per device: its slice's backward (the whole scan's carries kept) and the ``P``
        gathered aggregates."""
        per_device = math.ceil(fp.length / self.devices)
        local = self.local_method(fp).memory(fp.part(per_device))
        return local + fp.bytes((self.devices + 1) * (fp.dense + fp.size))

    def cost(self, fp):
        """Per device: its slice's backward by the local method, the slice's aggregate (one
        dependent step per step of the slice) and the exchange of the aggregates."""
        per_device = math.ceil(fp.length / self.devices)
        local = self.local_method(fp).cost(fp.part(per_device))
        if self.devices == 1:
            return local
        rounds = math.ceil(math.log2(self.devices))
        exchange = cost.exchange(fp, self.devices, rounds if self.exchange == "ppermute" else 0)
        return cost.plus(local, cost.aggregate(fp, per_device), exchange)

    def backward(
        self,
        problem,
        consts,
        carries_before,
        xs,
        g_last,
        ct_ys,
        *,
        check,
        jacobians=None,
        prepared=None,
    ):
        if jacobians is not None:
            require(self, "forward_jacobians")
        num_steps = jax.tree.leaves(carries_before)[0].shape[0]
        if num_steps == 0:
            return SequentialScan().backward(
                problem, consts, carries_before, xs, g_last, ct_ys, check=check
            )
        devices = self.devices
        per_device, pad, valid = _slices(num_steps, devices)
        local = self.local_method(problem.footprint)
        all_steps, layout = problem.all_steps(), problem.layout
        axis = self.axis_name

        # Edge values keep the padded steps finite; they get no cotangent.
        carries_p, xs_p = jax.tree.map(_front_edge(pad), (carries_before, xs))
        ct_ys_p = None if ct_ys is None else jax.tree.map(_front_zeros(pad), ct_ys)
        first_device, first_index = divmod(pad, per_device)

        def on_device(consts, carries, xs, ct_ys, valid, g_last):
            jac_t, offsets, vjp, ct_ys = backward.linearize_steps(
                all_steps, layout, consts, carries, xs, ct_ys
            )
            if devices == 1:  # nothing to exchange
                g_end = g_last
            else:
                matrix, offset = aggregate(jac_t, offsets, g_last)
                g_end = self._exchange(matrix, offset, g_last)
            g = local.scan(g_end, jac_t, offsets)  # [g_start, ..., g_end] of this slice
            mask = valid.reshape(-1, *([1] * (g.ndim - 1)))
            cts = layout.unpack(jnp.where(mask, g[1:], 0), carries, stacked=True)
            ct_consts, ct_xs = vjp((cts, ct_ys))
            ct_consts = lax.psum(ct_consts, axis)
            here = lax.axis_index(axis) == first_device
            g_first = lax.psum(jnp.where(here, g[first_index], 0), axis)
            flags = debug.step_flags(jac_t, g, offsets) if check else jnp.zeros(0, jnp.int32)
            ct_xs = jax.tree.map(backward.float0_as_placeholder, ct_xs)
            return g_first, ct_consts, ct_xs, flags

        time, same = P(axis), P()
        run = jax.shard_map(
            on_device,
            mesh=self.mesh,
            in_specs=(same, time, time, time, time, same),
            out_specs=(same, same, time, time),
            axis_names={axis},
            check_vma=False,
        )
        g_first, ct_consts, ct_xs, flags = run(consts, carries_p, xs_p, ct_ys_p, valid, g_last)
        ct_xs = jax.tree.map(lambda c: c[pad:], ct_xs)
        ct_xs = jax.tree.map(backward.restore_float0, ct_xs, xs)
        return g_first, ct_consts, ct_xs, (flags[pad:] if check else None)

    def _exchange(self, matrix, offset, g_last):
        """The cotangent entering this device's slice from the right (its ``g_end``)."""
        axis, devices = self.axis_name, self.devices
        me = lax.axis_index(axis)
        if self.exchange == "all_gather":
            matrices = lax.all_gather(matrix, axis)  # (P, *batch, n, n)
            offsets = lax.all_gather(offset, axis)

            def fold(g, q):  # from the last device back: g entering device q - 1
                return apply(g[None], _element(matrices[q], offsets[q]))[0], g

            _, g_ends = lax.scan(fold, g_last, jnp.arange(devices), reverse=True)
            return g_ends[me]
        # Hillis-Steele from the right: after round r, device p holds the composition of
        # devices p .. p + 2^(r+1) - 1 (clipped at the last one).
        shift = 1
        while shift < devices:
            perm = [(src, src - shift) for src in range(shift, devices)]
            m_in = lax.ppermute(matrix, axis, perm)
            o_in = lax.ppermute(offset, axis, perm)
            has_in = me + shift < devices
            # this map (earlier) after the received one (later): M = M_me @ M_in
            composed, new_offset = combine(_element(m_in, o_in), _element(matrix, offset))
            new_matrix, new_offset = composed.a[0], new_offset[0]
            matrix = jnp.where(has_in, new_matrix, matrix)
            offset = jnp.where(has_in, new_offset, offset)
            shift *= 2
        g_start = apply(g_last[None], _element(matrix, offset))[0]  # entering this slice
        g_end = lax.ppermute(g_start, axis, [(src, src - 1) for src in range(1, devices)])
        return jnp.where(me == devices - 1, g_last, g_end)


@dataclasses.dataclass(frozen=True)
class Pipelined(Forward):
    """The sequential forward, device after device along ``axis_name``: ``forward=`` of a scan
    whose backward is ``bppsa.Sharded`` over the same axis (``forward="pipelined"``: over all
    devices).

    Device ``p`` runs its slice of ``L = ceil(T / P)`` steps (the earliest slice padded at its
    start with steps that keep the carry) once device ``p - 1`` has sent it the carry (one
    ``ppermute`` per stage, ``lax.cond`` so that the other devices idle): still ``T``
    dependent steps, but every device computes and keeps only its own slice.

    Attributes:
        mesh: a ``jax.sharding.Mesh`` (``None``: one axis ``axis_name`` over all devices of
            the default backend).
        axis_name: the mesh axis the steps are split over.
    """

    mesh: Mesh = None  # type: ignore[assignment]  # None: filled in by __post_init__
    axis_name: str = "t"
    name: ClassVar[str] = "pipelined"

    def __post_init__(self):
        object.__setattr__(self, "mesh", _checked_mesh("Pipelined", self.mesh, self.axis_name))

    def __call__(self, problem, consts, init, xs, *, keep, prepared=None):
        axis, devices = self.axis_name, self.mesh.shape[self.axis_name]
        step, length = problem.body.step, problem.length
        if length == 0:
            return SequentialForward()(problem, consts, init, xs, keep=keep)
        per_device, pad, valid = _slices(length, devices)
        xs_p = jax.tree.map(_front_edge(pad), xs)

        def run_slice(consts, carry, xs, valid):
            def body(c, inputs):
                x, ok = inputs
                new, y, *_ = step(c, x, *consts)
                return _select(ok, new, c), (y, c)

            return lax.scan(body, carry, (xs, valid), length=per_device)

        def on_device(consts, init, xs, valid):
            me = lax.axis_index(axis)
            shapes = jax.eval_shape(run_slice, consts, init, xs, valid)

            def idle(*args):
                return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

            carry, out = init, idle()
            for stage in range(devices):
                result = lax.cond(me == stage, run_slice, idle, consts, carry, xs, valid)
                out = _select(me == stage, result, out)
                if stage + 1 < devices:
                    sent = lax.ppermute(result[0], axis, [(stage, stage + 1)])
                    carry = _select(me == stage + 1, sent, carry)
            final, (ys, before) = out
            last = me == devices - 1
            final = jax.tree.map(lambda a: lax.psum(jnp.where(last, a, 0), axis), final)
            return final, ys, before

        time, same = P(axis), P()
        final, ys, before = jax.shard_map(
            on_device,
            mesh=self.mesh,
            in_specs=(same, same, time, time),
            out_specs=(same, time, time),
            axis_names={axis},
            check_vma=False,
        )(consts, init, xs_p, valid)
        ys, before = jax.tree.map(lambda a: a[pad:], (ys, before))
        return final, ((ys, before) if keep else ys)


def _checked_mesh(owner: str, mesh, axis_name) -> Mesh:
    """``mesh`` checked to have the axis ``axis_name`` (``None``: one axis ``axis_name`` over all
    devices of the default backend), naming ``owner`` in the errors."""
    if mesh is None:
        if not isinstance(axis_name, str):
            raise TypeError(f"{owner}: axis_name must be a string, got {axis_name!r}.")
        mesh = Mesh(np.asarray(jax.devices()), (axis_name,))
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{owner}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"{owner}: axis_name={axis_name!r} is not an axis of the mesh; its axes "
            f"are {tuple(mesh.axis_names)}."
        )
    return mesh


def _slices(length: int, devices: int):
    """``(L, pad, valid)``: ``L = ceil(T / P)`` steps per device, the ``pad`` steps added at the
    start of the earliest slice, and ``valid: (P L,)``, False on them."""
    per_device = -(-length // devices)
    pad = devices * per_device - length
    return per_device, pad, jnp.arange(devices * per_device) >= pad


def _element(matrix, offset):
    """One affine map ``g -> matrix g + offset`` as an element of the scans (a stack of one)."""
    return Dense(matrix[None]), offset[None]


def _select(condition, on_true, on_false):
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def _front_edge(pad):
    def fn(a):
        return jnp.concatenate([jnp.repeat(a[:1], pad, axis=0), a]) if pad else a

    return fn


def _front_zeros(pad):
    def fn(a):
        return jnp.concatenate([jnp.zeros((pad, *a.shape[1:]), a.dtype), a]) if pad else a

    return fn
