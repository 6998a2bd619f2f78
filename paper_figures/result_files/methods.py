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
                            chain)
``sequential-jacobians-bK`` ``bppsa.Blocked(bppsa.SequentialScan(), K)``
==========================  ===================================================================

Each command takes some of these forms (a chain of layers has no chunked scan, a scan over time
no levels): :func:`parse` checks a name against them. Result files keep the names they were
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
FORMS = (
    BP,
    BPPSA,
    AUTO,
    BLELLOCH,
    BLELLOCH_LEVELS,
    BLELLOCH_BLOCKED,
    CHUNKED,
    CHUNKED_CHUNKS,
    CHUNKED_BLOCKED,
    SEQUENTIAL,
    SEQUENTIAL_JACOBIANS,
    SEQUENTIAL_JACOBIANS_BLOCKED,
)
ALIASES = {AUTO: BPPSA}
# The plain names in the library's own words: what bppsa.scan.resolve(name) turns into a method
# (the library's table of names; tests/experiments/test_methods.py checks every one).
LIBRARY = {
    BP: "sequential",
    BPPSA: "auto",
    AUTO: "auto",
    BLELLOCH: "blelloch",
    CHUNKED: "chunked",
    SEQUENTIAL: "sequential",
    SEQUENTIAL_JACOBIANS: "sequential-scan",
}

_PATTERNS = {
    BLELLOCH_LEVELS: re.compile(r"blelloch-(?P<levels>[0-9]+)"),
    BLELLOCH_BLOCKED: re.compile(r"blelloch-b(?P<block>[0-9]+)"),
    CHUNKED_CHUNKS: re.compile(r"chunked-(?P<chunks>[0-9]+)"),
    CHUNKED_BLOCKED: re.compile(r"chunked-(?P<chunks>[0-9]+)-b(?P<block>[0-9]+)"),
    SEQUENTIAL_JACOBIANS_BLOCKED: re.compile(r"sequential-jacobians-b(?P<block>[0-9]+)"),
}
_MEANINGS = {
    BLELLOCH_LEVELS: "K parallel levels",
    BLELLOCH_BLOCKED: "Blelloch in time blocks of K steps",
    CHUNKED_CHUNKS: "C chunks",
    CHUNKED_BLOCKED: "C chunks in time blocks of K steps",
    SEQUENTIAL_JACOBIANS_BLOCKED: "the sequential Jacobian scan in time blocks of K steps",
}

# Legend labels, names in crowded legends, and column heads of tables; other names show as is.
LABELS = {
    BP: "BP (jax.grad through lax.scan)",
    BPPSA: "BPPSA (bppsa.Auto)",
    BLELLOCH: "BPPSA, Blelloch scan (bppsa.Blelloch)",
    CHUNKED: "BPPSA, chunked scan (bppsa.Chunked)",
}
SHORT = {BP: "BP", BPPSA: "BPPSA", BLELLOCH: "Blelloch", CHUNKED: "Chunked"}
TABLE = {BP: "BP", BPPSA: "Auto()", BLELLOCH: "Blelloch()", CHUNKED: "Chunked()"}


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
    text = LABELS.get(canonical(name), name)
    if canonical(name) == BPPSA and resolved and "->" in resolved:
        text += f" = {resolved.split('->', 1)[1].strip()}"
    return text


def short(name: str) -> str:
    """A method's name in a crowded legend."""
    return SHORT.get(canonical(name), name)


def in_table(name: str) -> str:
    """A method's name as the head of a table's column (``Auto()``, ``Blelloch()``)."""
    return TABLE.get(canonical(name), name)
