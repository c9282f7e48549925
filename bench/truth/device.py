"""Facts about the GPU host: the device limits the expectations derive from, and the environment report.

Needs CuPy and pynvml (GPU hosts only). ``index`` is the GPU's NVML index; the harness makes that GPU
the only one CUDA sees (CUDA device 0) before CUDA starts.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from typing import Any

from bench.truth.expect import DeviceLimits, peak_dram_bandwidth

# cudaDeviceAttr values (CUDA runtime ABI).
_MAX_THREADS_PER_BLOCK = 1
_MULTIPROCESSOR_COUNT = 16
_L2_CACHE_SIZE = 38
_MAX_THREADS_PER_MULTIPROCESSOR = 39
_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_RESERVED_SHARED_MEMORY_PER_BLOCK = 111
_COMPUTE_CAPABILITY_MAJOR = 75
_COMPUTE_CAPABILITY_MINOR = 76


def _nvml_handle(index: int) -> tuple[Any, Any]:
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)


def read_limits(index: int) -> DeviceLimits:
    import cupy  # type: ignore[import-not-found,unused-ignore]

    def attribute(number: int) -> int:
        return int(cupy.cuda.runtime.deviceGetAttribute(number, 0))

    nv, handle = _nvml_handle(index)
    try:
        name = nv.nvmlDeviceGetName(handle)
        try:
            peak: float | None = peak_dram_bandwidth(
                nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_MEM) * 1e6,
                nv.nvmlDeviceGetMemoryBusWidth(handle),
            )
        except nv.NVMLError:
            peak = None
    finally:
        nv.nvmlShutdown()
    return DeviceLimits(
        name=name.decode() if isinstance(name, bytes) else name,
        sm_count=attribute(_MULTIPROCESSOR_COUNT),
        max_threads_per_sm=attribute(_MAX_THREADS_PER_MULTIPROCESSOR),
        max_threads_per_block=attribute(_MAX_THREADS_PER_BLOCK),
        max_shared_per_sm=attribute(_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        max_shared_per_block_optin=attribute(_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        reserved_shared_per_block=attribute(_RESERVED_SHARED_MEMORY_PER_BLOCK),
        l2_bytes=attribute(_L2_CACHE_SIZE),
        peak_dram_bytes_per_second=peak,
        compute_capability=(attribute(_COMPUTE_CAPABILITY_MAJOR), attribute(_COMPUTE_CAPABILITY_MINOR)),
    )


def _command(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return f"{argv[0]}: not installed"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return f"{argv[0]}: no answer within 60 s"
    return (done.stdout + done.stderr).strip()


def environment(index: int) -> dict[str, Any]:
    """What the report's header says about the host, the GPU and the software."""
    import cupy  # type: ignore[import-not-found,unused-ignore]
    import torch  # type: ignore[import-not-found,unused-ignore]

    from smlens import __version__

    nv, handle = _nvml_handle(index)
    try:
        try:
            gpm: str = "yes" if nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice else "no"
        except nv.NVMLError as exc:
            gpm = f"query failed: {exc}"
        facts: dict[str, Any] = {
            "gpu": nv.nvmlDeviceGetName(handle),
            "uuid": nv.nvmlDeviceGetUUID(handle),
            "driver": nv.nvmlSystemGetDriverVersion(),
            "nvml": nv.nvmlSystemGetNVMLVersion(),
            "gpm_supported": gpm,
        }
    finally:
        nv.nvmlShutdown()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **{k: v.decode() if isinstance(v, bytes) else v for k, v in facts.items()},
        "gpu_index": index,
        "kernel": platform.release(),
        "user": f"uid {os.getuid()}",
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cupy": cupy.__version__,
        "nvidia_ml_py": _package_version("nvidia-ml-py"),
        "smlens": __version__,
        "ncu": (_command("ncu", "--version").splitlines() or ["?"])[-1],
        "nvidia_smi": _command("nvidia-smi"),
    }


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
