"""A fake ``pynvml`` module for tests: the real module's constants, ctypes structures and NVMLError
classes, with every function that would call libnvidia-ml replaced by a scriptable node of fake GPUs.

    node = FakeNode([FakeGpu("GPU-a"), FakeGpu("GPU-b", gpm_supported=False)])
    monkeypatch.setitem(sys.modules, "pynvml", node.module)

A value set to None makes its getter fail with NVML_ERROR_NOT_SUPPORTED; ``errors`` makes a named
function fail with any NVML code on one GPU; ``lost`` makes every call on the GPU fail with
NVML_ERROR_GPU_IS_LOST. GPM metrics are the integral of ``gpm_rates`` between two samples divided by
the time between them, on the node's own clock, which only :meth:`FakeNode.advance` moves. Calling a
pynvml function the fake does not script raises AssertionError, so a test sees it.

MIG: a FakeGpu with ``mig_mode=NVML_DEVICE_MIG_ENABLE`` holds ``gpu_instances``, each with its compute
instances (``FakeMigDevice``, one MIG device handle each). Tests reconfigure a running node by changing
that list (``FakeNode.create_instance`` / ``destroy_instance``): handles of destroyed MIG devices stop
working, as nvml.h says. Every MIG call was checked against nvml.h of NVIDIA/go-nvml (gen/nvml/nvml.h,
"NVML VERSION: 13.3.29") for its arguments and return codes, and against pynvml.py of
nvidia-ml-py 13.615.71 (the installed package) for what the Python binding returns:

- nvmlDeviceGetMigMode -> [current, pending]; NOT_SUPPORTED on a GPU without MIG (pre-Ampere).
- nvmlDeviceGetMaxMigDeviceCount -> int; 0 when MIG is not enabled (nvml.h: "Returns zero if MIG is not
  supported or enabled"); 7 on an H200 in MIG mode.
- nvmlDeviceGetMigDeviceHandleByIndex -> c_nvmlDevice_t; NOT_FOUND when no MIG device exists at that index,
  INVALID_ARGUMENT for an index out of range, NOT_SUPPORTED when MIG is off.
- nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId -> int, on a MIG device handle only
  (NOT_SUPPORTED on a GPU handle, INVALID_ARGUMENT on a stale MIG handle).
- nvmlDeviceIsMigDeviceHandle -> a ctypes c_uint, not an int (pynvml returns the c_uint itself).
- nvmlDeviceGetDeviceHandleFromMigDeviceHandle -> the parent's handle; NOT_SUPPORTED on a GPU handle.
- nvmlDeviceGetGpuInstanceById -> c_nvmlGpuInstance_t; "Requires privileged user": NO_PERMISSION unless
  ``FakeNode.privileged``; NOT_FOUND for an unknown id; NOT_SUPPORTED when MIG is off.
- nvmlGpuInstanceGetInfo -> c_nvmlGpuInstanceInfo_t (device, id, profileId, placement).
- nvmlDeviceGetGpuInstanceProfileInfoByIdV -> c_nvmlGpuInstanceProfileInfo_v2_t whose ``name`` (a char
  array) pynvml's _PrintableStructure returns as str, e.g. "MIG 1g.18gb"; NOT_SUPPORTED when MIG is off.
- nvmlDeviceGetName / nvmlDeviceGetUUID / nvmlDeviceGetMemoryInfo / nvmlDeviceGetAttributes accept MIG
  device handles (nvml.h: MIG device names, globally unique MIG UUIDs, per-instance memory, attributes
  "currently only supports MIG device handles"). The MIG device name's form ("<GPU name> MIG 1g.18gb")
  is what CUDA reports for MIG devices; NVML's own string was not seen on hardware here.
- nvmlDeviceGetMemoryInfo(handle) -> c_nvmlMemory_t whose ``used`` is "the sum of reserved and allocated
  device memory"; with version nvmlMemory_v2 -> c_nvmlMemory_v2_t with ``reserved`` apart and ``used`` the
  allocated memory only (nvml.h; an H200 without processes answered used 0 there, the reserve in v1's
  used); FUNCTION_NOT_FOUND where the driver lacks nvmlDeviceGetMemoryInfo_v2 (pynvml's own answer).
- nvmlDeviceGetMemoryInfo on the GPU handle of a GPU in MIG mode: NO_PERMISSION unless privileged ("In MIG
  mode, if device handle is provided, the API returns aggregate information, only if the caller has
  appropriate privileges").
- nvmlDeviceGetUtilizationRates / nvmlDeviceGetSamples on a GPU in MIG mode: NOT_SUPPORTED ("On
  MIG-enabled GPUs, querying device utilization rates is not currently supported").
- nvmlGpmMigSampleGet(parent, gpuInstanceId, sample): nvml.h only says "Nonzero NVML_ERROR_? enum on
  error"; the fake answers NOT_FOUND for a GPU instance that does not exist and NOT_SUPPORTED when MIG is
  off or GPM unsupported (assumed codes: smlens treats any failure alike).
Any other pynvml function called with a MIG device handle raises AssertionError. The fake hands out the
same handle object for a MIG device on every call; nvml.h does not say whether real NVML does, and smlens
never compares MIG handles.

Older nvidia-ml-py: ``FakeNode(..., pynvml_version="12.575.51")`` leaves out of ``module`` the functions that
version lacks (``PYNVML_LACKS``). Checked by ``pip download --no-deps nvidia-ml-py==V`` of 12.535.161,
12.570.86 and 12.575.51 and a grep of their pynvml.py for every ``nvml*`` name smlens uses (2026-11-30):
each defines them all, with the same signatures as 13.615.71, except nvmlDeviceGetGpuInstanceProfileInfoByIdV
(13.615.71 has it as an alias of nvmlDeviceGetGpuInstanceProfileInfoById).
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

INSTALLED_PYNVML = "13.615.71"
_NO_PROFILE_INFO_V = frozenset({"nvmlDeviceGetGpuInstanceProfileInfoByIdV"})
# The functions (among those the fake scripts) each checked older nvidia-ml-py does not define.
PYNVML_LACKS: dict[str, frozenset[str]] = {
    "12.535.161": _NO_PROFILE_INFO_V,
    "12.570.86": _NO_PROFILE_INFO_V,
    "12.575.51": _NO_PROFILE_INFO_V,
    INSTALLED_PYNVML: frozenset(),
}


def _error(code: int) -> Exception:
    error: Exception = real.NVMLError(code)
    return error


def _supported(value: T | None) -> T:
    if value is None:
        raise _error(real.NVML_ERROR_NOT_SUPPORTED)
    return value


@dataclass
class FakeMigDevice:
    """One compute instance of a GPU instance: a MIG device with its own handle and UUID."""

    uuid: str
    compute_instance: int = 0
    sm_count: int = 16


@dataclass
class FakeGpuInstance:
    """One MIG GPU instance: its id, profile, memory and GPM rates, and its compute instances."""

    id: int
    devices: list[FakeMigDevice]
    profile_id: int = 19  # the 1g profile's id in `nvidia-smi mig -lgip` on A100 and H100
    profile_name: str = "MIG 1g.18gb"
    slice_count: int = 1
    memory_total: int = 17_716_740_096
    memory_used: int | None = 4_194_304
    gpm_rates: dict[int, float] = field(default_factory=dict)  # metric id -> percent from now on


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
    memory_used: int | None = 1_048_576  # allocated: what version 2 of nvmlDeviceGetMemoryInfo says is used
    memory_reserved: int = 0  # the driver's own reserve: version 2 reports it apart, version 1 within used
    memory_v2: bool = True  # the driver has nvmlDeviceGetMemoryInfo_v2 (FUNCTION_NOT_FOUND otherwise)
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
    mig_mode: int | None = real.NVML_DEVICE_MIG_DISABLE  # None: the GPU has no MIG (NOT_SUPPORTED)
    max_mig_devices: int = 7
    gpu_instances: list[FakeGpuInstance] = field(default_factory=list)

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode == real.NVML_DEVICE_MIG_ENABLE

    def mig_devices(self) -> list[tuple[FakeGpuInstance, FakeMigDevice]]:
        """MIG devices in index order: by GPU instance, then compute instance."""
        return [
            (gi, device)
            for gi in sorted(self.gpu_instances, key=lambda g: g.id)
            for device in sorted(gi.devices, key=lambda d: d.compute_instance)
        ]


# Functions nvml.h documents for MIG device handles, and that smlens calls with them.
MIG_HANDLE_CALLS = frozenset(
    {
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetAttributes",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    }
)


@dataclass
class _Sample:
    gpu: str | None = None  # uuid of the GPU it was taken on; None until taken
    gpu_instance: int | None = None  # the GPU instance of a MIG sample
    time_us: int = 0
    integrals: dict[int, float] = field(default_factory=dict)


class FakeNode:
    """A node of fake GPUs; ``module`` is the pynvml stand-in that reads and changes it."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        driver_version: str = "580.159.04",
        pynvml_version: str = INSTALLED_PYNVML,
    ) -> None:
        self.gpus = list(gpus)
        self._lacks = PYNVML_LACKS[pynvml_version]
        self.driver_version = driver_version
        self.library_missing = False
        self.init_error: int | None = None  # NVML code nvmlInit fails with
        self.initialized = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.time_us = 10 * US
        self.event_wait_timeouts: list[int] = []
        self.metric_requests: list[list[int]] = []
        self.privileged = False  # may call the functions nvml.h marks "Requires privileged user"
        self._mig_structs: dict[int, Any] = {}  # id(FakeMigDevice) -> its handle's struct
        self._gi_structs: dict[int, Any] = {}  # id(FakeGpuInstance) -> its handle's struct
        self._mig_integrals: dict[tuple[str, int], dict[int, float]] = {}  # (uuid, GI id) -> integrals
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
            for gi in gpu.gpu_instances:
                mig = self._mig_integrals.setdefault((gpu.uuid, gi.id), {})
                for metric, rate in gi.gpm_rates.items():
                    mig[metric] = mig.get(metric, 0.0) + rate * seconds
        self.time_us += round(seconds * US)

    def create_instance(self, uuid: str, instance: FakeGpuInstance) -> None:
        """An administrator creates a GPU instance (with its compute instances) while smlens runs."""
        gpu = self.gpu(uuid)
        assert all(gi.id != instance.id for gi in gpu.gpu_instances), "GPU instance ids are unique per GPU"
        gpu.gpu_instances.append(instance)

    def destroy_instance(self, uuid: str, gpu_instance: int) -> None:
        """An administrator destroys a GPU instance: its MIG device handles become invalid."""
        gpu = self.gpu(uuid)
        gpu.gpu_instances = [gi for gi in gpu.gpu_instances if gi.id != gpu_instance]
        self._mig_integrals.pop((uuid, gpu_instance), None)

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
            if name.startswith("__") or name in self._lacks:
                continue
            if name.startswith("nvml") and isinstance(value, types.FunctionType):
                value = getattr(self, name, None) or _unscripted(name)
            setattr(module, name, value)
        return module

    def _check_init(self) -> None:
        if self.initialized <= 0:
            raise _error(real.NVML_ERROR_UNINITIALIZED)

    def _device(self, function: str, handle: Any) -> FakeGpu:
        gpu, mig = self._resolve(function, handle)
        if mig is not None:
            raise AssertionError(f"fake pynvml: {function} is not scripted for MIG device handles")
        return gpu

    def _resolve(
        self, function: str, handle: Any
    ) -> tuple[FakeGpu, tuple[FakeGpuInstance, FakeMigDevice] | None]:
        """The GPU a handle names and, for a MIG device handle, its GPU instance and MIG device."""
        self._check_init()
        address = ctypes.addressof(handle.contents)
        addresses = [ctypes.addressof(d) for d in self._devices]
        mig = None
        if address in addresses:
            gpu = self.gpus[addresses.index(address)]
        else:
            gpu, mig = self._mig_handle_owner(address)
            if function not in MIG_HANDLE_CALLS:
                raise AssertionError(f"fake pynvml: {function} is not scripted for MIG device handles")
        gpu.calls[function] += 1
        if gpu.lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise _error(gpu.errors[function])
        return gpu, mig

    def _mig_handle_owner(self, address: int) -> tuple[FakeGpu, tuple[FakeGpuInstance, FakeMigDevice]]:
        for gpu in self.gpus:
            for gi, device in gpu.mig_devices() if gpu.mig_enabled else ():
                struct = self._mig_structs.get(id(device))
                if struct is not None and ctypes.addressof(struct) == address:
                    return gpu, (gi, device)
        # A handle of a destroyed MIG device (nvml.h: "the MIG device handle would remain invalid").
        raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_handle(self, device: FakeMigDevice) -> Any:
        struct = self._mig_structs.setdefault(id(device), real.struct_c_nvmlDevice_t())
        return ctypes.pointer(struct)

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
        gpu, mig = self._resolve("nvmlDeviceGetUUID", handle)
        return gpu.uuid if mig is None else mig[1].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._resolve("nvmlDeviceGetName", handle)
        return gpu.name if mig is None else f"{gpu.name} {mig[0].profile_name}"

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return _supported(self._device("nvmlDeviceGetSerial", handle).serial)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = real.nvmlPciInfo_t()
        info.busId = self._device("nvmlDeviceGetPciInfo", handle).pci_bus_id.encode()
        return info

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        gpu, mig = self._resolve("nvmlDeviceGetAttributes", handle)
        attributes = real.c_nvmlDeviceAttributes()
        if mig is None:
            attributes.multiprocessorCount = _supported(gpu.sm_count)
        else:
            gi, device = mig
            attributes.multiprocessorCount = device.sm_count
            attributes.gpuInstanceSliceCount = gi.slice_count
            attributes.memorySizeMB = gi.memory_total >> 20
        return attributes

    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int:
        return _supported(self._device("nvmlDeviceGetNumGpuCores", handle).cuda_cores)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    # ---- gauges and counters --------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, mig = self._resolve("nvmlDeviceGetMemoryInfo", handle)
        if mig is None and gpu.mig_enabled and not self.privileged:
            raise _error(real.NVML_ERROR_NO_PERMISSION)  # nvml.h: aggregate in MIG mode only if privileged
        total, used = (
            (gpu.memory_total, gpu.memory_used) if mig is None else (mig[0].memory_total, mig[0].memory_used)
        )
        used = _supported(used)
        reserved = gpu.memory_reserved if mig is None else 0
        free = total - used - reserved
        if version is None:  # nvml.h: v1's used is the sum of reserved and allocated memory
            return real.c_nvmlMemory_t(total=total, free=free, used=used + reserved)
        if not gpu.memory_v2:
            raise _error(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != real.nvmlMemory_v2:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return real.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved, free=free, used=used)

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
        if gpu.mig_enabled:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return real.c_nvmlUtilization_t(gpu=_supported(gpu.utilization_percent), memory=0)

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int, last_seen: int) -> tuple[int, list[Any]]:
        gpu = self._device("nvmlDeviceGetSamples", handle)
        assert sampling_type == real.NVML_GPU_UTILIZATION_SAMPLES
        if gpu.mig_enabled:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        # As the real driver does: timestamps compare to the millisecond.
        newer = [s for s in _supported(gpu.utilization_samples) if s[0] // 1000 > last_seen // 1000]
        if not newer:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        samples = []
        for stamp, percent in newer:
            sample = real.c_nvmlSample_t(timeStamp=stamp)
            sample.sampleValue.uiVal = percent
            samples.append(sample)
        return real.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    # ---- MIG ----------------------------------------------------------------------------------------
    def _mig_gpu(self, function: str, handle: Any) -> FakeGpu:
        """A GPU handle of a GPU in MIG mode; NOT_SUPPORTED without MIG."""
        gpu = self._device(function, handle)
        if not gpu.mig_enabled:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetMigMode", handle)
        mode = _supported(gpu.mig_mode)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetMaxMigDeviceCount", handle)
        return gpu.max_mig_devices if gpu.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._mig_gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not 0 <= index < gpu.max_mig_devices:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        devices = gpu.mig_devices()
        if index >= len(devices):
            raise _error(real.NVML_ERROR_NOT_FOUND)
        return self._mig_handle(devices[index][1])

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        _, mig = self._resolve("nvmlDeviceIsMigDeviceHandle", handle)
        return ctypes.c_uint(mig is not None)

    def _mig_of(self, function: str, handle: Any) -> tuple[FakeGpu, FakeGpuInstance, FakeMigDevice]:
        gpu, mig = self._resolve(function, handle)
        if mig is None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig[0], mig[1]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_of("nvmlDeviceGetGpuInstanceId", handle)[1].id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_of("nvmlDeviceGetComputeInstanceId", handle)[2].compute_instance

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        gpu = self._mig_of("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)[0]
        return self._handle(self.gpus.index(gpu))

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance: int) -> Any:
        gpu = self._mig_gpu("nvmlDeviceGetGpuInstanceById", handle)
        if not self.privileged:
            raise _error(real.NVML_ERROR_NO_PERMISSION)
        for gi in gpu.gpu_instances:
            if gi.id == gpu_instance:
                struct = self._gi_structs.setdefault(id(gi), real.struct_c_nvmlGpuInstance_t())
                return ctypes.pointer(struct)
        raise _error(real.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, instance: Any) -> Any:
        self._check_init()
        for position, gpu in enumerate(self.gpus):
            for gi in gpu.gpu_instances:
                struct = self._gi_structs.get(id(gi))
                if struct is not None and ctypes.addressof(struct) == ctypes.addressof(instance.contents):
                    info = real.c_nvmlGpuInstanceInfo_t()
                    info.device, info.id, info.profileId = self._handle(position), gi.id, gi.profile_id
                    return info
        raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle: Any, profile_id: int) -> Any:
        gpu = self._mig_gpu("nvmlDeviceGetGpuInstanceProfileInfoByIdV", handle)
        for gi in gpu.gpu_instances:
            if gi.profile_id == profile_id:
                info = real.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.id, info.sliceCount, info.name = profile_id, gi.slice_count, gi.profile_name.encode()
                info.multiprocessorCount = sum(d.sm_count for d in gi.devices)
                info.memorySizeMB = gi.memory_total >> 20
                return info
        raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

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
        taken.gpu_instance = None
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance: int, sample: Any) -> Any:
        gpu = self._device("nvmlGpmMigSampleGet", handle)
        if not gpu.gpm_supported or not gpu.mig_enabled:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        if all(gi.id != gpu_instance for gi in gpu.gpu_instances):
            raise _error(real.NVML_ERROR_NOT_FOUND)
        taken = self._sample(sample)
        taken.gpu, taken.gpu_instance, taken.time_us = gpu.uuid, gpu_instance, self.time_us
        taken.integrals = dict(self._mig_integrals.get((gpu.uuid, gpu_instance), {}))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._check_init()
        if request.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        if (
            first.gpu is None
            or (first.gpu, first.gpu_instance) != (second.gpu, second.gpu_instance)
            or second.time_us <= first.time_us
        ):
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


def install(
    monkeypatch: pytest.MonkeyPatch, *gpus: FakeGpu, pynvml_version: str = INSTALLED_PYNVML
) -> FakeNode:
    """A node of these GPUs, put in place of pynvml (of that version) for the rest of the test."""
    node = FakeNode(gpus, pynvml_version=pynvml_version)
    monkeypatch.setitem(sys.modules, "pynvml", node.module)
    return node
