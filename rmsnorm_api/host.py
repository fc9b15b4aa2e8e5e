"""The built CUDA extension, found and loaded once for both backends.

``library_path()`` is whichever build is found: ``$CUDA_IMPL_LIBRARY`` if set (e.g. the
CMake build's ``build/cmake/libcuda_impl_ops.so``), else ``cuda_impl/_C*.so`` from
``python setup.py build_ext --inplace``. ``entry()`` is that library's Python module of
eager entry points (cuda_impl/csrc/fast_entry.cpp: CUDA's ops and Triton's kept plans
reached in one call, past the dispatcher and Triton's Python launcher), or None where
there is no such module (the CMake library, no build): the backends then take their
Python paths, slower on the host and otherwise the same.
"""

from __future__ import annotations

import functools
import glob
import importlib.machinery
import importlib.util
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_path() -> str:
    """The CUDA library's path; ImportError saying how to build it where there is none."""
    env = os.environ.get("CUDA_IMPL_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"CUDA_IMPL_LIBRARY={env} does not exist")
        return env
    found = sorted(glob.glob(os.path.join(_ROOT, "cuda_impl", "_C*.so")))
    if not found:
        raise ImportError(
            "cuda_impl: the CUDA extension is not built. Build it with "
            "`python setup.py build_ext --inplace` "
            "(or `pip install --no-build-isolation -e .`) in the repository root."
        )
    return found[0]


@functools.cache
def entry():
    """The library's eager entry points as a Python module (loaded once), or None."""
    try:
        path = library_path()
    except ImportError:
        return None
    loader = importlib.machinery.ExtensionFileLoader("cuda_impl._C", path)
    spec = importlib.util.spec_from_file_location("cuda_impl._C", path, loader=loader)
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except (ImportError, OSError):  # no module init (the CMake library), or a stale build
        return None
    return module
