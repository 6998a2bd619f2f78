"""``Auto()``'s picks, value by value, where the other tests leave an argument at one value: the
accelerator rule (the cost model's fastest candidate), the backend each call forwards, the
defaults of ``choose`` and ``parallel``, the footprint's fields that ``for_footprint`` passes on,
and the exact boundaries of the CPU rule (``parallel_work``, the smallest block, the smallest
work). No compilation: each test compares chosen methods."""

import dataclasses

import pytest

import bppsa
from bppsa.scan._core.memory import Footprint
from bppsa.scan._core.methods.auto import _parallel_pays
from bppsa.scan._core.profiles import profile_of
from bppsa.scan._profile import CPU, GPU

CPU = CPU
GPU = GPU
AUTO = bppsa.Auto()


def blocks(steps):
    return bppsa.Blocked(bppsa.SequentialScan(), steps)


def with_rules(**rules):
    """The CPU's profile with some of ``Auto()``'s thresholds changed."""
    return dataclasses.replace(CPU, rules=dataclasses.replace(CPU.rules, **rules))


def test_the_accelerator_profile_holds_the_rates_these_picks_assume():
    assert not GPU.measured_rules
    # No measured fused step: the kernel lab's estimates on the programs price it.
    assert GPU.rates == bppsa.Rates(flops=392e12, bandwidth=3.16e12, step_latency=7.94e-6)


@pytest.mark.parametrize(
    "length,size,options,chosen,parallel",
    [
        # The paper's small RNN: the parallel scan, with the cell's n floats or dense Jacobians.
        (1000, 20, dict(batch=16, element=20), bppsa.Blelloch(), bppsa.Blelloch()),
        (1000, 20, {}, bppsa.Blelloch(), bppsa.Blelloch()),  # one example, dense
        # A few steps: back-propagation's T launches are cheapest; of the scans, Chunked() at
        # T = 10 and Blelloch() at T = 30.
        (10, 20, dict(batch=16), bppsa.Sequential(), bppsa.Chunked()),
        (30, 20, dict(batch=16), bppsa.Sequential(), bppsa.Blelloch()),
        # n floats per step whose products are dense: Chunked() moves fewer bytes than
        # Blelloch(); diagonal maps (width 1) keep n floats through products: Blelloch().
        (1000, 256, dict(batch=16, element=256), bppsa.Chunked(), bppsa.Chunked()),
        (1000, 256, dict(batch=16, element=256, width=1), bppsa.Blelloch(), bppsa.Blelloch()),
        (1000, 256, dict(batch=16), bppsa.Blelloch(), bppsa.Blelloch()),
        # A large batch of dense maps: the scans' ~n-fold arithmetic outweighs T steps.
        (1000, 256, dict(batch=256), bppsa.Sequential(), bppsa.Blelloch()),
        (1000, 1024, dict(batch=256), bppsa.Sequential(), bppsa.Blelloch()),
    ],
)
def test_on_accelerators_auto_picks_the_predicted_fastest(length, size, options, chosen, parallel):
    times = AUTO.predictions(length, size, "gpu", **options)
    assert min(times, key=times.get) == chosen
    scans = {m: t for m, t in times.items() if m != bppsa.Sequential()}
    assert min(scans, key=scans.get) == parallel
    for auto, backend in ((AUTO, "gpu"), (bppsa.Auto(profile=GPU), "cpu")):
        assert auto.choose(length, size, backend, **options) == chosen
        assert auto.choose(length, size, backend, **options, jacobians=True) == parallel


@pytest.mark.parametrize(
    "fp,chosen,parallel",
    [
        (
            Footprint(
                length=1000, state=256, element=256, dense=256**2, itemsize=4, batch=16, size=256
            ),
            bppsa.Chunked(),
            bppsa.Chunked(),
        ),
        (
            Footprint(length=10, state=20, element=400, dense=400, itemsize=4, batch=16, size=20),
            bppsa.Sequential(),
            bppsa.Chunked(),
        ),
        (
            Footprint(
                length=1000,
                state=256,
                element=256,
                dense=256,
                itemsize=4,
                batch=16,
                size=256,
                width=1,
            ),
            bppsa.Blelloch(),
            bppsa.Blelloch(),
        ),
    ],
    ids=["n-floats", "short", "diagonal"],
)
def test_on_accelerators_a_footprint_gets_the_pick_for_its_fields(fp, chosen, parallel):
    assert AUTO.scan_method(fp, profile=GPU) == chosen
    assert AUTO.scan_method(fp, profile=GPU, jacobians=True) == parallel


