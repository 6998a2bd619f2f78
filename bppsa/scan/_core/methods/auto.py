"""``Auto()``: a policy that picks a concrete method for each scan."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from bppsa.scan._core import cost, memory
from bppsa.scan._core.methods import policy
from bppsa.scan._core.methods.base import LayerScan, Method
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.fallbacks import FALLBACKS
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._core.methods.sequential_scan import SequentialScan

# Auto() on CPUs. Blocks of about CPU_BLOCK_WORK / work steps ("work": Jacobian floats per step
# summed over the vmapped batch; a power of two within CPU_BLOCK_STEPS) keep a block's arrays in
# cache while amortizing a block's fixed costs (its ~25 kernels cost about 5 us each at small
# batches). Measured at T = 10k, H = 20 (benchmarks/speed.py's problem, backward medians of 7
# interleaved rounds, three processes each, 2-core CPU): the GRU at B = 1 2.85-3.76 ms with blocks
# of 8192 against 3.76-4.06 ms with 1024, at B = 16 31.1-32.7 ms with 512 against 36.5-39.5 ms with
# 256; the RNN at B = 1 and B = 16 within the spread either way (8192 vs 1024: 1.83-2.29 vs
# 1.83-1.95 ms; 2048 vs 1024: 13.2-18.3 vs 12.8-20.8 ms). Back-propagation itself is faster for
# large batches: above CPU_PARALLEL_WORK; from CPU_LONG steps on, structured Jacobians (fewer floats
# than n^2 per step) stay parallel up to CPU_PARALLEL_STATE carry floats per step (batch x n)
# instead, because the saving grows with T while a block's fixed costs do not. Measured with
# benchmarks/speed.py on a 2-core CPU (BP backward / Auto's parallel pick, medians): GRU H = 20,
# B = 16: 0.40x at T = 100, 0.84x at T = 1000, 1.8x at T = 10k; B = 32 at T = 10k: 1.18x; RNN
# H = 20, B = 16 1.7x at T = 100; at T = 10k the RNN B = 128 1.24x, B = 256 0.77-1.0x; three
# processes each, single input: GRU B = 16 with blocks of 512 at T = 2000 1.03-1.41x (BP kept below
# CPU_LONG), at T = 3000 1.47-1.98x; RNN at T = 2500 B = 64 (blocks of 512) 1.77-1.91x, B = 128
# (256) 0.98-1.15x. The LSTM's dense (40 x 40) Jacobians: 0.5x at B = 1. With CPU_INPUTS floats or
# more of xs per step (features rather than the benchmark's single bit), BP's loop carries the input
# weights' cotangents too, and structured Jacobians stay parallel from CPU_INPUTS_LENGTH steps up to
# CPU_INPUTS_STATE[0] carry floats per step over the batch, from twice as many steps up to
# CPU_INPUTS_STATE[1]. Measured (GRU H = 20, backward medians, 2-core CPU; three runs of the IRMAS
# breakdown, S / M / L = T 259 / 517 / 1034 with F = 38 / 24 / 12): B = 16
# 1.46-1.79x / 1.46-1.91x / 1.45-2.10x, B = 32 1.49-1.61x / 1.63-1.68x / 1.33-1.78x, B = 64
# 0.94-1.44x / 1.45-1.60x / 2.07-2.40x; T = 1000, B = 16: F = 2 1.94x, F = 4 1.8-2.0x (F = 1
# 0.75-1.4x); T = 300, B = 32: F = 2 1.14x, F = 8 1.41x; F = 8 at T = 100, B = 16 1.01x and at
# T = 300, B = 128 0.95x.
CPU_BLOCK_WORK = 2**20
CPU_BLOCK_STEPS = (64, 8192)
CPU_PARALLEL_WORK = 1024
CPU_PARALLEL_STATE = 4096
CPU_LONG = 2048
CPU_INPUTS, CPU_INPUTS_LENGTH, CPU_INPUTS_STATE = 2, 256, (640, 1280)

# Auto() on a chain of layers: what a multiply-add of the sequential sparse chain (gathers and
# a segmented sum) costs in units of one of the dense backward's convolutions. Measured on
# VGG-11 at 32x32 on a 2-core CPU (backward = grad - forward, medians of 7 interleaved rounds):
# the dense/sparse multiply-add ratio of the convolutions and the measured backward speedup
# of the sparse chain over jax.grad were 13.4 -> 0.75x (B = 1), 1.2x (B = 4), 1.9x (B = 16)
# at 90% pruning; 44 -> 3.0-3.2x at 97%; 133 -> 5.1-9.4x at 99%. The break-even ratio is thus
# about 10-18; 15 keeps dense back-propagation at 90% and takes the chain from ~91% on
# (VGG-11, 32x32, layer pruning: the ratio is 13.4 at 90%, 16.7 at 92%, 44.6 at 97%).
CHAIN_SPARSE_COST = 15.0


@dataclasses.dataclass(frozen=True)
class Auto(Method):
    """Chooses a method from the sequence length, the Jacobian and batch sizes, and the backend.

    :meth:`choose` says what it picks. On accelerators it is the method the cost model of
    :mod:`bppsa.scan._core.cost` predicts fastest among back-propagation, ``Blelloch()``
    (``Theta(log T)`` levels) and ``Chunked()`` (:meth:`predictions` gives the predicted times:
    the parallel scans for the paper's small cells, back-propagation where their ~``n``-fold
    extra arithmetic outweighs the ``T`` dependent steps, e.g. ``n = 1024``, ``B = 256``). On
    CPUs, with only a few cores, the parallel levels' extra ``~n``-fold matrix work
    does not pay for itself (measured with ``benchmarks/speed.py``); there it is
    ``Blocked(SequentialScan(), K)``: a sequential scan over the transposed Jacobians,
    whose steps are single matrix-vector products, while the Jacobians and parameter gradients
    are computed for a block of ``K`` steps at once (``K`` chosen so that the block's arrays stay
    in cache); and where even that loses, for large batches, plain back-propagation
    (``Sequential()``). When the chosen method does not fit the memory limit, the first
    lower-memory method that does (see :func:`bppsa.estimate_memory`).

    Example:
        >>> bppsa.Auto().choose(10_000, 20, "cpu", batch=16, element=20)
        Blocked(method=SequentialScan(), block=2048)
        >>> bppsa.Auto().choose(10_000, 20, "gpu", batch=16, element=20)
        Blelloch()
    """

    name: ClassVar[str] = "auto"
    chain_needs_work: ClassVar[bool] = True

    def choose(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        inputs: int = 0,
    ) -> Method:
        """The method used for a scan.

        Args:
            length: number of steps ``T``.
            size: floats of the differentiable carry of one example (``n``).
            backend: ``"cpu"``, ``"gpu"``, ... (default: JAX's default backend).
            batch: examples served at once through ``jax.vmap``.
            element: floats of one step's transposed Jacobian as stored (e.g. ``n`` for the
                RNN's ``W^T diag(d)``, ``4n`` for the GRU's); default ``n * n`` (dense).
            inputs: floats of one step's floating-point ``xs`` for one example (the features
                per frame); on CPUs more of them favour the parallel methods.

        Returns:
            A concrete method; ``Sequential()`` means plain back-propagation.
        """
        if not _on_cpu(backend):
            return _fastest(ACCELERATOR_CHOICES, length, size, backend, batch, element)
        if not _parallel_pays_on_cpu(length, size, batch, _element(size, element), inputs):
            return Sequential()
        return self.parallel(length, size, backend, batch=batch, element=element)

    def parallel(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
    ) -> Method:
        """The method :meth:`choose` would use with the Jacobians (never ``Sequential()``)."""
        if not _on_cpu(backend):
            return _fastest(ACCELERATOR_CHOICES[1:], length, size, backend, batch, element)
        work = max(batch * _element(size, element), 1)
        low, high = CPU_BLOCK_STEPS
        block = min(max(1 << (max(CPU_BLOCK_WORK // work, 1).bit_length() - 1), low), high)
        return Blocked(SequentialScan(), block)

    def predictions(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
    ) -> dict[Method, float]:
        """Predicted seconds of the backward of each accelerator candidate (why
        :meth:`choose` picks what it picks there), from :mod:`bppsa.scan._core.cost`.

        Example:
            >>> times = bppsa.Auto().predictions(1000, 1024, "gpu", batch=256)
            >>> min(times, key=times.get)
            Sequential()
        """
        return _predicted(ACCELERATOR_CHOICES, length, size, backend, batch, element)

    def for_footprint(self, fp, backend: str | None = None, *, parallel: bool = False) -> Method:
        """:meth:`choose` (or :meth:`parallel`) for a scan of footprint ``fp``."""
        if parallel:
            return self.parallel(fp.length, fp.size, backend, batch=fp.batch, element=fp.element)
        return self.choose(
            fp.length, fp.size, backend, batch=fp.batch, element=fp.element, inputs=fp.inputs
        )

    def concrete(self, problem):
        return self.for_footprint(problem.footprint)

    def memory(self, fp):
        return self.for_footprint(fp).memory(fp)

    def fit(self, fp, limit, backend: str | None = None):
        """The parallel method :meth:`parallel` picks, or else the first lower-memory method of
        the memory guard's list that fits (``Auto()``'s rule of
        :func:`bppsa.scan._core.methods.policy.fit`)."""
        chosen = self.for_footprint(fp, backend, parallel=True)
        need = chosen.memory(fp)
        limit_bytes = memory.available_bytes() if limit is None else limit
        if need <= limit_bytes:
            return chosen
        options = policy.lower_memory(FALLBACKS, fp, need, limit_bytes)
        if options:
            return options[0][0]
        raise policy.memory_error(self, chosen, need, limit, limit_bytes, fp)

    def for_complex_carry(self, leaves):
        return Sequential()

    def for_chain(self, work=None):
        """The sequential sparse chain where the pruning makes it cheaper than dense
        back-propagation by the measured margin, else plain back-propagation (JAX's autodiff
        of the forward); see :data:`CHAIN_SPARSE_COST`. The parallel levels' filled-in products
        never paid on a CPU (``experiments/pruned_vgg11.py benchmark``); they are not chosen."""
        if work is not None and CHAIN_SPARSE_COST * work.sparse < work.dense:
            return LayerScan(levels=0)
        return LayerScan(autodiff=True)


@policy.fit.register
def _fit(method: Auto, fp, limit, backend=None):
    return method.fit(fp, limit, backend)


ACCELERATOR_CHOICES = (Sequential(), Blelloch(), Chunked())


def _predicted(candidates, length, size, backend, batch, element) -> dict[Method, float]:
    """Predicted seconds of each candidate on ``backend``'s profile (an H200 where none is
    known)."""
    fp, profile = cost.footprint_of(length, size, batch, element), cost.profile_of(backend)
    return {m: m.cost(fp).seconds(profile) for m in candidates}


def _fastest(candidates, length, size, backend, batch, element) -> Method:
    times = _predicted(candidates, length, size, backend, batch, element)
    return min(times, key=times.get)


def _parallel_pays_on_cpu(length: int, size: int, batch: int, element: int, inputs: int) -> bool:
    if batch * element <= CPU_PARALLEL_WORK:
        return True
    if element >= size * size:  # dense Jacobians: the chain's steps are full products
        return False
    if length >= CPU_LONG:  # structured: cheap chain steps, a saving that grows with T
        return batch * size <= CPU_PARALLEL_STATE
    if inputs < CPU_INPUTS or length < CPU_INPUTS_LENGTH:
        return False
    return batch * size <= CPU_INPUTS_STATE[length >= 2 * CPU_INPUTS_LENGTH]


def _on_cpu(backend: str | None) -> bool:
    return (jax.default_backend() if backend is None else backend) == "cpu"


def _element(size: int, element: int | None) -> int:
    return size * size if element is None else element
