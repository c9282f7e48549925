"""NVML backend: finds the GPUs and reads NVML utilization, memory, power, temperatures, clocks, energy,
ECC and PCIe replay counters, clock-event reasons and XID errors.

The CLI opens it together with the GPM backend, so that both share one NVML initialisation::

    nvml, gpm = open_nvml_backends(energy_interval=15.0, utilization_interval=5.0)
    gpus = nvml.discover()  # BackendUnavailable with one sentence when NVML cannot start
    nvml.attach(gpus); gpm.attach(gpus)
    ...
    gpm.close(); nvml.close()  # nvmlShutdown runs at the last close
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from smlens.errors import BackendError, BackendUnavailable, ConfigError, GpuLostError
from smlens.model import ZERO_ACTIVITY, Activity, GpuIdentity, InstanceReading, Reading
from smlens.names import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ENERGY_JOULES,
    MEMORY_CLOCK_HERTZ,
    MEMORY_TEMPERATURE_CELSIUS,
    MEMORY_TOTAL_BYTES,
    MEMORY_USED_BYTES,
    PCIE_REPLAYS,
    POWER_LIMIT_WATTS,
    POWER_WATTS,
    SM_CLOCK_HERTZ,
    SM_CLOCK_MAX_HERTZ,
    TEMPERATURE_CELSIUS,
    UTILIZATION,
)
from smlens.sources.base import Captured, DeviceSource, finish
from smlens.sources.nvml.calls import (
    Absent,
    attach_each,
    call,
    describe,
    failure,
    nvml_module,
    text,
    value_of,
)
from smlens.sources.nvml.gpm import GpmBackend
from smlens.sources.nvml.mig import GpuInstanceLayout
from smlens.sources.nvml.session import NvmlSession
from smlens.sources.nvml.xids import XidWatch

log = logging.getLogger(__name__)

# Reads far slower than the per-tick calls (bench/nvml_call_cost.py times each) are not made every tick:
DEFAULT_ENERGY_INTERVAL = 15.0  # energy and PCIe replay counters: slow calls, and counters need no more
DEFAULT_UTILIZATION_INTERVAL = 5.0  # utilization samples: a slow call, and the driver keeps several s of them
CLOCK_EVENTS = "clock_events"  # key in Reading.missing
XID_EVENTS = "xid_events"  # key in Reading.missing

# Reason names of docs/metrics.md and the pynvml constant of each one's bit.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", "nvmlClocksEventReasonGpuIdle"),
    ("applications_clocks_setting", "nvmlClocksEventReasonApplicationsClocksSetting"),
    ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap"),
    ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
    ("sync_boost", "nvmlClocksEventReasonSyncBoost"),
    ("sw_thermal_slowdown", "nvmlClocksEventReasonSwThermalSlowdown"),
    ("hw_thermal_slowdown", "nvmlClocksEventReasonHwThermalSlowdown"),
    ("hw_power_brake_slowdown", "nvmlClocksEventReasonHwPowerBrakeSlowdown"),
    ("display_clock_setting", "nvmlClocksEventReasonDisplayClockSetting"),
)

# The every-tick reads that give one number each (memory info, field values, clock-event reasons and the XID
# drain are read apart): key, pynvml function, the names of the pynvml constants it takes after the handle,
# the factor to the metric's unit, and whether it is a total.
TICK_READS = (
    (POWER_WATTS, "nvmlDeviceGetPowerUsage", (), 1e-3, False),
    (POWER_LIMIT_WATTS, "nvmlDeviceGetEnforcedPowerLimit", (), 1e-3, False),
    (TEMPERATURE_CELSIUS, "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), 1.0, False),
    (SM_CLOCK_HERTZ, "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), 1e6, False),
    (MEMORY_CLOCK_HERTZ, "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), 1e6, False),
    (
        ECC_CORRECTED,
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
        1.0,
        True,
    ),
    (
        ECC_UNCORRECTED,
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        1.0,
        True,
    ),
)
TickRead = tuple[str, str, tuple[Any, ...], float, bool]  # TICK_READS with the handle and constants bound


# CUDA cores per SM by compute capability: the SM count is NVML's core count divided by this where
# nvmlDeviceGetAttributes answers only for MIG devices (as on a whole H200).
_CORES_PER_SM = {
    (7, 0): 64,
    (7, 5): 64,
    (8, 0): 64,
    (8, 6): 128,
    (8, 7): 128,
    (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128,
    (12, 0): 128,
}


def open_nvml_backends(
    energy_interval: float = DEFAULT_ENERGY_INTERVAL,
    utilization_interval: float = DEFAULT_UTILIZATION_INTERVAL,
) -> tuple[NvmlBackend, GpmBackend]:
    """The nvml device source and the gpm profiling backend, sharing one NVML session."""
    session = NvmlSession()
    return NvmlBackend(session, energy_interval, utilization_interval), GpmBackend(session)


def _seconds(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}.")
    return value


@dataclass
class _Device:
    handle: Any
    label: str
    max_sm_clock: float | Absent
    clock_event_bits: tuple[tuple[str, int], ...] | Absent  # the reasons this GPU reports
    xid_watch: Absent | None  # why XIDs are not watched, None when they are
    reads: tuple[TickRead, ...]  # TICK_READS for this handle
    # Every tick's calls, as (pynvml function, arguments): memory info, ``reads``, the memory temperature
    # field and, where the GPU reports them, the clock-event reasons.
    calls: tuple[tuple[Callable[..., Any], tuple[Any, ...]], ...]
    samples_supported: bool = True
    rates_supported: bool = True  # False once NVML said not_supported (as on a GPU in MIG mode)
    last_sample_us: int | None = None  # newest utilization sample seen
    next_samples_at: float = -math.inf
    last_read: float | None = None  # `now` of the last utilization-rate read (fallback only)
    counters: dict[str, float | Absent] = field(default_factory=dict)  # energy, PCIe replays: last read
    next_counters_at: float = -math.inf
    # The last clock-event reasons decoded, with the bits they came from: they rarely change between ticks.
    clock_events_seen: tuple[int, Mapping[str, bool]] | None = None


def bind_tick_reads(nv: Any, handle: Any) -> tuple[TickRead, ...]:
    """TICK_READS with the device handle and the pynvml constants in place."""
    return tuple(
        (key, fn, (handle, *(getattr(nv, c) for c in constants)), scale, is_total)
        for key, fn, constants, scale, is_total in TICK_READS
    )


def _memory_arguments(nv: Any, handle: Any, label: str) -> tuple[Any, ...]:
    """nvmlDeviceGetMemoryInfo's arguments for this GPU: version 2 where the driver has it, whose
    ``used`` leaves out the memory the driver reserves for itself (as nvidia-smi and DCGM's FB_USED
    do); version 1 counts that reserve as used, so that a GPU without processes would look held."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None and not isinstance(
        call(nv.nvmlDeviceGetMemoryInfo, handle, version, gpu=label), Absent
    ):
        return (handle, version)
    return (handle,)


