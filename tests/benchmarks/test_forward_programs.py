"""The forward-program diagnostic: its HLO reader on a hand-written module, and on the compiled
programs of a tiny problem (the standalone forward keeps no residuals, the forward of
``jax.vjp`` stacks them; its ``vjp`` is the harness's forward program); no timing is asserted."""

import json

import jax

from benchmarks import forward_programs, speed
from experiments import timing

MODULE = """HloModule jit_f, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_add (p0: f32[4], p1: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %tanh.1 = f32[4]{0} tanh(%p0)
  ROOT %add.1 = f32[4]{0} add(%tanh.1, %p1)
}

%inner_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %y = f32[4]{0} copy(%x)
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %y)
}

%inner_cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %c = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (t: (s32[], f32[4], f32[8,4])) -> (s32[], f32[4], f32[8,4]) {
  %t = (s32[], f32[4]{0}, f32[8,4]{1,0}) parameter(0)
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %f = f32[4]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %g = f32[4]{0} custom-call(%f), custom_call_target="__cublas$gemm"
  %w = (s32[], f32[4]{0}) while(%t), condition=%inner_cond, body=%inner_body
  ROOT %r = (s32[], f32[4]{0}, f32[8,4]{1,0}) tuple(%i, %g, %s)
}

%cond (t: (s32[], f32[4], f32[8,4])) -> pred[] {
  %t = (s32[], f32[4]{0}, f32[8,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %c = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %init = (s32[], f32[4]{0}, f32[8,4]{1,0}) tuple(%x, %x, %x)
  %loop = (s32[], f32[4]{0}, f32[8,4]{1,0}) while(%init), condition=%cond, body=%body, CONFIG
  ROOT %out = f32[4]{0} get-tuple-element(%loop), index=1
}
""".replace("CONFIG", 'backend_config={"known_trip_count":{"n":"8"}}')


def test_the_loops_of_a_module_their_carries_and_the_kernels_of_an_iteration():
    (loop,) = forward_programs.loops(MODULE)
    assert loop.trip_count == 8
    assert loop.carries == ("s32[]", "f32[4]", "f32[8,4]")
    assert [str(kernel) for kernel in loop.body] == [
        "fusion[kLoop](add, tanh)",
        "custom-call[__cublas$gemm]",
        "while",
    ]
    assert [str(kernel) for kernel in loop.condition] == ["compare"]
    (inner,) = loop.inner
    assert inner.trip_count is None  # XLA did not annotate it
    assert [str(kernel) for kernel in inner.body] == ["copy"]


def test_the_standalone_forward_keeps_no_residuals_and_the_vjp_forward_stacks_them():
    methods = {"blelloch": speed.parse_method("blelloch")}
    compiled = forward_programs.programs("rnn", 7, 2, 3, methods)
    assert set(compiled) == {
        "standalone",
        "vjp",
        "vmapped_standalone",
        "vmapped_vjp",
        "blelloch_standalone",
        "blelloch_vjp",
    }
    stacked = "f32[7,2,3]"  # a (T, B, H) array filled step by step
    for name, (fn, _) in compiled.items():
        (loop,) = forward_programs.loops(fn.as_text())
        assert loop.trip_count == 7, name  # one step per iteration: not unrolled
        assert (stacked in loop.carries) == name.endswith("vjp"), (name, loop.carries)
        if name.endswith("vjp"):
            (standalone,) = forward_programs.loops(
                compiled[name.replace("vjp", "standalone")][0].as_text()
            )
            assert len(loop.body) > len(standalone.body), name

    # "vjp" is the forward program the timing harness times inside BP's gradient.
    batched, _ = speed.losses(speed.CELLS["rnn"], 3)
    harness = timing.GradientPrograms.from_loss(batched, *compiled["vjp"][1])
    assert forward_programs.loops(harness.forward.as_text()) == forward_programs.loops(
        compiled["vjp"][0].as_text()
    )


def test_the_command_prints_and_writes_every_program(tmp_path, capsys):
    out = tmp_path / "forward.json"
    argv = ["--length", "4", "--batch", "2", "--hidden", "2", "--methods", "--rounds", "1"]
    assert forward_programs.main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "standalone: 1 while loop(s)" in printed and "per iteration" in printed
    payload = json.loads(out.read_text())
    assert set(payload["programs"]) == {"standalone", "vjp", "vmapped_standalone", "vmapped_vjp"}
    for entry in payload["programs"].values():
        assert entry["wall_ms"] > 0 and entry["wall_us_per_step"] > 0
        assert (entry["kernel_ms"] is None) == (jax.default_backend() != "gpu")
        assert entry["loops"][0]["trip_count"] == 4
