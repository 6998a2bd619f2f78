"""Triton IR to the GPU's own code on a CPU, with the official ``triton`` compiler.

The TTIR Pallas lowered (:mod:`benchmarks.kernel_lab.capture`) goes through the NVIDIA
backend's stages one by one (TTIR passes, TTGIR, LLVM IR, PTX: the pipeline XLA runs on a GPU
machine), then through the ``ptxas`` the wheel bundles, with ``-v`` for the resources and
ptxas's default optimization, as XLA runs it (not the ``--regAllocOptLevel=2`` that Triton's own
``make_cubin`` adds, which caps large kernels near 32 registers and spills far more);
``cuobjdump -sass`` (bundled too) lists the code. No
GPU, CUDA toolkit or driver is needed. Requires the ``kernels`` extra (``pip install
-e ".[kernels]"``: the ``triton`` wheel).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import warnings


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A kernel compiled for one target: ``ptxas -v``'s log and the SASS listing."""

    arch: int
    num_warps: int
    log: str
    sass: str
    compiler: str


def available() -> str | None:
    """Why the compiler cannot run here (``None``: it can)."""
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except ImportError as err:
        return f"the triton compiler is not installed ({err}); pip install -e '.[kernels]'"
    return None


def version() -> str:
    import triton

    return triton.__version__


def compile_ttir(ttir: str, num_warps: int, arch: int = 90, num_stages: int = 1) -> Compiled:
    """Compiles the TTIR text ``ttir`` for ``sm_<arch>`` (``90``: sm_90a) with ``num_warps``
    warps a program.

    Raises:
        RuntimeError: a stage or ``ptxas`` failed (its message attached).
    """
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said explicitly
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget, Language
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", arch, 32))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
    stages: dict = {}
    backend.add_stages(stages, options, Language.TRITON)
    with tempfile.TemporaryDirectory(prefix="bppsa-kernel-lab-") as tmp:
        source = os.path.join(tmp, "kernel.ttir")
        with open(source, "w") as f:
            f.write(ttir)
        module = ir.parse_mlir_module(source, context)
        module.context = context
        metadata: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for stage in ("ttir", "ttgir", "llir", "ptx"):
                module = stages[stage](module, metadata)
        ptx, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(ptx, "w") as f:
            f.write(module)
        ptxas = get_ptxas(arch).path
        command = [
            ptxas,
            "-lineinfo",
            "-v",
            f"--gpu-name={sm_arch_from_capability(arch)}",
            ptx,
            "-o",
            cubin,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ptxas failed ({done.returncode}): {done.stderr}")
        cuobjdump = os.path.join(os.path.dirname(ptxas), "cuobjdump")
        listing = subprocess.run(
            [cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    return Compiled(arch, num_warps, done.stderr, listing, f"triton {version()}")
