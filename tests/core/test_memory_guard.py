"""The memory guard's comparison at its boundary: a backward that needs exactly the limit fits,
one byte less does not (for an explicit method: the error; for ``Auto()``: a fallback), and
the alternatives it lists all fit."""

import pytest

import bppsa
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods import policy
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import CPU

FP = Footprint(length=10_000, state=20, element=20, dense=400, itemsize=4, batch=16)
METHODS = [bppsa.Blelloch(), bppsa.Chunked(), bppsa.Blocked(bppsa.SequentialScan(), 256)]


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_an_explicit_method_fits_a_limit_of_exactly_its_estimate(method):
    need = method.memory(FP)
    assert policy.guard(method, FP, need, profile=CPU) == method
    with pytest.raises(bppsa.MemoryLimitError) as error:
        policy.guard(method, FP, need - 1, profile=CPU)
    assert (error.value.estimate, error.value.limit) == (need, need - 1)
    # Every alternative it offers needs less than the method and fits the limit.
    for alternative, bytes_ in error.value.alternatives:
        assert bytes_ == alternative.memory(FP) and bytes_ <= need - 1


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_auto_keeps_its_choice_at_a_limit_of_exactly_its_estimate(backend):
    chosen = bppsa.Auto().scan_method(FP, float("inf"), profile=profile_of(backend), jacobians=True)
    need = chosen.memory(FP)
    assert bppsa.Auto().scan_method(FP, need, profile=profile_of(backend), jacobians=True) == chosen
    fallback = bppsa.Auto().scan_method(FP, need - 1, profile=profile_of(backend), jacobians=True)
    assert fallback != chosen and fallback.memory(FP) <= need - 1
