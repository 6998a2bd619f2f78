"""``Auto()``: the library's policy, which picks a method for each scan and chain.

Two algorithms choose, each a policy of its own: :class:`CostModel` (the method the cost model
of :mod:`bppsa.scan._core.cost` predicts fastest on the profile's rates: accelerators) and
:class:`MeasuredRules` (the thresholds measured on this project's CPUs, the profile's
:class:`~bppsa.scan._profile.Rules`). ``Auto()`` is the one whose profile says which
(``measured_rules``). All three share the memory guard's fallbacks and the chain rule
(:class:`Choosing`).

On a profile that prices a fused step (:func:`~bppsa.scan._core.cost.fused_rated`: a measured
``fused_step_latency``, or the kernel lab's static estimates on its programs) the cost model
also ranks ``FusedSequential()`` (back-propagation's reverse loop in one kernel) for a scan
whose step the kernel runs (the footprint's ``fused_backward``, which the scan's decision asks
of :meth:`~bppsa.FusedSequential.why_not`, :func:`checked_footprint`; its plan's program gives
the estimate of a step, ``fused_backward_step``): where the kernel cannot, its
loop runs in ``lax.scan`` at the step latency, back-propagation's cost with more work, so it is
never ranked there. Nor where the Jacobians are scanned anyway (``jacobians``): it forms none.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from bppsa.scan._core import cost
from bppsa.scan._core.memory import Footprint, MemoryLimitError, keeps_structure
from bppsa.scan._core.methods import policy
from bppsa.scan._core.methods.base import Method, because
from bppsa.scan._core.methods.blelloch import Blelloch
from bppsa.scan._core.methods.blocked import Blocked
from bppsa.scan._core.methods.chunked import Chunked
from bppsa.scan._core.methods.fused_sequential import FusedSequential
from bppsa.scan._core.methods.sequential import Sequential
from bppsa.scan._core.methods.sequential_scan import SequentialScan
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import Profile, Rules

if TYPE_CHECKING:
    from bppsa.scan._core.problem import Problem


@dataclasses.dataclass(frozen=True)
class Question:
    """A scan as a choosing policy sees it: :meth:`Choosing.choose`'s arguments (``fused``:
    its ``fused_backward``; ``fused_step``: the static estimate of a step of
    ``FusedSequential()``'s loop, its plan's program's, a footprint's ``fused_backward_step``;
    ``None``: no plan)."""

    length: int
    size: int
    batch: int
    element: int | None
    inputs: int
    single: bool
    width: int | None
    jacobians: bool
    fused: bool
    fused_step: float | None = None


class Choosing(policy.Policy):
    """A policy that picks a method from a scan's footprint by a profile (:meth:`pick`), then
    holds it to the memory limit (the memory guard's first lower-memory method that fits) and
    picks a chain's method by the measured sparse-chain margin."""

    profile: Profile | None

    def profile_or(self, backend_profile: Profile) -> Profile:
        """The profile this policy chooses by, passed down to the kernels: its own, else the
        backend's (``backend_profile``)."""
        return self.profile or backend_profile

    @abc.abstractmethod
    def pick(self, profile: Profile, question: Question) -> Method:
        """The method for the scan of ``question`` (no memory limit) by ``profile``."""

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
        jacobians: bool = False,
        fused_backward: bool = False,
    ) -> Method:
        """The method used for a scan (no memory limit).

        Args:
            length: number of steps ``T``.
            size: floats of the differentiable carry of one example (``n``).
            backend: ``"cpu"``, ``"gpu"``, ... (default: JAX's default backend), whose profile
                it chooses by unless the policy has its own.
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
            jacobians: the method to use where the Jacobians are scanned anyway (a parallel
                forward's solves, the finiteness check): never ``Sequential()`` nor
                ``FusedSequential()``.
            fused_backward: whether ``FusedSequential()``'s kernel runs the scan's step
                (:meth:`bppsa.FusedSequential.why_not` is ``None``, which a scan's decision
                asks); then, on a profile that prices a fused step
                (:func:`~bppsa.scan._core.cost.fused_rated`), the cost model ranks it too, a
                step at the slowest of the programs' estimates (no plan says which program)
                unless the profile has a measured ``fused_step_latency``. Numbers alone do
                not say: by default it is not ranked.

        Returns:
            A method; ``Sequential()`` means plain back-propagation.
        """
        profile = self.profile_or(profile_of(backend))
        question = Question(
            length, size, batch, element, inputs, single, width, jacobians, fused_backward
        )
        return self.pick(profile, question)

    def scan_method(self, fp, limit=math.inf, *, profile, jacobians=False):
        """:meth:`pick` for a scan of footprint ``fp`` by ``profile`` (:meth:`profile_or`):
        plain back-propagation for a complex carry; else the pick within ``limit`` (plain
        back-propagation's too), else the first lower-memory method of the memory guard's
        list that fits (the profile's ``fallback_block``). ``FusedSequential()`` only where
        ``fp`` says its kernel runs the step (``fp.fused_backward is None``).

        Raises:
            MemoryLimitError: neither the pick nor any method of that list fits ``limit``
                (as for an explicit method; the error lists what was tried).
        """
        if fp.complex_leaves:
            return Sequential()
        profile = self.profile_or(profile)
        question = Question(
            fp.length,
            fp.size,
            fp.batch,
            fp.element,
            fp.inputs,
            fp.single,
            fp.width or None,
            jacobians,
            fp.fused_backward is None,
            fused_step=fp.fused_backward_step,
        )
        chosen = self.pick(profile, question)
        if limit is None or limit < math.inf:
            try:
                return policy.guard(chosen, fp, limit, self, profile=profile)
            except MemoryLimitError as err:
                if not err.alternatives:
                    raise
                return err.alternatives[0][0]
        return chosen

    def chain_method(self, work, *, profile):
        """The sequential sparse chain (``SequentialScan()``) where the pruning makes it cheaper
        than dense back-propagation by the measured margin (the profile's
        ``chain_sparse_cost``), else plain back-propagation (``Sequential()``: JAX's autodiff
        of the forward). The parallel levels' filled-in products never paid on a CPU
        (``experiments/pruned_vgg11.py benchmark``); they are not chosen."""
        cost_ratio = self.profile_or(profile).rules.chain_sparse_cost
        measured = work()
        if cost_ratio * measured.sparse < measured.dense:
            return SequentialScan()
        return Sequential()


