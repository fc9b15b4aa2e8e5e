"""Build the CUDA C++ extension in place: ``python setup.py build_ext --inplace``.

Produces cuda_impl/_C*.so, the shared library that cuda_impl.ops loads with
torch.ops.load_library (TORCH_LIBRARY registration), also a Python module with direct entry
points for eager calls (csrc/fast_entry.cpp: less host time than a redispatch).

CMakeLists.txt builds the same units (the same glob) with the same flags, as a library
without the Python module (FAST_ENTRY: ops.py then redispatches). Ninja compiles the units
in parallel ($MAX_JOBS caps it).

Target GPUs: $TORCH_CUDA_ARCH_LIST if set (e.g. "9.0"); else the GPU present (torch's
default); with no GPU visible (CI), "9.0" (sm_90: H100/H200), the project's target.
Set RMSNORM_PTXAS_VERBOSE=1 to print registers and spills per kernel (-Xptxas -v).
Set RMSNORM_SWEEP_CONFIGS=1 for a sweep build: the CUDA kernel's sweep-only launch configs
(what harness.sweep times besides the shipped ones) are compiled too; the default build has
only the configs the ladders pick (CMake: -DRMSNORM_SWEEP_CONFIGS=ON, or the same variable).
"""

import glob
import os
import subprocess
import sys
import time

from setuptools import setup

# The units: the op schemas and checks, the forward's dispatch and one unit per op and x
# dtype (forward_<op>_<dtype>.cu), the backward; CMakeLists.txt globs the same files.
SOURCES = ["cuda_impl/csrc/rms_norm.cpp"] + sorted(glob.glob("cuda_impl/csrc/*.cu"))
FAST_ENTRY = ["cuda_impl/csrc/fast_entry.cpp"]
CXX_FLAGS = ["-O3"]  # the C++ standard is torch's own choice (C++20 for torch >= 2.10)
NVCC_FLAGS = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]


def default_cuda_home() -> None:
    """Point torch at the toolkit in /usr/local/cuda when CUDA_HOME is unset: torch otherwise
    guesses from the first nvcc on PATH, which may be a wrapper outside the toolkit."""
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        if os.path.exists("/usr/local/cuda/bin/nvcc"):
            os.environ["CUDA_HOME"] = "/usr/local/cuda"


def ext_modules():
    default_cuda_home()
    import torch
    from torch.utils.cpp_extension import CUDAExtension

    if "TORCH_CUDA_ARCH_LIST" not in os.environ and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    nvcc = list(NVCC_FLAGS)
    if os.environ.get("RMSNORM_PTXAS_VERBOSE") == "1":
        nvcc.append("-Xptxas=-v")
    sweep = os.environ.get("RMSNORM_SWEEP_CONFIGS") == "1"
    if sweep:
        nvcc.append("-DRMSNORM_SWEEP_CONFIGS")
    if "build_ext" in sys.argv:
        # nvcc prints nothing until it ends, and ninja shows no progress off a terminal
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "the GPU present")
        which = "shipped and sweep-only" if sweep else "shipped"
        print(
            f"building cuda_impl._C for {arch}: {len(SOURCES + FAST_ENTRY)} units side by side,"
            f" the {which} launch configs (a few minutes on 2 cores, silent until it ends)",
            flush=True,
        )
    return [
        CUDAExtension(
            name="cuda_impl._C",
            sources=SOURCES + FAST_ENTRY,
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": nvcc},
        )
    ]


def kernel_count(library: str) -> str:
    """The __global__ kernels in a built library: nvcc gives each one host stub, whose
    static launch handle is in the symbol table (binutils' nm)."""
    try:
        out = subprocess.run(["nm", library], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "an unknown number of"
    return str(sum(1 for s in out.split() if "__device_stub__" in s and s.endswith("E8__handle")))


def cmdclass():
    from torch.utils.cpp_extension import BuildExtension

    class TimedBuild(BuildExtension.with_options(use_ninja=True)):
        """The build, then its wall time and the kernels it compiled."""

        def run(self):
            start = time.monotonic()
            super().run()
            library = self.get_ext_fullpath("cuda_impl._C")
            print(
                f"built {os.path.relpath(library)}: {len(SOURCES + FAST_ENTRY)} units,"
                f" {kernel_count(library)} kernels, in {time.monotonic() - start:.0f} s",
                flush=True,
            )

    return {"build_ext": TimedBuild}


setup(
    packages=["triton_impl", "cuda_impl", "harness", "rmsnorm_api"],
    ext_modules=ext_modules(),
    cmdclass=cmdclass(),
)