def decode_plain(
    results: list[Any],
    reads: tuple[TickRead, ...],
    gauges: dict[str, float],
    totals: dict[str, float],
    missing: dict[str, str],
) -> None:
    """Memory info's and the bound TICK_READS' results (``results[0]`` and those after it) in ``gauges``
    and ``totals``, each NVML error (an Absent) in ``missing`` by reason."""
    memory = results[0]
    if isinstance(memory, Absent):
        missing[MEMORY_USED_BYTES] = missing[MEMORY_TOTAL_BYTES] = memory.reason
    else:
        gauges[MEMORY_USED_BYTES] = float(memory.used)
        gauges[MEMORY_TOTAL_BYTES] = float(memory.total)
    for (key, _, _, scale, is_total), value in zip(reads, results[1 : len(reads) + 1], strict=True):
        if isinstance(value, Absent):
            missing[key] = value.reason
        else:
            (totals if is_total else gauges)[key] = value * scale


def _scaled(value: Any, factor: float) -> float | Absent:
    return value if isinstance(value, Absent) else float(value) * factor


class NvmlBackend(DeviceSource):
    """The NVML device source.

    ``energy_interval``: seconds between two reads of the energy and PCIe replay counters;
    ``utilization_interval``: seconds between two reads of the driver's utilization samples (each read
    integrates every sample since the previous one, so the utilization integral stays exact).
    """

    name = "nvml"

    def __init__(
        self,
        session: NvmlSession,
        energy_interval: float = DEFAULT_ENERGY_INTERVAL,
        utilization_interval: float = DEFAULT_UTILIZATION_INTERVAL,
    ) -> None:
        self._session = session
        self._energy_interval = _seconds("energy interval", energy_interval)
        self._utilization_interval = _seconds("utilization interval", utilization_interval)
        self._devices: dict[str, _Device] = {}
        self._xids = XidWatch()

    @property
    def session(self) -> NvmlSession:
        """The NVML session this backend reads through, shared with the gpm backend and attribution."""
        return self._session

    def discover(self) -> list[GpuIdentity]:
        self._session.acquire(self)
        nv = nvml_module()
        count = call(nv.nvmlDeviceGetCount)
        if isinstance(count, Absent):
            raise BackendUnavailable(
                f"NVML started but cannot count the GPUs of this machine ({count.reason}).",
                reason=count.reason,
            )
        driver = call(nv.nvmlSystemGetDriverVersion)
        driver_version = "" if isinstance(driver, Absent) else text(driver)
        gpus: list[GpuIdentity] = []
        for index in range(count):
            try:
                identity = self._identify(nv, index, driver_version)
            except GpuLostError as exc:
                log.error("GPU %d left out: %s", index, exc)
                continue
            if identity is not None:
                gpus.append(identity)
        return gpus

    def _identify(self, nv: Any, index: int, driver_version: str) -> GpuIdentity | None:
        where = f"GPU {index}"
        handle = call(nv.nvmlDeviceGetHandleByIndex, index, gpu=where)
        uuid = handle if isinstance(handle, Absent) else call(nv.nvmlDeviceGetUUID, handle, gpu=where)
        if isinstance(uuid, Absent):
            log.error("GPU %d left out: NVML gives neither its handle nor its UUID (%s)", index, uuid.reason)
            return None

        def string(fn: Any) -> str:
            got = call(fn, handle, gpu=where)
            return "" if isinstance(got, Absent) else text(got)

        pci = call(nv.nvmlDeviceGetPciInfo, handle, gpu=where)
        capability = call(nv.nvmlDeviceGetCudaComputeCapability, handle, gpu=where)
        self._session.remember(text(uuid), handle)
        return GpuIdentity(
            index=index,
            uuid=text(uuid),
            name=string(nv.nvmlDeviceGetName),
            pci_bus_id="" if isinstance(pci, Absent) else text(pci.busId),
            driver_version=driver_version,
            serial=string(nv.nvmlDeviceGetSerial),
            sm_count=self._sm_count(nv, handle, capability, where),
            compute_capability="" if isinstance(capability, Absent) else "{}.{}".format(*capability),
        )

    @staticmethod
    def _sm_count(nv: Any, handle: Any, capability: tuple[int, int] | Absent, where: str) -> int | None:
        attributes = call(nv.nvmlDeviceGetAttributes, handle, gpu=where)
        if not isinstance(attributes, Absent) and attributes.multiprocessorCount > 0:
            return int(attributes.multiprocessorCount)
        per_sm = None if isinstance(capability, Absent) else _CORES_PER_SM.get((capability[0], capability[1]))
        if per_sm is None:
            return None
        cores = call(nv.nvmlDeviceGetNumGpuCores, handle, gpu=where)
        if isinstance(cores, Absent) or cores % per_sm:
            return None
        return int(cores) // per_sm

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        self._session.acquire(self)
        nv = nvml_module()
        return attach_each(gpus, lambda gpu: self._attach_one(nv, gpu))

    def _attach_one(self, nv: Any, gpu: GpuIdentity) -> str | None:
        handle = self._session.handle(gpu)
        if isinstance(handle, Absent):
            return f"NVML has no handle for this GPU ({handle.reason})"
        label = describe(gpu)
        supported = call(nv.nvmlDeviceGetSupportedClocksEventReasons, handle, gpu=label)
        device = _Device(
            handle=handle,
            label=label,
            max_sm_clock=_scaled(
                call(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM, gpu=label), 1e6
            ),
            clock_event_bits=supported
            if isinstance(supported, Absent)
            else tuple(
                (reason, getattr(nv, bit))
                for reason, bit in CLOCK_EVENT_REASONS
                if supported & getattr(nv, bit)
            ),
            xid_watch=self._xids.watch(gpu.uuid, handle, label),
            reads=(reads := bind_tick_reads(nv, handle)),
            calls=(
                (nv.nvmlDeviceGetMemoryInfo, _memory_arguments(nv, handle, label)),
                *((getattr(nv, fn), args) for _, fn, args, _, _ in reads),
                (nv.nvmlDeviceGetFieldValues, (handle, [nv.NVML_FI_DEV_MEMORY_TEMP])),
                *(
                    ()
                    if isinstance(supported, Absent)
                    else ((nv.nvmlDeviceGetCurrentClocksEventReasons, (handle,)),)
                ),
            ),
        )
        self._prime_samples(device)
        self._devices[gpu.uuid] = device
        return None

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        return finish(self.capture(gpu, now))

    def capture(self, gpu: GpuIdentity, now: float) -> Captured:
        device = self._devices.get(gpu.uuid)
        if device is None:
            raise BackendError(f"the nvml backend is not attached to {describe(gpu)}.", reason="not_attached")
        nv = nvml_module()
        error = nv.NVMLError
        results: list[Any] = []
        for fn, args in device.calls:  # no wrapper per call; a lost GPU raises here, at its first call
            try:
                results.append(fn(*args))
            except error as exc:
                results.append(failure(exc.value, device.label))
        handle = device.handle
        if now >= device.next_counters_at:
            device.counters = {
                ENERGY_JOULES: _scaled(
                    call(nv.nvmlDeviceGetTotalEnergyConsumption, handle, gpu=device.label), 1e-3
                ),
                PCIE_REPLAYS: _scaled(call(nv.nvmlDeviceGetPcieReplayCounter, handle, gpu=device.label), 1),
            }
            device.next_counters_at = now + self._energy_interval
        due = not device.samples_supported or now >= device.next_samples_at
        layout = self._session.mig_layout(gpu, now)
        return functools.partial(
            self._reading,
            device,
            results,
            device.counters,
            self._utilization(device, now) if due else None,
            self._xids.take(gpu.uuid),
            () if layout is None or isinstance(layout, Absent) else self._instances(gpu, device, layout),
            not isinstance(layout, Absent),
        )

    def _reading(
        self,
        device: _Device,
        results: list[Any],
        counters: dict[str, float | Absent],
        utilization: Activity | Absent | None,
        xid_events: Mapping[int, int],
        instances: tuple[InstanceReading, ...],
        mig_layout_read: bool,
    ) -> Reading:
        """The Reading of one tick's captured results."""
        nv = nvml_module()
        label = device.label
        gauges: dict[str, float] = {}
        totals: dict[str, float] = {}
        missing: dict[str, str] = {}
        decode_plain(results, device.reads, gauges, totals, missing)
        fields = results[len(device.reads) + 1]
        temperature = self._memory_temperature(nv, fields, label)
        if isinstance(temperature, Absent):
            missing[MEMORY_TEMPERATURE_CELSIUS] = temperature.reason
        else:
            gauges[MEMORY_TEMPERATURE_CELSIUS] = temperature
        if isinstance(device.max_sm_clock, Absent):
            missing[SM_CLOCK_MAX_HERTZ] = device.max_sm_clock.reason
        else:
            gauges[SM_CLOCK_MAX_HERTZ] = device.max_sm_clock
        for key, counted in counters.items():  # between reads, the last values read
            if isinstance(counted, Absent):
                missing[key] = counted.reason
            else:
                totals[key] = counted
        clock_events = self._clock_events(device, results[-1])
        if isinstance(clock_events, Absent):
            missing[CLOCK_EVENTS] = clock_events.reason
            clock_events = {}
        activity: dict[str, Activity] = {}
        if isinstance(utilization, Absent):
            missing[UTILIZATION] = utilization.reason
        elif utilization is not None:
            activity[UTILIZATION] = utilization
        if device.xid_watch is not None:
            missing[XID_EVENTS] = device.xid_watch.reason
        return Reading(
            source=self.name,
            gauges=gauges,
            activity=activity,
            totals=totals,
            clock_events=clock_events,
            xid_events=xid_events,
            missing=missing,
            instances=instances,
            mig_layout_read=mig_layout_read,
        )

    def _instances(
        self, gpu: GpuIdentity, device: _Device, layout: tuple[GpuInstanceLayout, ...]
    ) -> tuple[InstanceReading, ...]:
        """Memory used and total of each MIG GPU instance (NVML gives no utilization per instance)."""
        nv = nvml_module()
        readings = []
        for found in layout:
            memory = call(nv.nvmlDeviceGetMemoryInfo, found.handles[0], gpu=device.label)
            if isinstance(memory, Absent) and memory.reason in ("invalid_argument", "not_found"):
                self._session.rescan_mig(gpu)  # a stale MIG device handle: the instance is gone
                continue
            if isinstance(memory, Absent):
                missing = {MEMORY_USED_BYTES: memory.reason, MEMORY_TOTAL_BYTES: memory.reason}
                readings.append(InstanceReading(found.instance, missing=missing))
            else:
                gauges = {MEMORY_USED_BYTES: float(memory.used), MEMORY_TOTAL_BYTES: float(memory.total)}
                readings.append(InstanceReading(found.instance, gauges=gauges))
        return tuple(readings)

    def _utilization(self, device: _Device, now: float) -> Activity | Absent:
        """Time-weighted NVML utilization since the last samples read (they are read when due)."""
        nv = nvml_module()
        if device.samples_supported:
            device.next_samples_at = now + self._utilization_interval
            # From just before the newest sample seen, so that it comes back too (see _integrate);
            # NVML compares these timestamps to the millisecond, so a margin of 10 ms keeps it in.
            since = max((device.last_sample_us or 0) - 10_000, 0)
            got = call(
                nv.nvmlDeviceGetSamples,
                device.handle,
                nv.NVML_GPU_UTILIZATION_SAMPLES,
                since,
                gpu=device.label,
            )
            if not isinstance(got, Absent):
                return self._integrate(device, *got)
            if got.reason == "not_found":
                return ZERO_ACTIVITY
            if got.reason != "not_supported":
                return got
            device.samples_supported = False
        if not device.rates_supported:
            return Absent("not_supported")
        rates = call(nv.nvmlDeviceGetUtilizationRates, device.handle, gpu=device.label)
        previous, device.last_read = device.last_read, now
        if isinstance(rates, Absent):
            device.rates_supported = rates.reason != "not_supported"
            return rates
        if previous is None:
            return ZERO_ACTIVITY
        return Activity.of(rates.gpu / 100, now - previous)

    @classmethod
    def _prime_samples(cls, device: _Device) -> None:
        """Note the newest utilization sample the driver holds: the first read integrates from there."""
        nv = nvml_module()
        got = call(
            nv.nvmlDeviceGetSamples, device.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, 0, gpu=device.label
        )
        if isinstance(got, Absent):
            device.samples_supported = got.reason != "not_supported"
        else:
            cls._integrate(device, *got)  # only to find the newest timestamp; that history is not ours

    @staticmethod
    def _integrate(device: _Device, value_type: int, samples: Sequence[Any]) -> Activity | Absent:
        """Each sample's percentage holds from the previous sample's timestamp to its own.

        The newest sample seen before comes back first unless the driver's ring buffer (~14 s of
        samples on an H200) overran since: then the time before the oldest sample left is not covered.
        """
        ordered = sorted(samples, key=lambda s: int(s.timeStamp))
        previous = device.last_sample_us
        if ordered and previous and int(ordered[0].timeStamp) > previous:
            previous = None
        active = covered = 0.0
        for sample in ordered:
            stamp = int(sample.timeStamp)
            if previous is not None:
                if stamp <= previous:
                    continue
                percent = value_of(sample.sampleValue, value_type)
                if isinstance(percent, Absent):
                    return percent
                seconds = (stamp - previous) / 1e6
                active += percent / 100 * seconds
                covered += seconds
            previous = stamp
        device.last_sample_us = previous
        return Activity(active, covered)

    @staticmethod
    def _memory_temperature(nv: Any, fields: Any, label: str) -> float | Absent:
        if isinstance(fields, Absent):
            return fields
        field = fields[0]
        if field.nvmlReturn != nv.NVML_SUCCESS:
            return failure(field.nvmlReturn, label)
        return value_of(field.value, field.valueType)

    @staticmethod
    def _clock_events(device: _Device, current: Any) -> Mapping[str, bool] | Absent:
        if isinstance(device.clock_event_bits, Absent):
            return device.clock_event_bits
        if isinstance(current, Absent):
            return current
        seen = device.clock_events_seen
        if seen is not None and seen[0] == current:
            return seen[1]
        decoded = MappingProxyType({reason: bool(current & bit) for reason, bit in device.clock_event_bits})
        device.clock_events_seen = (current, decoded)
        return decoded

    def close(self) -> None:
        self._xids.close()
        self._devices.clear()
        self._session.release(self)
