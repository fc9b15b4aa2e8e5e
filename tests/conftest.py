"""Shared fixtures: the device, the implementations, and the `gpu` marker's skip.

Importing harness.impls first sets TRITON_INTERPRET=1 on a machine without a GPU, before
Triton is imported anywhere, so the Triton kernel's numerics are checked on CPU.
"""

import sys

import pytest
import torch

from harness.impls import registry, runnable

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
IMPLS = registry()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def impl_or_skip(name: str, device: str = DEVICE, impls: dict = IMPLS):
    """The named implementation (of rms_norm, or of the op whose registry ``impls`` is), or
    a skip that says why it cannot run here."""
    impl = impls[name]
    why = runnable(impl, device)
    if why:
        pytest.skip(f"{name}: {why}")
    return impl


def fn_or_skip(name: str):
    """The named implementation's function for error tests: any importable build will do,
    since argument checks run before any device work."""
    impl = IMPLS[name]
    if impl.unavailable:
        pytest.skip(f"{name}: {impl.unavailable}")
    return impl.fn


def hide_packages(monkeypatch, *packages: str) -> None:
    """Make importing each package, and any of its modules, raise ImportError for one test:
    a module another test already imported (where the package is installed) would
    otherwise be found in sys.modules without its package being looked up."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


def refusal(main, argv, capsys) -> str:
    """What a command line says on stderr when it refuses argv with argparse's exit 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2, (main, argv)
    return capsys.readouterr().err


def sharded_to_stress(n: int, element_size: int) -> list:
    """The sharded candidates the GPU stress tests run: every waiting one, one last-arrival
    one (the schedule the interpreter checks everywhere)."""
    from triton_impl.configs import Config, sharded_candidates

    cands = sharded_candidates(n, element_size)
    return [c for c in cands if c.wait] + [Config("sharded", 8192, 16, stages=2, stream_y=True)]


def cluster_widths(row_threads: int, vpt: int, ranks: int, most: int, vec: int) -> list:
    """Row widths a CUDA cluster config of `ranks` CTAs is checked at: its full width (at
    most MAX_N), one whose slices are uneven (the last shortest) and, on its most CTAs, 9
    vectors (CTAs with an empty slice)."""
    from rmsnorm_api import MAX_N

    cap = min(row_threads * vpt * ranks * vec, MAX_N)
    return [cap, cap - 3 * row_threads * vec - vec] + ([9 * vec] if ranks == most else [])
