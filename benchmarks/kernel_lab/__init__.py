"""The kernel lab: the fused loops' GPU kernels compiled and read on a CPU.

:mod:`~benchmarks.kernel_lab.capture` lowers each fused loop the library would launch for
CUDA under an abstract GPU and keeps its Triton IR; :mod:`~benchmarks.kernel_lab.compile`
compiles it with the official Triton compiler for sm_90a and sm_80;
:mod:`~benchmarks.kernel_lab.sass` reads ``ptxas``'s resources and the time loop's SASS;
:mod:`~benchmarks.kernel_lab.model` estimates a step from the compiler's schedule;
:mod:`~benchmarks.kernel_lab.envelope` derives the envelope (the largest spill-free loops, by
warps); :mod:`~benchmarks.kernel_lab.lab` runs the grid and :mod:`~benchmarks.kernel_lab.report`
summarises and draws it. ``make kernels`` runs it all (``python -m benchmarks.kernel_lab``).
"""