def _check_candidates(owner: str, candidates) -> tuple[Method, ...] | None:
    """``candidates`` as a tuple (a list is taken), checked, naming ``owner``."""
    if candidates is None:
        return None
    if isinstance(candidates, list):
        candidates = tuple(candidates)
    if (
        not isinstance(candidates, tuple)
        or not candidates
        or not all(isinstance(m, Method) for m in candidates)
    ):
        raise TypeError(
            f"{owner}: candidates must be a non-empty tuple of methods, got {candidates!r}."
        )
    if not any(m.forms_jacobians for m in candidates):
        raise ValueError(
            f"{owner}: candidates need a method that scans the Jacobians (for the "
            f"finiteness check and the forward's solves), got {candidates!r}."
        )
    return candidates


def _check_profile(owner: str, profile) -> None:
    if profile is not None and not isinstance(profile, Profile):
        raise TypeError(
            f"{owner}: profile must be a bppsa.Profile or None, got {type(profile).__name__}."
        )


@dataclasses.dataclass(frozen=True)
class CostModel(Choosing):
    """The method the cost model (:mod:`bppsa.scan._core.cost`) predicts fastest among its
    ``candidates`` on the profile's rates (``Auto()``'s choice on accelerators).

    Attributes:
        profile: the measured constants it chooses by (``None``: the backend's).
        candidates: the methods it ranks (``None``: ``Sequential()``, ``Blelloch()``,
            ``Chunked()``, and ``FusedSequential()`` on a profile that prices a fused step:
            :func:`ranked`); any method with a ``cost``, a user's own too.

    Example:
        >>> from bppsa.scan._profile import GPU
        >>> bppsa.scan.CostModel(profile=GPU).choose(10_000, 20, batch=16, element=20)
        Blelloch()
    """

    profile: Profile | None = None
    candidates: tuple[Method, ...] | None = None

    def __post_init__(self):
        _check_profile("CostModel", self.profile)
        object.__setattr__(self, "candidates", _check_candidates("CostModel", self.candidates))

    def pick(self, profile, question):
        q = question
        candidates = ranked(self.candidates, profile, jacobians=q.jacobians, fused_backward=q.fused)
        fp = cost.footprint_of(q.length, q.size, q.batch, q.element, q.width)
        return _fastest(
            candidates, dataclasses.replace(fp, fused_backward_step=q.fused_step), profile
        )