# A measured profile under a backend name of its own, with smaller blocks than the CPU's: a pick
# by it differs from one by the default backend's profile, whichever that is.
BACKEND = "bppsa-test-measured"
MEASURED = dataclasses.replace(
    CPU,
    name="test",
    rules=dataclasses.replace(CPU.rules, block_work=2**12, structured_block_work=2**11),
)


@pytest.fixture
def measured_backend():
    bppsa.set_profile(BACKEND, MEASURED)
    try:
        yield BACKEND
    finally:
        bppsa.set_profile(BACKEND, None)


def test_every_call_chooses_by_the_profile_of_the_backend_it_is_given(measured_backend):
    # 2^12 / 20 = 204 steps -> 128; the CPU's 2^20 / 20 would give 8192.
    dense = dict(batch=1, element=20)
    assert AUTO.choose(1000, 20, measured_backend, **dense) == blocks(128)
    assert AUTO.choose(1000, 20, measured_backend, **dense, jacobians=True) == blocks(128)
    # Diagonal maps: 2^11 / 64 = 32 steps; the CPU's 2^19 / 64 would give 8192.
    diagonal = dict(batch=1, element=64, width=1)
    assert AUTO.choose(1000, 64, measured_backend, **diagonal) == blocks(32)
    assert AUTO.choose(1000, 64, measured_backend, **diagonal, jacobians=True) == blocks(32)
    fp = Footprint(length=1000, state=64, element=64, dense=64, itemsize=4, size=64, width=1)
    assert AUTO.scan_method(fp, profile=profile_of(measured_backend)) == blocks(32)
    assert AUTO.scan_method(fp, profile=profile_of(measured_backend), jacobians=True) == blocks(32)
    # The same calls on "cpu" and "gpu".
    assert AUTO.choose(1000, 64, "cpu", **diagonal) == blocks(8192)
    assert AUTO.scan_method(fp, profile=CPU, jacobians=True) == blocks(8192)
    assert AUTO.choose(1000, 64, "gpu", **diagonal) == bppsa.Blelloch()
    assert AUTO.scan_method(fp, profile=GPU) == bppsa.Blelloch()
    assert AUTO.scan_method(fp, profile=GPU, jacobians=True) == bppsa.Blelloch()


def test_parallel_defaults_to_one_example_of_dense_jacobians():
    # 2^20 / 400 = 2621 steps -> 2048; two examples: 1310 -> 1024.
    assert AUTO.choose(1000, 20, "cpu", jacobians=True) == blocks(2048)
    assert AUTO.choose(1000, 20, "cpu", batch=1, element=400, width=None, jacobians=True) == blocks(
        2048
    )
    assert AUTO.choose(1000, 20, "cpu", batch=2, jacobians=True) == blocks(1024)
    assert AUTO.choose(1000, 20, "cpu", batch=2, element=400, jacobians=True) == blocks(1024)


def test_choose_defaults_to_no_inputs():
    """With a profile that needs one input float per step, the default (none) keeps
    back-propagation where one input float scans: ``n = 128``, ``4 n`` floats, ``B = 5``."""
    auto = bppsa.Auto(profile=with_rules(inputs=1))
    options = dict(batch=5, element=4 * 128)
    assert auto.choose(256, 128, "cpu", **options) == bppsa.Sequential()
    assert auto.choose(256, 128, "cpu", **options, inputs=0) == bppsa.Sequential()
    assert auto.choose(256, 128, "cpu", **options, inputs=1) == blocks(256)  # 2^20 / 2560


@pytest.mark.parametrize(
    "size,batch,element,chosen",
    [
        (32, 1, 1024, blocks(1024)),  # exactly parallel_work Jacobian floats: 2^20 / 1024
        (32, 1, 1025, bppsa.Sequential()),  # one more (dense)
        (32, 2, 512, blocks(1024)),  # exactly, over two examples
        (32, 2, 513, bppsa.Sequential()),  # one more (not dense, too short, no inputs)
        (64, 4, 256, blocks(1024)),
        (64, 1, 1023, blocks(1024)),  # one less: 2^20 / 1023 = 1025 -> 1024
    ],
)
def test_on_cpus_the_scan_pays_up_to_exactly_parallel_work_floats(size, batch, element, chosen):
    assert CPU.rules.parallel_work == 1024
    assert AUTO.choose(100, size, "cpu", batch=batch, element=element) == chosen


