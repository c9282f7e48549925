"""A fake ``pynvml`` module for tests: the real module's constants, ctypes structures and NVMLError
classes, with every function that would call libnvidia-ml replaced by a scriptable node of fake GPUs.

    node = FakeNode([FakeGpu("GPU-a"), FakeGpu("GPU-b", gpm_supported=False)])
    monkeypatch.setitem(sys.modules, "pynvml", node.module)

A value set to None makes its getter fail with NVML_ERROR_NOT_SUPPORTED; ``errors`` makes a named
function fail with any NVML code on one GPU; ``lost`` makes every call on the GPU fail with
NVML_ERROR_GPU_IS_LOST. GPM metrics are the integral of ``gpm_rates`` between two samples divided by
the time between them, on the node's own clock, which only :meth:`FakeNode.advance` moves. Calling a
pynvml function the fake does not script raises AssertionError, so a test sees it.
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml as real
import pytest

T = TypeVar("T")

US = 1_000_000


def _error(code: int) -> Exception:
    error: Exception = real.NVMLError(code)
    return error


def _supported(value: T | None) -> T:
    if value is None:
        raise _error(real.NVML_ERROR_NOT_SUPPORTED)
    return value


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    pci_bus_id: str = "00000000:18:00.0"
    serial: str | None = "1650123456789"
    sm_count: int | None = 132  # nvmlDeviceGetAttributes: real NVML answers only for MIG devices
    cuda_cores: int | None = 16896
    compute_capability: tuple[int, int] = (9, 0)
    memory_total: int = 150_754_820_096
    memory_used: int | None = 1_048_576
    power_mw: int | None = 120_500
    power_limit_mw: int | None = 700_000
    temperature: int | None = 35
    memory_temperature: int | None = 41
    sm_clock_mhz: int | None = 345
    memory_clock_mhz: int | None = 3201
    max_sm_clock_mhz: int | None = 1980
    energy_mj: int | None = 0
    ecc_corrected: int | None = 0
    ecc_uncorrected: int | None = 0
    pcie_replays: int | None = 0
    clock_event_reasons: int | None = 0  # the current bitmask
    supported_clock_event_reasons: int | None = 0x1FF
    utilization_percent: int | None = 0  # what nvmlDeviceGetUtilizationRates says
    # (timestamp in microseconds, percent); None: the driver keeps no samples
    utilization_samples: list[tuple[int, int]] | None = field(default_factory=list)
    gpm_supported: bool = True
    gpm_rates: dict[int, float] = field(default_factory=dict)  # metric id -> percent or MiB/s from now on
    gpm_metric_errors: dict[int, int] = field(default_factory=dict)  # metric id -> its nvmlReturn
    event_types: int = real.nvmlEventTypeXidCriticalError
    errors: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code
    lost: bool = False
    calls: Counter[str] = field(default_factory=Counter)


@dataclass
class _Sample:
    gpu: str | None = None  # uuid of the GPU it was taken on; None until taken
    time_us: int = 0
    integrals: dict[int, float] = field(default_factory=dict)


class FakeNode:
    """A node of fake GPUs; ``module`` is the pynvml stand-in that reads and changes it."""

    def __init__(self, gpus: Iterable[FakeGpu], driver_version: str = "580.159.04") -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.library_missing = False
        self.init_error: int | None = None  # NVML code nvmlInit fails with
        self.initialized = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.time_us = 10 * US
        self.event_wait_timeouts: list[int] = []
        self.metric_requests: list[list[int]] = []
        self._devices = [real.struct_c_nvmlDevice_t() for _ in self.gpus]
        self._integrals: dict[str, dict[int, float]] = {gpu.uuid: {} for gpu in self.gpus}
        self._samples: dict[int, tuple[Any, _Sample]] = {}  # address -> (struct kept alive, sample)
        self._event_sets: dict[int, tuple[Any, list[Any]]] = {}  # address -> (struct, queued events)
        self._registered: dict[int, set[str]] = {}  # event set address -> uuids registered for XIDs
        self.module = self._build_module()

    # ---- what tests drive -------------------------------------------------------------------
    def gpu(self, uuid: str) -> FakeGpu:
        return next(g for g in self.gpus if g.uuid == uuid)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the node: GPM counters grow by their rates."""
        for gpu in self.gpus:
            for metric, rate in gpu.gpm_rates.items():
                integrals = self._integrals[gpu.uuid]
                integrals[metric] = integrals.get(metric, 0.0) + rate * seconds
        self.time_us += round(seconds * US)

    def xid(self, uuid: str, code: int) -> None:
        """The driver reports XID ``code`` on a GPU."""
        handle = self._handle(self.gpus.index(self.gpu(uuid)))
        for set_address, uuids in self._registered.items():
            if uuid in uuids:
                event = real.c_nvmlEventData_t()
                event.device = handle
                event.eventType = real.nvmlEventTypeXidCriticalError
                event.eventData = code
                self._event_sets[set_address][1].append(event)

    @property
    def live_gpm_samples(self) -> int:
        return len(self._samples)

    # ---- plumbing -----------------------------------------------------------------------------
    def _build_module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml", "fake pynvml (tests/fakes/fake_pynvml.py)")
        for name, value in vars(real).items():
            if name.startswith("__"):
                continue
            if name.startswith("nvml") and isinstance(value, types.FunctionType):
                value = getattr(self, name, None) or _unscripted(name)
            setattr(module, name, value)
        return module

    def _check_init(self) -> None:
        if self.initialized <= 0:
            raise _error(real.NVML_ERROR_UNINITIALIZED)

    def _device(self, function: str, handle: Any) -> FakeGpu:
        self._check_init()
        position = [ctypes.addressof(d) for d in self._devices].index(ctypes.addressof(handle.contents))
        gpu = self.gpus[position]
        gpu.calls[function] += 1
        if gpu.lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise _error(gpu.errors[function])
        return gpu

    def _handle(self, position: int) -> Any:
        return ctypes.pointer(self._devices[position])

    # ---- library ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.library_missing:
            raise _error(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise _error(self.init_error)
        self.init_calls += 1
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.shutdown_calls += 1
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        return self._handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._check_init()
        for position, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return self._handle(position)
        raise _error(real.NVML_ERROR_NOT_FOUND)

    # ---- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return _supported(self._device("nvmlDeviceGetSerial", handle).serial)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = real.nvmlPciInfo_t()
        info.busId = self._device("nvmlDeviceGetPciInfo", handle).pci_bus_id.encode()
        return info

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        attributes = real.c_nvmlDeviceAttributes()
        attributes.multiprocessorCount = _supported(self._device("nvmlDeviceGetAttributes", handle).sm_count)
        return attributes

    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int:
        return _supported(self._device("nvmlDeviceGetNumGpuCores", handle).cuda_cores)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    # ---- gauges and counters --------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        used = _supported(gpu.memory_used)
        return real.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return _supported(self._device("nvmlDeviceGetPowerUsage", handle).power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return _supported(gpu.power_limit_mw)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return _supported(self._device("nvmlDeviceGetTemperature", handle).temperature)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            if field_id == real.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature is not None:
                value.nvmlReturn = real.NVML_SUCCESS
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.memory_temperature
            else:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        return _supported(
            {real.NVML_CLOCK_SM: gpu.sm_clock_mhz, real.NVML_CLOCK_MEM: gpu.memory_clock_mhz}[clock]
        )

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        assert clock == real.NVML_CLOCK_SM
        return _supported(self._device("nvmlDeviceGetMaxClockInfo", handle).max_sm_clock_mhz)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return _supported(self._device("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._device("nvmlDeviceGetTotalEccErrors", handle)
        assert counter_type == real.NVML_VOLATILE_ECC
        corrected = error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return _supported(gpu.ecc_corrected if corrected else gpu.ecc_uncorrected)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return _supported(self._device("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return _supported(gpu.clock_event_reasons)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetSupportedClocksEventReasons", handle)
        return _supported(gpu.supported_clock_event_reasons)

    # ---- utilization ------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=_supported(gpu.utilization_percent), memory=0)

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int, last_seen: int) -> tuple[int, list[Any]]:
        gpu = self._device("nvmlDeviceGetSamples", handle)
        assert sampling_type == real.NVML_GPU_UTILIZATION_SAMPLES
        # Like the real driver (measured on an H200, driver 580): timestamps compare to the millisecond.
        newer = [s for s in _supported(gpu.utilization_samples) if s[0] // 1000 > last_seen // 1000]
        if not newer:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        samples = []
        for stamp, percent in newer:
            sample = real.c_nvmlSample_t(timeStamp=stamp)
            sample.sampleValue.uiVal = percent
            samples.append(sample)
        return real.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    # ---- GPM ----------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._device("nvmlGpmQueryDeviceSupport", handle).gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check_init()
        struct = real.struct_c_nvmlGpmSample_t()
        self._samples[ctypes.addressof(struct)] = (struct, _Sample())
        return ctypes.pointer(struct)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check_init()
        if self._samples.pop(ctypes.addressof(sample.contents), None) is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    def _sample(self, pointer: Any) -> _Sample:
        found = self._samples.get(ctypes.addressof(pointer.contents)) if pointer else None
        if found is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return found[1]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", handle)
        if not gpu.gpm_supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        taken = self._sample(sample)
        taken.gpu, taken.time_us, taken.integrals = gpu.uuid, self.time_us, dict(self._integrals[gpu.uuid])
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._check_init()
        if request.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        if first.gpu is None or first.gpu != second.gpu or second.time_us <= first.time_us:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpu(first.gpu)
        gpu.calls["nvmlGpmMetricsGet"] += 1
        if gpu.lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        seconds = (second.time_us - first.time_us) / US
        ids = [request.metrics[i].metricId for i in range(request.numMetrics)]
        self.metric_requests.append(ids)
        for i, metric in enumerate(ids):
            out = request.metrics[i]
            out.nvmlReturn = gpu.gpm_metric_errors.get(metric, real.NVML_SUCCESS)
            out.value = (second.integrals.get(metric, 0.0) - first.integrals.get(metric, 0.0)) / seconds
        return request

    # ---- events -------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        struct = real.struct_c_nvmlEventSet_t()
        self._event_sets[ctypes.addressof(struct)] = (struct, [])
        self._registered[ctypes.addressof(struct)] = set()
        return ctypes.pointer(struct)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetSupportedEventTypes", handle).event_types

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        if event_types & ~gpu.event_types:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        self._registered[ctypes.addressof(event_set.contents)].add(gpu.uuid)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._check_init()
        self.event_wait_timeouts.append(timeout_ms)
        queued = self._event_sets[ctypes.addressof(event_set.contents)][1]
        if not queued:
            raise _error(real.NVML_ERROR_TIMEOUT)
        return queued.pop(0)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check_init()
        del self._event_sets[ctypes.addressof(event_set.contents)]
        del self._registered[ctypes.addressof(event_set.contents)]

    @property
    def live_event_sets(self) -> int:
        return len(self._event_sets)


def _unscripted(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"fake pynvml: {name} is not scripted")

    return fail


def install(monkeypatch: pytest.MonkeyPatch, *gpus: FakeGpu) -> FakeNode:
    """A node of these GPUs, put in place of pynvml for the rest of the test."""
    node = FakeNode(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", node.module)
    return node
