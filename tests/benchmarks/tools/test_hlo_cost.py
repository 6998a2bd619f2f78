"""The HLO cost model: counts of small jitted programs against their analytic work, counts of
hand-written HLO against the rules by hand, and the profile fit on synthetic timings."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.tools import hlo_cost
from bppsa.scan._core.cost import Cost
from bppsa.scan._profile import Profile, Rates

F32 = 4
TF = hlo_cost.TRANSCENDENTAL_FLOPS


def compiled(f, *args):
    return jax.jit(f).lower(*args).compile()


def test_matmul_counts_its_flops_and_bytes():
    a, b = jnp.ones((32, 48)), jnp.ones((48, 16))
    count = hlo_cost.count(compiled(jnp.matmul, a, b))
    assert 2 * 32 * 48 * 16 <= count.flops < 1.5 * 2 * 32 * 48 * 16
    assert count.steps >= 1
    assert count.bytes >= F32 * (a.size + b.size + 32 * 16)
    assert count.cost() == Cost(count.steps, count.flops, count.bytes)


def test_scan_multiplies_its_body_by_the_known_trip_count():
    def f(h, w):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), h, None, length=37)[0]

    count = hlo_cost.count(compiled(f, jnp.ones((4, 8)), jnp.ones((8, 8))))
    assert count.flops >= 37 * 2 * 4 * 8 * 8
    assert count.steps >= 37
    assert count.unknown_loops == 0


def test_while_loop_without_trip_count_uses_the_given_one():
    def f(x):
        return jax.lax.while_loop(lambda x: x.sum() < 100.0, lambda x: 2.0 * x, x)

    program = compiled(f, jnp.ones((4, 8)))
    outside, once, ten = (hlo_cost.count(program, unknown_trip_count=n) for n in (0, 1, 10))
    assert once.unknown_loops >= 1
    assert once.steps > outside.steps
    assert ten.steps - outside.steps == 10 * (once.steps - outside.steps)


def test_gradient_of_a_scan_moves_bytes_linear_in_its_length():
    # The stacked states are read and written one slice per step, not whole.
    def loss(w, h0, xs):
        hs = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h0, xs)[1]
        return (hs**2).sum()

    B, H = 16, 20
    counts = [
        hlo_cost.count(compiled(jax.grad(loss), jnp.ones((H, H)), jnp.ones((B, H)), jnp.ones(s)))
        for s in [(50, B, H), (100, B, H)]
    ]
    assert counts[1].flops >= 3 * 100 * 2 * B * H * H  # forward, two backward products
    assert counts[1].bytes < 2.2 * counts[0].bytes
    assert counts[1].unknown_loops == 0


FUSED_DOT = """HloModule m

%fused (p0: f32[8,4], p1: f32[4,6]) -> f32[8,6] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[4,6]{1,0} parameter(1)
  %d = f32[8,6]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[8,6]{1,0} tanh(%d), metadata={op_name="jit(f)/tanh"}
}

ENTRY %main (a: f32[8,4], b: f32[4,6]) -> f32[8,6] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4,6]{1,0} parameter(1)
  ROOT %f = f32[8,6]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused
}
"""


def test_fusion_is_one_kernel_with_the_flops_inside():
    count = hlo_cost.count(FUSED_DOT)
    assert count == hlo_cost.HloCount(1, 2 * 8 * 6 * 4 + TF * 8 * 6, F32 * (32 + 24 + 48), 0)


BRANCHES = """%cheap (x: f32[16]) -> f32[16] {
  ROOT %x = f32[16]{0} parameter(0)
}