def test_the_smallest_block_is_one_step():
    """With blocks allowed from one step, a budget of one Jacobian (or less) is one step, two
    Jacobians two steps."""
    profile = with_rules(
        block_work=1000,
        block_steps=(1, 8192),
        structured_block_work=1000,
        structured_block_steps=(1, 8192),
    )
    auto = bppsa.Auto(profile=profile)
    for element, steps in ((1000, 1), (999, 1), (1001, 1), (5000, 1), (500, 2), (334, 2)):
        assert auto.choose(10, 2000, "cpu", element=element, jacobians=True) == blocks(steps), (
            element
        )
        structured = auto.choose(10, 2000, "cpu", element=element, width=1, jacobians=True)
        assert structured == blocks(steps), element


def test_the_work_of_a_step_is_at_least_one_float():
    """With no upper bound on the blocks, one Jacobian float per step (or none) over one example
    is the whole budget in one block."""
    profile = with_rules(block_steps=(1, 2**30), structured_block_steps=(1, 2**30))
    auto = bppsa.Auto(profile=profile)
    assert auto.choose(5, 1, "cpu", element=1, jacobians=True) == blocks(2**20)
    assert auto.choose(5, 1, "cpu", element=0, jacobians=True) == blocks(2**20)
    assert auto.choose(5, 1, "cpu", element=2, jacobians=True) == blocks(2**19)
    assert auto.choose(5, 4, "cpu", element=1, width=1, jacobians=True) == blocks(2**19)


def test_a_footprint_passes_its_inputs_to_the_cpu_rule():
    """``n = 128``, ``4 n`` floats per step, ``B = 5``, ``T = 256``: two input floats per step
    scan (640 carry floats), none keep back-propagation."""
    fp = Footprint(
        length=256, state=128, element=512, dense=128**2, itemsize=4, batch=5, size=128, inputs=2
    )
    assert AUTO.scan_method(fp, profile=CPU) == blocks(256)  # 2^20 / 2560
    assert AUTO.scan_method(dataclasses.replace(fp, inputs=0), profile=CPU) == bppsa.Sequential()
    assert AUTO.scan_method(fp, profile=CPU, jacobians=True) == blocks(256)


def test_a_footprint_of_one_example_outside_vmap_keeps_back_propagation():
    """A diagonal map of ``n`` floats (under the profile's two per carry float)."""
    fp = Footprint(
        length=4096, state=1024, element=1024, dense=1024, itemsize=4, size=1024, width=1
    )
    outside = dataclasses.replace(fp, vmapped=False)
    assert outside.single and not fp.single
    assert AUTO.scan_method(outside, profile=CPU) == bppsa.Sequential()
    assert AUTO.scan_method(fp, profile=CPU) == blocks(512)  # 2^19 / 1024
    assert AUTO.scan_method(outside, profile=CPU, jacobians=True) == blocks(512)


def test_the_cpu_rule_defaults_to_a_vmapped_map_with_dense_products():
    """``_parallel_pays`` without ``single`` and ``structured`` (``Auto.choose`` passes both):
    ``n = 128``, ``B = 1``; ``n`` floats of a map scan, also for one example when passed."""
    assert _parallel_pays(CPU.rules, 100, 128, 1, 128, 0)
    assert not _parallel_pays(CPU.rules, 100, 128, 1, 128, 0, single=True)
    # 4 n floats over 4 examples, past parallel_work: only maps that keep a structure scan.
    assert not _parallel_pays(CPU.rules, 100, 128, 4, 512, 0)
    assert _parallel_pays(CPU.rules, 100, 128, 4, 512, 0, structured=True)


@pytest.mark.parametrize(
    "length,size,batch", [(10_000, 20, 16), (1000, 1024, 256), (30, 20, 16), (1000, 64, 1)]
)
def test_auto_is_the_profiles_choice_of_two_policies(length, size, batch):
    """The cost model on accelerators, the measured rules on CPUs: each a policy of its own."""
    fp = Footprint(
        length=length, state=size, element=size, dense=size * size, itemsize=4, batch=batch
    )
    for profile, rule in ((GPU, bppsa.scan.CostModel()), (CPU, bppsa.scan.MeasuredRules())):
        for jacobians in (False, True):
            expected = rule.scan_method(fp, profile=profile, jacobians=jacobians)
            assert AUTO.scan_method(fp, profile=profile, jacobians=jacobians) == expected
    # Asked for by name of the algorithm, whatever the backend's profile says.
    assert bppsa.scan.CostModel(profile=GPU).scan_method(fp, profile=CPU) == AUTO.scan_method(
        fp, profile=GPU
    )
    with pytest.raises(TypeError, match="CostModel: candidates must be"):
        bppsa.scan.CostModel(candidates=(3,))
    with pytest.raises(TypeError, match="MeasuredRules: profile must be"):
        bppsa.scan.MeasuredRules(profile="cpu")
