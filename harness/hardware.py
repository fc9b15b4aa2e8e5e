"""What the GPU can do, measured and read in the same run (peak first, the
environment in every record, the card's settings left alone).

- Theoretical peak: 2 (double data rate) x memory clock x bus width / 8, in GB/s. The
  clock and width come from NVML (pynvml, package nvidia-ml-py), else torch's device
  properties, else a table of known parts (H200: 3201 MHz x 6016 bit -> 4814 GB/s).
- Achievable ceiling: the median of a >= 1 GiB device-to-device copy, counting bytes read
  plus bytes written (the runs of record: docs/notebook/00-method-and-the-two-numbers.md).
- Clocks and throttle reasons are read through NVML; nothing here changes a clock or a
  power limit.
- ``environment``: the GPU, its SMs and L2, the driver, torch, triton, CUDA, and the
  repository's git SHA and dirty flag, for every record.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from harness import records as _records

REPO = Path(__file__).resolve().parent.parent

#: name substring -> (memory clock MHz, bus width bits); first match wins, so the more
#: specific names come first. Used only when neither NVML nor torch reports them.
FALLBACK_MEMORY = [
    ("H200", (3201, 6016)),  # 4814 GB/s
    ("H100 PCIe", (1593, 5120)),  # 2039 GB/s
    ("H100", (2619, 5120)),  # SXM, HBM3: 3352 GB/s
    ("A100-SXM4-80GB", (1593, 5120)),  # 2039 GB/s
    ("A100", (1215, 5120)),  # 40 GB: 1555 GB/s
]

# NVML clock-event (throttle) reason bits; the ones that mean the card is held back.
_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_THROTTLING = {
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}


def peak_gbps(mem_clock_mhz: float, bus_width_bits: int) -> float:
    """Theoretical DRAM bandwidth in GB/s: 2 x clock x width / 8."""
    return 2 * mem_clock_mhz * 1e6 * bus_width_bits / 8 / 1e9


@functools.cache
def _nvml_handle(device: int = 0) -> Optional[Any]:
    """An NVML handle for torch's device index, or None where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = device
        if visible and visible.split(",")[0].strip().isdigit():
            index = int(visible.split(",")[device].strip())
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def fallback_memory(name: str) -> Optional[tuple[int, int]]:
    """(memory clock MHz, bus width bits) of a known GPU by name, or None."""
    for key, spec in FALLBACK_MEMORY:
        if key.lower() in name.lower():
            return spec
    return None


def theoretical_peak(device: int = 0) -> dict:
    """{gbps, mem_clock_mhz, bus_width_bits, source}; source is nvml, torch or table."""
    name = torch.cuda.get_device_name(device)
    handle = _nvml_handle(device)
    if handle is not None:
        try:
            import pynvml

            clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
            if clock and width:
                return dict(
                    gbps=peak_gbps(clock, width),
                    mem_clock_mhz=clock,
                    bus_width_bits=width,
                    source="nvml",
                )
        except Exception:
            pass
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    width = getattr(props, "memory_bus_width", 0)
    if clock_khz and width:
        clock = clock_khz / 1000
        return dict(
            gbps=peak_gbps(clock, width), mem_clock_mhz=clock, bus_width_bits=width, source="torch"
        )
    spec = fallback_memory(name)
    if spec:
        return dict(
            gbps=peak_gbps(*spec), mem_clock_mhz=spec[0], bus_width_bits=spec[1], source="table"
        )
    return dict(gbps=None, mem_clock_mhz=None, bus_width_bits=None, source="unknown")


def copy_ceiling(
    nbytes: int = 1 << 30, reps: int = 20, warmup_s: float = 0.3, device: int = 0
) -> dict:
    """Median GB/s of a device-to-device copy of ``nbytes`` (bytes read + written).

    Copies for ``warmup_s`` first (which also brings the clocks up for the whole run).
    Returns {gbps, bytes, samples_us, median_us, p20_us, p80_us}.
    """
    from harness.timing import elapsed_s, event_pairs, quantile, warm_up

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    warm_up([functools.partial(dst.copy_, src)], warmup_s)
    pairs = event_pairs(reps)
    for start, end in pairs:
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize()
    us = [s * 1e6 for s in elapsed_s(pairs)]
    del src, dst
    torch.cuda.empty_cache()
    median = quantile(us, 0.5)
    return dict(
        gbps=2 * nbytes / (median * 1e-6) / 1e9,
        bytes=2 * nbytes,
        samples_us=us,
        median_us=median,
        p20_us=quantile(us, 0.2),
        p80_us=quantile(us, 0.8),
    )


