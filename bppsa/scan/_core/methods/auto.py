"""``Auto()``: a policy that picks a concrete method for each scan."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bppsa.scan._core import cost
from bppsa.scan._core.memory import keeps_structure
from bppsa.scan._core.methods import policy
from bppsa.scan._core.methods.base import Method, memory_of
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.fallbacks import fallbacks
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._profile import Profile, get_profile


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

    profile: Profile | None = None
    name: ClassVar[str] = "auto"

    def __post_init__(self):
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise TypeError(
                f"Auto: profile must be a bppsa.Profile or None, got {type(self.profile).__name__}."
            )

    def profile_for(self, backend: str | None = None) -> Profile:
        """The profile this policy chooses by on ``backend``: its own, else the backend's
        (:func:`bppsa.get_profile`)."""
        return self.profile or get_profile(backend)

    def choose(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        inputs: int = 0,
        single: bool = False,
        width: int | None = None,
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
            single: one example outside ``jax.vmap`` (its ``lax.scan`` steps are
                matrix-vector products, faster than a vmapped batch of one): on CPUs the scan
                over the Jacobians must store the profile's ``single_element`` floats per
                state float to pay.
            width: the inner dimension of a product of two steps' maps when the maps keep a
                structure through products (``1`` diagonal, ``k`` for ``k x k`` blocks; then
                a product keeps ``element`` floats); default ``None``: products are dense.

        Returns:
            A concrete method; ``Sequential()`` means plain back-propagation.
        """
        profile = self.profile_for(backend)
        if not profile.measured_rules:
            return _fastest(ACCELERATOR_CHOICES, length, size, profile, batch, element, width)
        element = _element(size, element)
        structured = keeps_structure(size, width)
        if not _parallel_pays(profile, length, size, batch, element, inputs, single, structured):
            return Sequential()
        return self.parallel(length, size, backend, batch=batch, element=element, width=width)

    def parallel(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
    ) -> Method:
        """The method :meth:`choose` would use with the Jacobians (never ``Sequential()``)."""
        profile = self.profile_for(backend)
        if not profile.measured_rules:
            candidates = ACCELERATOR_CHOICES[1:]
            return _fastest(candidates, length, size, profile, batch, element, width)
        work = max(batch * _element(size, element), 1)
        if keeps_structure(size, width):
            # Structured steps are cheap to scan; the time blocks keep their arrays in cache.
            low, high = profile.structured_block_steps
            block = _power_of_two(profile.structured_block_work // work, low, high)
            return Blocked(SequentialScan(), block)
        low, high = profile.block_steps
        return Blocked(SequentialScan(), _power_of_two(profile.block_work // work, low, high))

    def predictions(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
    ) -> dict[Method, float]:
        """Predicted seconds of the backward of each accelerator candidate (why
        :meth:`choose` picks what it picks there), from :mod:`bppsa.scan._core.cost`.

        Example:
            >>> times = bppsa.Auto().predictions(1000, 1024, "gpu", batch=256)
            >>> min(times, key=times.get)
            Sequential()
        """
        profile = self.profile_for(backend)
        return _predicted(ACCELERATOR_CHOICES, length, size, profile, batch, element, width)

    def for_footprint(self, fp, backend: str | None = None, *, parallel: bool = False) -> Method:
        """:meth:`choose` (or :meth:`parallel`) for a scan of footprint ``fp``."""
        width = fp.width or None
        if parallel:
            return self.parallel(
                fp.length, fp.size, backend, batch=fp.batch, element=fp.element, width=width
            )
        return self.choose(
            fp.length,
            fp.size,
            backend,
            batch=fp.batch,
            element=fp.element,
            inputs=fp.inputs,
            single=fp.single,
            width=width,
        )

    def concrete(self, problem):
        return self.for_footprint(problem.footprint)

    def fit(self, fp, limit, backend: str | None = None):
        """The parallel method :meth:`parallel` picks, or else the first lower-memory method of
        the memory guard's list that fits (``Auto()``'s rule of
        :func:`bppsa.scan._core.methods.policy.fit`)."""
        chosen = self.for_footprint(fp, backend, parallel=True)
        need, limit_bytes = policy.bytes_needed(fp, chosen), policy.bytes_allowed(limit)
        if need <= limit_bytes:
            return chosen
        options = policy.lower_memory(fallbacks(self.profile_for(backend)), fp, need, limit_bytes)
        if options:
            return options[0][0]
        raise policy.memory_error(self, chosen, need, limit, limit_bytes, fp)

    def for_complex_carry(self, leaves):
        return Sequential()

    def for_chain(self, work: policy.ChainWork | None = None) -> Method:
        """The sequential sparse chain (``SequentialScan()``) where the pruning makes it cheaper
        than dense back-propagation by the measured margin (the profile's
        ``chain_sparse_cost``), else plain back-propagation (``Sequential()``: JAX's autodiff
        of the forward). The parallel levels' filled-in products never paid on a CPU
        (``experiments/pruned_vgg11.py benchmark``); they are not chosen."""
        cost_ratio = self.profile_for().chain_sparse_cost
        if work is not None and cost_ratio * work.sparse < work.dense:
            return SequentialScan()
        return Sequential()


@policy.fit.register
def _fit(method: Auto, fp, limit, backend=None):
    return method.fit(fp, limit, backend)


@policy.for_chain.register
def _for_chain(method: Auto, work):
    return method.for_chain(work())


@policy.checking.register
def _checking(method: Auto, problem):
    # The finiteness check is part of the Jacobian backward: Auto's parallel pick.
    return method.for_footprint(problem.footprint, parallel=True)


ACCELERATOR_CHOICES = (Sequential(), Blelloch(), Chunked())


def _predicted(candidates, length, size, profile, batch, element, width) -> dict[Method, float]:
    """Predicted seconds of each candidate on ``profile``."""
    fp = cost.footprint_of(length, size, batch, element, width)
    return {m: m.cost(fp).seconds(profile) for m in candidates}


def _fastest(candidates, length, size, profile, batch, element, width) -> Method:
    times = _predicted(candidates, length, size, profile, batch, element, width)
    return min(times, key=times.get)


def _power_of_two(steps: int, low: int, high: int) -> int:
    """The largest power of two up to ``steps``, within ``[low, high]``."""
    return min(max(1 << (max(steps, 1).bit_length() - 1), low), high)


def _parallel_pays(
    p: Profile, length, size, batch, element, inputs, single=False, structured=False
) -> bool:
    """Whether the blocked scan over the Jacobians beats back-propagation, by ``p``'s measured
    thresholds (see :class:`bppsa.Profile`); maps whose products keep a structure always do,
    except for one example outside ``jax.vmap``."""
    if single and element < p.single_element * size:
        return False
    if structured or batch * element <= p.parallel_work:
        return True
    if element >= size * size:  # dense Jacobians: the chain's steps are full products
        return False
    if length >= p.long:  # structured: cheap chain steps, a saving that grows with T
        return batch * size <= p.parallel_state
    if inputs < p.inputs or length < p.inputs_length:
        return False
    return batch * size <= p.inputs_state[length >= 2 * p.inputs_length]


def _element(size: int, element: int | None) -> int:
    return size * size if element is None else element


@memory_of.register
def _memory(method: Auto, fp):
    return method.for_footprint(fp).memory(fp)
