"""The few CUDA driver calls a capture needs (through cuda-bindings, which cupti-python requires)."""

from __future__ import annotations

from typing import Any

from smlens.profile.errors import ProfileError


def _driver() -> Any:
    from cuda.bindings import driver  # type: ignore[import-not-found,import-untyped,unused-ignore]

    (status,) = driver.cuInit(0)
    _check(driver, status, "cuInit")
    return driver


def _check(driver: Any, status: Any, call: str) -> None:
    if status != driver.CUresult.CUDA_SUCCESS:
        raise ProfileError(f"the CUDA driver refused {call}: {status.name}.")


def cuda_ordinal_of_uuid(uuid: str) -> int:
    """The CUDA device ordinal of the GPU whose NVML UUID is ``uuid`` (``GPU-xxxxxxxx-...``)."""
    driver = _driver()
    status, count = driver.cuDeviceGetCount()
    _check(driver, status, "cuDeviceGetCount")
    want = uuid.removeprefix("GPU-").replace("-", "").lower()
    for ordinal in range(count):
        status, device = driver.cuDeviceGet(ordinal)
        _check(driver, status, "cuDeviceGet")
        status, value = driver.cuDeviceGetUuid(device)
        _check(driver, status, "cuDeviceGetUuid")
        raw = value.bytes
        if (raw.encode("latin-1") if isinstance(raw, str) else bytes(raw)).hex() == want:
            return ordinal
    raise ProfileError(f"CUDA does not see {uuid} (CUDA_VISIBLE_DEVICES?), so it cannot be profiled.")


def retain_primary_context(ordinal: int) -> None:
    """CUPTI's profiler needs a CUDA context on the device; the primary one costs the least."""
    driver = _driver()
    status, device = driver.cuDeviceGet(ordinal)
    _check(driver, status, "cuDeviceGet")
    status, context = driver.cuDevicePrimaryCtxRetain(device)
    _check(driver, status, "cuDevicePrimaryCtxRetain")
    (status,) = driver.cuCtxSetCurrent(context)
    _check(driver, status, "cuCtxSetCurrent")
