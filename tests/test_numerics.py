"""Every validation case against the FP32 reference, for each kernel under study.

On a GPU the cases run at full size; without one, the Triton kernel runs under the
interpreter with M capped (harness.cases.CPU_MAX_ELEMENTS) and the CUDA kernel skips.
"""

import warnings

import pytest

from conftest import DEVICE, impl_or_skip
from harness.validate import cases_for, run_case

CASES = cases_for(DEVICE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("impl", ["triton", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_matches_reference(impl, case):
    impl = impl_or_skip(impl)
    seed = 1000 + CASES.index(case)
    with warnings.catch_warnings():
        if DEVICE == "cpu" and case.fill in ("nonfinite", "large"):
            # the interpreter computes with numpy, which warns on the NaN, Inf and overflow
            # these cases feed it on purpose; the result is still checked below
            warnings.filterwarnings(
                "ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter"
            )
        r = run_case(case, impl, DEVICE, seed)
    assert r.ok, f"{case} seed={seed}: {r.error} (max abs {r.max_abs}, max rel {r.max_rel})"


#: The cases whose rows the staged wide-row experiment takes (64 KB a row and more).
WIDE_CASES = [c for c in CASES if c.n * c.dtype.itemsize >= 65536]


@pytest.mark.gpu
@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("mode", ["1", "2"])
def test_cuda_wide_rows_match_reference(mode, case, monkeypatch):
    """The CUDA staged wide-row kernel (RMSNORM_CUDA_WIDE, off by default) on every wide
    case: odd strides and offsets fall back to the ladders' kernel, the rest run it."""
    impl = impl_or_skip("cuda")
    monkeypatch.setenv("RMSNORM_CUDA_WIDE", mode)
    seed = 1000 + CASES.index(case)
    r = run_case(case, impl, DEVICE, seed)
    assert r.ok, f"{case} seed={seed}: {r.error} (max abs {r.max_abs}, max rel {r.max_rel})"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["1", "2"])
@pytest.mark.parametrize(
    "dtype,m,n,wkind",
    [("bfloat16", 1031, 32768, "same"), ("bfloat16", 517, 65536, "fp32"),
     ("float16", 130, 131072, "none"), ("float32", 300, 65536, "same"),
     ("float32", 40, 262144, "same"), ("bfloat16", 70, 262144, "same")],
    ids=str,
)  # fmt: skip
def test_cuda_wide_rows_many_rows(mode, dtype, m, n, wkind, monkeypatch):
    """The staged wide-row kernel's ring: many rows a cluster (each stage reused, the
    cluster's row sums exchanged row after row), into an output filled with NaN first."""
    import torch

    from harness.reference import TOL, rms_norm_ref

    impl_or_skip("cuda")
    import cuda_impl

    monkeypatch.setenv("RMSNORM_CUDA_WIDE", mode)
    dt = getattr(torch, dtype)
    x = torch.randn(m, n, device="cuda").to(dt)
    w = None if wkind == "none" else (1 + 0.5 * torch.randn(n, device="cuda"))
    w = w if w is None or wkind == "fp32" else w.to(dt)
    out = torch.full_like(x, float("nan"))
    cuda_impl.rms_norm(x, w, 1e-6, out=out)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6), **TOL[dt])


def test_case_grid_is_complete():
    """The suite covers what it promises: >= 54 cases a kernel, all widths, all dtypes."""
    from harness.cases import DTYPES, all_cases

    cases = all_cases()
    assert len(cases) >= 54
    widths = {c.n for c in cases}
    for n in (
        1,
        3,
        17,
        127,
        128,
        1000,
        1023,
        1024,
        4095,
        4096,
        4097,
        5120,
        8191,
        12288,
        16384,
        65536,
        131072,
        262144,
    ):
        assert n in widths
    assert {c.dtype for c in cases} == set(DTYPES)
    for kind in ("zero_rows", "large", "tiny", "nonfinite"):
        assert any(c.fill == kind for c in cases)
    assert any(c.row_pad for c in cases) and any(c.offset for c in cases)
    assert any(c.weight == "none" for c in cases) and any(c.weight == "fp32" for c in cases)
    assert any(len(c.shape) == 3 for c in cases)