%costly (x: f32[16]) -> f32[16] {
  %x = f32[16]{0} parameter(0)
  %e = f32[16]{0} exponential(%x)
  ROOT %n = f32[16]{0} negate(%e)
}
"""


@pytest.mark.parametrize(
    "call",
    [
        "s32[] parameter(0)\n  ROOT %c = f32[16]{0} conditional(%p, %x, %x), "
        "branch_computations={%cheap, %costly}",
        "pred[] parameter(0)\n  ROOT %c = f32[16]{0} conditional(%p, %x, %x), "
        "true_computation=%costly, false_computation=%cheap",
    ],
)
def test_conditional_costs_its_costliest_branch(call):
    entry = "ENTRY %main (p: s32[], x: f32[16]) -> f32[16] {\n  %x = f32[16]{0} parameter(1)\n"
    count = hlo_cost.count(BRANCHES + entry + f"  %p = {call}\n}}\n")
    assert count == hlo_cost.HloCount(2, 16 * TF + 16, 2 * 2 * F32 * 16, 0)


LOOP = """%body (s: (s32[], f32[10,4])) -> (s32[], f32[10,4]) {
  %s = (s32[], f32[10,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %v = f32[10,4]{1,0} get-tuple-element(%s), index=1
  %w = f32[10,4]{1,0} multiply(%v, %v)
  ROOT %r = (s32[], f32[10,4]{1,0}) tuple(%next, %w)
}

%cond (s: (s32[], f32[10,4])) -> pred[] {
  %s = (s32[], f32[10,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[10,4]) -> f32[10,4] {
  %x = f32[10,4]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], /*index=1*/f32[10,4]{1,0}) tuple(%zero, %x)
  %loop = (s32[], f32[10,4]{1,0}) while(%init), condition=%cond, body=%body%CONFIG%
  ROOT %out = f32[10,4]{1,0} get-tuple-element(%loop), index=1
}
"""
# Per iteration: add (12 bytes), multiply (40 flops, 3 x 160 bytes), compare (9 bytes).
ITERATION = hlo_cost.HloCount(3, 1 + 40 + 1, 12 + 480 + 9)


def test_tuple_while_multiplies_body_and_condition():
    known = LOOP.replace("%CONFIG%", ', backend_config={"known_trip_count":{"n":"7"}}')
    count = hlo_cost.count(known, unknown_trip_count=100)
    assert count == hlo_cost.HloCount(7 * 3, 7 * 42.0, 7 * 501.0, 0)
    unknown = hlo_cost.count(LOOP.replace("%CONFIG%", ""), unknown_trip_count=5)
    assert unknown == hlo_cost.HloCount(5 * 3, 5 * 42.0, 5 * 501.0, 1)


SLICED = """%update (buf: f32[100,8], i: s32[], u: f32[1,8]) -> f32[100,8] {
  %buf = f32[100,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %u = f32[1,8]{1,0} parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[100,8]{1,0} dynamic-update-slice(%buf, %u, %i, %z)
}

%read (buf: f32[100,8], i: s32[]) -> f32[1,8] {
  %buf = f32[100,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %s = f32[1,8]{1,0} dynamic-slice(%buf, %i, %z), dynamic_slice_sizes={1,8}
  ROOT %e = f32[1,8]{1,0} exponential(%s)
}

ENTRY %main (buf: f32[100,8], i: s32[]) -> f32[100,8] {
  %buf = f32[100,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %row = f32[1,8]{1,0} fusion(%buf, %i), kind=kLoop, calls=%read
  ROOT %new = f32[100,8]{1,0} fusion(%buf, %i, %row), kind=kLoop, calls=%update
}
"""


def test_fusions_read_and_write_slices_of_their_buffers():
    row = F32 * 8
    count = hlo_cost.count(SLICED)
    assert count == hlo_cost.HloCount(2, 8.0 * TF, (row + 4 + row) + (4 + row + row), 0)


def test_unknown_opcodes_move_data_and_bad_lines_are_skipped():
    text = """ENTRY %main (x: f32[16]) -> f32[16] {
  %x = f32[16]{0} parameter(0)
  %garbage = this is not an instruction
  ROOT %y = f32[16]{0} frobnicate(%x), foo={bar}
}
"""
    assert hlo_cost.count(text) == hlo_cost.HloCount(1, 0.0, 2.0 * F32 * 16, 0)


def test_count_rejects_what_is_not_compiled_hlo():
    with pytest.raises(TypeError, match="hlo"):
        hlo_cost.count(3)
    with pytest.raises(ValueError, match="ENTRY"):
        hlo_cost.count(jax.jit(jnp.sin).lower(1.0).as_text())  # StableHLO
    with pytest.raises(ValueError, match="unknown_trip_count"):
        hlo_cost.count(FUSED_DOT, unknown_trip_count=-1)


TRUE = Profile("true", Rates(flops=2e11, bandwidth=5e10, step_latency=2e-5))
STEPS = [1, 10, 100, 1000, 5, 50, 2, 20, 200, 3]
FLOPS = [1e3, 1e9, 1e6, 1e11, 1e10, 1e5, 1e12, 1e8, 1e7, 1e9]
BYTES = [1e4, 1e6, 1e10, 1e5, 1e8, 1e9, 1e7, 1e11, 1e4, 1e9]


def test_fit_profile_recovers_the_predictions_of_a_known_profile():
    costs = [Cost(*c) for c in zip(STEPS, FLOPS, BYTES)]
    samples = [(c, c.seconds(TRUE)) for c in costs]
    fitted = hlo_cost.fit_profile(samples, "fitted")
    assert fitted.name == "fitted"
    assert all(0.9 < ratio < 1.1 for ratio in hlo_cost.errors(samples, fitted))
    assert hlo_cost.errors(samples, TRUE) == pytest.approx([1.0] * len(samples))
    assert hlo_cost.fit_profile(samples, "fitted") == fitted  # deterministic


def test_fit_profile_rejects_empty_or_zero_samples():
    with pytest.raises(ValueError, match="samples"):
        hlo_cost.fit_profile([], "x")
    with pytest.raises(ValueError, match="samples"):
        hlo_cost.fit_profile([(Cost(0, 0, 0), 1.0)], "x")


def test_the_gradient_of_a_vmapped_bppsa_scan_is_counted():
    """BPPSA's compiled backward (blocks, the chain, fusions without operands such as iotas)
    parses: more kernels than its forward, and flops at least the chain's."""
    import bppsa
    from bppsa.models import RNN, rnn_cell

    params = RNN().init(1, 4, key=jax.random.key(0))
    xs = jnp.ones((3, 50, 1))

    def loss(params, xs):
        def one(x):
            h, _ = bppsa.scan(lambda h, x_t: (rnn_cell(params, h, x_t), None), jnp.zeros(4), x)
            return jnp.sum(h)

        return jnp.sum(jax.vmap(one)(xs))

    method = bppsa.Blocked(bppsa.SequentialScan(), 16)
    grad = hlo_cost.count(jax.jit(bppsa.grad(loss, method=method)).lower(params, xs).compile())
    forward = hlo_cost.count(jax.jit(loss).lower(params, xs).compile())
    assert grad.unknown_loops == 0
    assert grad.steps > forward.steps + 50
    assert grad.flops >= forward.flops + 50 * 3 * 2 * 4 * 4
