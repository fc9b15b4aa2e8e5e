"""Both builds of the CUDA extension (setup.py and CMake) produce a loadable library.

These run without a GPU: they check that the library imports, registers the ops, and
answers a CPU tensor with a clear error. The CMake build is made here if it is missing.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMAKE_DIR = os.path.join(ROOT, "build", "cmake")
CMAKE_LIB = os.path.join(CMAKE_DIR, "libcuda_impl_ops.so")

PROBE = """
import torch, cuda_impl
print(cuda_impl.ops.LIBRARY)
print(torch.ops.cuda_impl.rms_norm.default._schema)
try:
    cuda_impl.rms_norm(torch.randn(2, 8))
except ValueError as e:
    print("error:", e)
"""


def probe(env_extra: dict) -> str:
    env = dict(os.environ, **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_setup_py_build_imports():
    import cuda_impl

    assert os.path.basename(cuda_impl.ops.LIBRARY).startswith("_C")
    text = probe({})
    schema = "rms_norm(Tensor x, Tensor? weight, float eps, float weight_offset=0.) -> Tensor"
    assert schema in text
    assert "error: cuda_impl.rms_norm: x is on device 'cpu'; expected a CUDA tensor" in text


def cmake_exe() -> str:
    """The pip-installed CMake (requirements.txt) if present, else the one on PATH."""
    try:
        import cmake

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        exe = shutil.which("cmake")
        if exe is None:
            pytest.fail("cmake is not installed; pip install cmake (see requirements.txt)")
        return exe


def build_cmake() -> None:
    exe = cmake_exe()
    prefix = torch.utils.cmake_prefix_path
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmds = [
        [exe, "-S", ROOT, "-B", CMAKE_DIR, *gen, f"-DCMAKE_PREFIX_PATH={prefix}"],
        [exe, "--build", CMAKE_DIR],
    ]
    for cmd in cmds:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-4000:]}{out.stderr}"


@pytest.mark.exhaustive
def test_cmake_build_loads():
    if not os.path.isfile(CMAKE_LIB):
        build_cmake()
    assert os.path.isfile(os.path.join(CMAKE_DIR, "compile_commands.json"))
    text = probe({"CUDA_IMPL_LIBRARY": CMAKE_LIB})
    assert CMAKE_LIB in text
    assert "rms_norm_out" not in text.splitlines()[1]  # the probe printed rms_norm's schema
    assert "error: cuda_impl.rms_norm: x is on device 'cpu'; expected a CUDA tensor" in text


def test_missing_library_says_how_to_build():
    out = subprocess.run(
        [sys.executable, "-c", "import cuda_impl"],
        cwd=ROOT,
        env=dict(os.environ, CUDA_IMPL_LIBRARY=os.path.join(ROOT, "no", "such.so")),
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "does not exist" in out.stderr


@pytest.mark.exhaustive
def test_sweep_build_tables_are_valid():
    """The sweep build's config tables (RMSNORM_SWEEP_CONFIGS=1: the sweep-only configs
    beside the rungs) pass their compile-time checks (each config compiled once, the rungs
    in order), which no default build sees: nvcc's front end alone, no device code."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not os.path.exists(nvcc):
        pytest.skip(f"no nvcc at {nvcc}")
    includes = [*include_paths("cpu"), os.path.join(cuda_home, "include"),
                sysconfig.get_paths()["include"]]  # fmt: skip
    out = subprocess.run(
        [nvcc, "-cuda", "-std=c++20", "--expt-relaxed-constexpr", "-DRMSNORM_SWEEP_CONFIGS=1",
         "-gencode=arch=compute_90,code=sm_90", *[f"-I{p}" for p in includes],
         os.path.join(ROOT, "cuda_impl", "csrc", "forward.cu"), "-o", os.devnull],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