@dataclasses.dataclass(frozen=True)
class MeasuredRules(Choosing):
    """The thresholds measured on this project's CPUs (the profile's
    :class:`~bppsa.scan._profile.Rules`; ``Auto()``'s choice there): time blocks of the
    sequential scan over the Jacobians where it beats back-propagation, else plain
    back-propagation.

    Attributes:
        profile: the measured constants it chooses by (``None``: the backend's).

    Example:
        >>> from bppsa.scan._profile import CPU
        >>> bppsa.scan.MeasuredRules(profile=CPU).choose(10_000, 20, batch=16, element=20)
        Blocked(method=SequentialScan(), block=2048)
    """

    profile: Profile | None = None

    def __post_init__(self):
        _check_profile("MeasuredRules", self.profile)

    def pick(self, profile, question):
        q = question
        element = _element(q.size, q.element)
        structured = keeps_structure(q.size, q.width)
        if not q.jacobians and not _parallel_pays(
            profile.rules, q.length, q.size, q.batch, element, q.inputs, q.single, structured
        ):
            return Sequential()
        work = max(q.batch * element, 1)
        if structured:
            # Structured steps are cheap to scan; the time blocks keep their arrays in cache.
            low, high = profile.rules.structured_block_steps
            block = _power_of_two(profile.rules.structured_block_work // work, low, high)
            return Blocked(SequentialScan(), block)
        low, high = profile.rules.block_steps
        return Blocked(SequentialScan(), _power_of_two(profile.rules.block_work // work, low, high))


@dataclasses.dataclass(frozen=True)
class Auto(Choosing):
    """Chooses a method from the sequence length, the Jacobian and batch sizes, and the backend.

    A policy (:class:`bppsa.scan._core.methods.policy.Policy`), passed as ``method=`` like a
    method; :func:`bppsa.trace_plans` records what it chose for each scan, :meth:`choose`
    says what it picks and :meth:`predictions` why, on accelerators.

    On accelerators it is the method the cost model of
    :mod:`bppsa.scan._core.cost` predicts fastest among its ``candidates``, by default
    back-propagation, ``Blelloch()``
    (``Theta(log T)`` levels) and ``Chunked()`` (:meth:`predictions` gives the predicted times:
    the parallel scans for the paper's small cells, back-propagation where their ~``n``-fold
    extra arithmetic outweighs the ``T`` dependent steps, e.g. ``n = 1024``, ``B = 256``), and,
    on a profile that prices a fused step (the H200's: the kernel lab's static estimates until
    measured), for a scan whose step the fused kernel runs, ``FusedSequential()``:
    back-propagation's loop in one kernel, where ``T`` is too short for a parallel scan to pay
    (:func:`ranked`). On
    CPUs, with only a few cores, the parallel levels' extra ``~n``-fold matrix work
    does not pay for itself (measured with ``benchmarks/speed.py``); there it is
    ``Blocked(SequentialScan(), K)``: a sequential scan over the transposed Jacobians,
    whose steps are single matrix-vector products, while the Jacobians and parameter gradients
    are computed for a block of ``K`` steps at once (``K`` chosen so that the block's arrays stay
    in cache); and where even that loses, for large batches, plain back-propagation
    (``Sequential()``). When the chosen method does not fit the memory limit, the first
    lower-memory method that does (see :func:`bppsa.estimate_memory`).

    Attributes:
        profile: the measured constants it chooses by (``None``: the backend's,
            :func:`bppsa.get_profile`).
        candidates: the methods the cost model ranks on accelerators (``None``:
            ``Sequential()``, ``Blelloch()``, ``Chunked()``, and ``FusedSequential()`` on a
            profile that prices a fused step: :func:`ranked`); any method with a ``cost``, a
            user's own too.

    Example:
        >>> bppsa.Auto().choose(10_000, 20, "cpu", batch=16, element=20)
        Blocked(method=SequentialScan(), block=2048)
        >>> bppsa.Auto().choose(10_000, 20, "gpu", batch=16, element=20)
        Blelloch()
        >>> bppsa.Auto().choose(64, 20, "gpu", batch=16, element=20, fused_backward=True)
        FusedSequential()
    """

    profile: Profile | None = None
    candidates: tuple[Method, ...] | None = None
    name: ClassVar[str] = "auto"

    def __post_init__(self):
        _check_profile("Auto", self.profile)
        object.__setattr__(self, "candidates", _check_candidates("Auto", self.candidates))

    def rule(self, profile: Profile) -> Choosing:
        """The algorithm that chooses by ``profile``: :class:`MeasuredRules` where it has
        measured rules (CPUs), else :class:`CostModel` over the ``candidates``."""
        if profile.measured_rules:
            return MeasuredRules(profile)
        return CostModel(profile, self.candidates)

    def pick(self, profile, question):
        return self.rule(profile).pick(profile, question)

    def predictions(
        self,
        length: int,
        size: int,
        backend: str | None = None,
        *,
        batch: int = 1,
        element: int | None = None,
        width: int | None = None,
        fused_backward: bool = False,
    ) -> dict[Method, float]:
        """Predicted seconds of the backward of each accelerator candidate (why
        :meth:`choose` picks what it picks there), from :mod:`bppsa.scan._core.cost`
        (``fused_backward``: as for :meth:`choose`).

        Example:
            >>> times = bppsa.Auto().predictions(1000, 1024, "gpu", batch=256)
            >>> min(times, key=times.get)
            Sequential()
        """
        profile = self.profile_or(profile_of(backend))
        candidates = ranked(self.candidates, profile, fused_backward=fused_backward)
        return _predicted(
            candidates, cost.footprint_of(length, size, batch, element, width), profile
        )


ACCELERATOR_CHOICES = (Sequential(), Blelloch(), Chunked())
FUSED_SEQUENTIAL = FusedSequential()


def ranked(
    candidates: tuple[Method, ...] | None,
    profile: Profile,
    *,
    jacobians: bool = False,
    fused_backward: bool = False,
) -> tuple[Method, ...]:
    """The methods the cost model ranks for a scan on ``profile``.

    Args:
        candidates: a policy's own (``None``: :data:`ACCELERATOR_CHOICES`, and
            ``FusedSequential()`` where ``profile`` prices a fused step:
            :func:`~bppsa.scan._core.cost.fused_rated`).
        profile: the rates the methods are ranked by.
        jacobians: the Jacobians are scanned anyway (a parallel forward's solves, the
            finiteness check): neither plain back-propagation nor ``FusedSequential()``, which
            forms none.
        fused_backward: whether ``FusedSequential()``'s kernel runs the scan's step; where it
            does not, its loop runs in ``lax.scan`` and its cost is not its kernel's.
    """
    if candidates is None:
        fused = cost.fused_rated(profile)
        candidates = ACCELERATOR_CHOICES + ((FUSED_SEQUENTIAL,) if fused else ())
    return tuple(
        m
        for m in candidates
        if (fused_backward and not jacobians if m.kernel_loop else m.keeps_carries or not jacobians)
    )


def checked_footprint(
    problem: Problem, profile: Profile, prepare: Callable[[Method], Any] | None = None
) -> Footprint:
    """``problem``'s footprint, with ``FusedSequential()``'s verdict on its kernel and the
    static estimate of a step of its loop (from its plan, ``prepare(FusedSequential())``;
    default: its ``prepare`` on ``profile``) where ``profile`` prices a fused step
    (:func:`~bppsa.scan._core.cost.fused_rated`); elsewhere the cost model never ranks the
    kernel, and the step is not traced for it."""
    fp = problem.footprint
    if not cost.fused_rated(profile):
        return fp
    made = (
        FUSED_SEQUENTIAL.prepare(problem, profile) if prepare is None else prepare(FUSED_SEQUENTIAL)
    )
    step = None if isinstance(made, str) else made.step_latency
    reason = because(made)
    if reason is None:  # planned: priced by its own estimate
        reason = cost.unpriced(profile, step)
    return dataclasses.replace(fp, fused_backward=reason, fused_backward_step=step)


def _predicted(candidates, fp: Footprint, profile: Profile) -> dict[Method, float]:
    """Predicted seconds of each candidate for a scan of footprint ``fp`` on ``profile``."""
    return {m: m.cost(fp).seconds(profile) for m in candidates}


def _fastest(candidates, fp: Footprint, profile: Profile) -> Method:
    times = _predicted(candidates, fp, profile)
    return min(times, key=lambda m: times[m])


def _power_of_two(steps: int, low: int, high: int) -> int:
    """The largest power of two up to ``steps``, within ``[low, high]``."""
    return min(max(1 << (max(steps, 1).bit_length() - 1), low), high)


def _parallel_pays(
    p: Rules, length, size, batch, element, inputs, single=False, structured=False
) -> bool:
    """Whether the blocked scan over the Jacobians beats back-propagation, by ``p``'s measured
    thresholds (see :class:`bppsa.Rules`); maps whose products keep a structure always do,
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