def decode_reasons(mask: int) -> list[str]:
    """Names of the NVML clock-event reason bits set in ``mask``."""
    return [name for bit, name in _REASONS.items() if mask & bit]


def clocks(device: int = 0) -> Optional[dict]:
    """Current SM/memory clocks, temperature, power and throttle reasons (read only).

    {sm_mhz, mem_mhz, max_sm_mhz, temp_c, power_w, reasons, throttled} or None without NVML.
    """
    handle = _nvml_handle(device)
    if handle is None:
        return None
    import pynvml

    def read(f, *a):
        try:
            return f(handle, *a)
        except Exception:
            return None

    reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = read(reasons_fn) if reasons_fn else None
    power = read(pynvml.nvmlDeviceGetPowerUsage)
    reasons = decode_reasons(mask) if mask is not None else []
    return {
        "sm_mhz": read(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM),
        "mem_mhz": read(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM),
        "max_sm_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
        "temp_c": read(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        "power_w": power / 1000 if power is not None else None,
        "reasons": reasons,
        "throttled": bool(_THROTTLING.intersection(reasons)),
    }


def gpu_slug(name: str) -> str:
    """A directory name for a GPU: 'NVIDIA H200' -> 'h200'."""
    name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def no_gpu_refused(args) -> bool:
    """Whether a run stops for want of a GPU: no CUDA GPU here and --require-gpu given (said
    on stderr); harness.bench and harness.model then exit 1."""
    if torch.cuda.is_available() or not args.require_gpu:
        return False
    print("no CUDA GPU on this machine, and --require-gpu was given", file=sys.stderr)
    return True


def gpu_out_dir(p, args, *sub: str) -> Path:
    """A GPU run's output directory: --out, or results/<this GPU>/<sub...>; the parser's
    error where it cannot take records."""
    out = (
        Path(args.out)
        if args.out is not None
        else REPO.joinpath("results", gpu_slug(torch.cuda.get_device_name()), *sub)
    )
    if why := _records.out_dir_problem(out):
        p.error(f"--out {out} {why}")
    return out


def git_info(repo: Path = REPO) -> tuple[Optional[str], Optional[bool]]:
    """(HEAD's SHA, whether tracked files differ from it), or (None, None) outside git.

    A copy of the tree without .git (e.g. on a remote GPU machine) can name its commit in
    $RMSNORM_GIT_SHA (and $RMSNORM_GIT_DIRTY=1 if it differs from that commit).
    """
    if os.environ.get("RMSNORM_GIT_SHA"):
        return os.environ["RMSNORM_GIT_SHA"], os.environ.get("RMSNORM_GIT_DIRTY") == "1"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        return sha, bool(status.strip())
    except Exception:
        return None, None


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software() -> dict:
    """Versions of Python, torch, triton, CUDA, the optional baselines and transformers."""
    import triton

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "liger_kernel": _version("liger-kernel") or _version("liger_kernel"),
        "quack": _version("quack-kernels"),
        # scripts/trim_flashinfer.py's package reads 0.7.4+norm: flashinfer.norm alone
        "flashinfer": _version("flashinfer-python"),
        "transformers": _version("transformers"),  # harness.model's second client
    }


def environment(device: int = 0) -> dict:
    """The environment every record carries. Without a GPU the GPU fields are None."""
    sha, dirty = git_info()
    env: dict[str, Any] = {"git_sha": sha, "git_dirty": dirty, **software()}
    if not torch.cuda.is_available():
        return {
            "gpu": None,
            "sm_count": None,
            "l2_bytes": None,
            "mem_bytes": None,
            "cc": None,
            "driver": None,
            **env,
        }
    props = torch.cuda.get_device_properties(device)
    driver = None
    if _nvml_handle(device) is not None:
        import pynvml

        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            pass
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "mem_bytes": props.total_memory,
        "cc": f"{props.major}.{props.minor}",
        "driver": driver,
        **env,
    }
