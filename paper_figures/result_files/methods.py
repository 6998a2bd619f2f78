"""The names of the backward methods, defined once: what the command lines of the experiments
and benchmarks take, what result files key their rows by, and the labels figures give them.

==========================  ===================================================================
name                        method (:mod:`experiments.methods` builds the object)
==========================  ===================================================================
``bp``                      back-propagation, JAX differentiating ``lax.scan``
                            (``bppsa.Sequential()``): the baseline of every comparison
``bppsa``                   ``bppsa.Auto()``, the library's default (the experiments' name)
``auto``                    ``bppsa.Auto()`` by the library's own name (the benchmarks'; their
                            result files and ``benchmarks/gpu.sh`` use it): an alias of ``bppsa``
``blelloch``                ``bppsa.Blelloch()``
``blelloch-K``              ``bppsa.Blelloch(levels=K)``: K parallel levels (over layers)
``chunked``                 ``bppsa.Chunked()``
``chunked-C``               ``bppsa.Chunked(C)``
``chunked-C-bK``            ``bppsa.Blocked(bppsa.Chunked(C), K)``
``sequential``              ``bppsa.Sequential()`` through ``bppsa.grad``
``sequential-jacobians``    ``bppsa.SequentialScan()``: a sequential scan over the
                            transposed Jacobians (over a pruned network's layers: the sparse
                            chain); ``sequential-scan``, the library's name, is an alias
``sequential-jacobians-bK`` ``bppsa.Blocked(bppsa.SequentialScan(), K)``
==========================  ===================================================================

One table, :data:`NAMES`, holds every form: the library's name of the method it runs, whether the
experiments take it over time and over layers, and its labels; the other tables here are views
of it. Each command takes some of these forms (a chain of layers has no chunked scan, a scan over
time no levels): :func:`parse` checks a name against them. Result files keep the names they were
written with; :func:`canonical` maps an alias to its name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

BP = "bp"
BPPSA = "bppsa"
AUTO = "auto"
BLELLOCH = "blelloch"
CHUNKED = "chunked"
SEQUENTIAL = "sequential"
SEQUENTIAL_JACOBIANS = "sequential-jacobians"
BASELINE = BP
# The forms with numbers in them: K levels, C chunks, blocks of K steps.
BLELLOCH_LEVELS = "blelloch-K"
BLELLOCH_BLOCKED = "blelloch-bK"
CHUNKED_CHUNKS = "chunked-C"
CHUNKED_BLOCKED = "chunked-C-bK"
SEQUENTIAL_JACOBIANS_BLOCKED = "sequential-jacobians-bK"


@dataclasses.dataclass(frozen=True)
class Form:
    """A form of method name: the method it runs, where it applies, how figures show it.

    Attributes:
        name: the name, or its form with ``K``/``C`` for the numbers (``chunked-C-bK``).
        library: the library's own name of the method class it runs (what
            :func:`bppsa.scan.resolve` takes); a ``-bK`` form runs it in blocks of K steps
            (``bppsa.Blocked``).
        pattern: for a form with numbers, the regular expression of its names (groups
            ``levels``, ``chunks``, ``block``) and what the numbers mean.
        over_time, over_layers: whether the experiments take it for a scan over time, and for
            a chain of layers.
        label, short, head: the legend label, the name in a crowded legend, a table's column
            head (default: the name itself).
    """

    name: str
    library: str
    pattern: tuple[str, str] | None = None
    over_time: bool = False
    over_layers: bool = False
    label: str | None = None
    short: str | None = None
    head: str | None = None


# The one table of names, in the order messages list them.
NAMES = (
    Form(BP, "sequential", over_time=True, over_layers=True,
         label="BP (jax.grad through lax.scan)", short="BP", head="BP"),
    Form(BPPSA, "auto", over_time=True, over_layers=True,
         label="BPPSA (bppsa.Auto)", short="BPPSA", head="Auto()"),
    Form(AUTO, "auto"),
    Form(BLELLOCH, "blelloch", over_time=True, over_layers=True,
         label="BPPSA, Blelloch scan (bppsa.Blelloch)", short="Blelloch", head="Blelloch()"),
    Form(BLELLOCH_LEVELS, "blelloch", (r"blelloch-(?P<levels>[0-9]+)", "K parallel levels"),
         over_layers=True),
    Form(BLELLOCH_BLOCKED, "blelloch",
         (r"blelloch-b(?P<block>[0-9]+)", "Blelloch in time blocks of K steps")),
    Form(CHUNKED, "chunked", over_time=True,
         label="BPPSA, chunked scan (bppsa.Chunked)", short="Chunked", head="Chunked()"),
    Form(CHUNKED_CHUNKS, "chunked", (r"chunked-(?P<chunks>[0-9]+)", "C chunks"), over_time=True),
    Form(CHUNKED_BLOCKED, "chunked", (r"chunked-(?P<chunks>[0-9]+)-b(?P<block>[0-9]+)",
                                      "C chunks in time blocks of K steps")),
    Form(SEQUENTIAL, "sequential"),
    Form(SEQUENTIAL_JACOBIANS, "sequential-scan", over_time=True, over_layers=True),
    Form(SEQUENTIAL_JACOBIANS_BLOCKED, "sequential-scan",
         (r"sequential-jacobians-b(?P<block>[0-9]+)",
          "the sequential Jacobian scan in time blocks of K steps")),
)  # fmt: skip
FORM = {form.name: form for form in NAMES}
# Other names of the same methods, resolved here: the library's own (the benchmarks' files and
# benchmarks/gpu.sh say "auto").
ALIASES = {AUTO: BPPSA, "sequential-scan": SEQUENTIAL_JACOBIANS}

# Views of the table.
FORMS = tuple(FORM)
OVER_TIME = tuple(form.name for form in NAMES if form.over_time)
OVER_LAYERS = tuple(form.name for form in NAMES if form.over_layers)
# The plain names in the library's own words (tests/experiments/test_methods.py checks them).
LIBRARY = {form.name: form.library for form in NAMES if form.pattern is None}
LABELS = {form.name: form.label for form in NAMES if form.label}
SHORT = {form.name: form.short for form in NAMES if form.short}
TABLE = {form.name: form.head for form in NAMES if form.head}
_PATTERNS = {form.name: re.compile(form.pattern[0]) for form in NAMES if form.pattern}
_MEANINGS = {form.name: form.pattern[1] for form in NAMES if form.pattern}


@dataclasses.dataclass(frozen=True)
class Name:
    """A method's name, parsed: its form (one of :data:`FORMS`) and the numbers in it."""

    name: str
    form: str
    levels: int | None = None
    chunks: int | None = None
    block: int | None = None


def parse(name: str, forms: Sequence[str] = FORMS) -> Name:
    """``name`` parsed, when it has one of ``forms``.

    Raises:
        ValueError: for a name of none of ``forms``, listing them.
    """
    for form in forms:
        pattern = _PATTERNS.get(form)
        if pattern is None:
            if name == form:
                return Name(name, form)
            continue
        match = pattern.fullmatch(name)
        if match is None:
            continue
        numbers = {key: int(value) for key, value in match.groupdict().items()}
        if all(value > 0 for key, value in numbers.items() if key != "levels"):
            return Name(name, form, **numbers)
    raise ValueError(f"method {name!r} is not known; expected one of: {listing(forms)}.")


def listing(forms: Sequence[str]) -> str:
    """``forms`` as a message lists them, e.g. ``bp, chunked-C (C chunks)``."""
    return ", ".join(f"{f} ({_MEANINGS[f]})" if f in _MEANINGS else f for f in forms)


def canonical(name: str) -> str:
    """The name an alias stands for (``auto`` -> ``bppsa``); any other name itself."""
    return ALIASES.get(name, name)


def label(name: str, resolved: str | None = None) -> str:
    """Legend label of a method, with what ``bppsa.Auto`` chose when ``resolved`` says it
    (``"Auto() -> <choice>"``)."""
    text = LABELS.get(canonical(name), canonical(name))
    if canonical(name) == BPPSA and resolved and "->" in resolved:
        text += f" = {resolved.split('->', 1)[1].strip()}"
    return text


def short(name: str) -> str:
    """A method's name in a crowded legend."""
    return SHORT.get(canonical(name), canonical(name))


def in_table(name: str) -> str:
    """A method's name as the head of a table's column (``Auto()``, ``Blelloch()``)."""
    return TABLE.get(canonical(name), canonical(name))
