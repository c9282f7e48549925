"""NVML backend: finds the GPUs and reads NVML utilization, memory, power, temperatures, clocks, energy,
ECC and PCIe replay counters, clock-event reasons and XID errors.

The CLI opens it together with the GPM backend, so that both share one NVML initialisation::

    nvml, gpm = open_nvml_backends(energy_interval=15.0)
    gpus = nvml.discover()  # BackendUnavailable with one sentence when NVML cannot start
    nvml.attach(gpus); gpm.attach(gpus)
    ...
    gpm.close(); nvml.close()  # nvmlShutdown runs at the last close
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smlens.backends.base import DeviceSource
from smlens.backends.gpm import GpmBackend
from smlens.backends.nvml_calls import Absent, address, call, describe, failure, nvml_module, text, value_of
from smlens.backends.nvml_session import NvmlSession
from smlens.errors import BackendError, BackendUnavailable, ConfigError, GpuLostError
from smlens.model import (
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
    ZERO_ACTIVITY,
    Activity,
    GpuIdentity,
    Reading,
)

log = logging.getLogger(__name__)

DEFAULT_ENERGY_INTERVAL = 15.0  # seconds; one energy read costs ~4 ms on an H200
CLOCK_EVENTS = "clock_events"  # key in Reading.missing
XID_EVENTS = "xid_events"  # key in Reading.missing
_MAX_EVENTS_PER_DRAIN = 256
_NOT_READ = Absent("not_read")

# Reason names of docs/metrics.md and the pynvml constant of each one's bit.
_CLOCK_EVENT_REASONS = (
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


def open_nvml_backends(energy_interval: float = DEFAULT_ENERGY_INTERVAL) -> tuple[NvmlBackend, GpmBackend]:
    """The nvml device source and the gpm profiling backend, sharing one NVML session."""
    session = NvmlSession()
    return NvmlBackend(session, energy_interval), GpmBackend(session)


@dataclass
class _Device:
    handle: Any
    label: str
    max_sm_clock: float | Absent
    clock_event_bits: tuple[tuple[str, int], ...] | Absent  # the reasons this GPU reports
    xid_watch: Absent | None  # why XIDs are not watched, None when they are
    samples_supported: bool = True
    last_sample_us: int | None = None  # newest utilization sample seen
    last_read: float | None = None  # `now` of the last utilization-rate read (fallback only)
    energy: float | Absent = _NOT_READ
    next_energy_at: float = -math.inf


class _Parts:
    """The values of one Reading, with every Absent routed into ``missing``."""

    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}
        self.totals: dict[str, float] = {}
        self.missing: dict[str, str] = {}

    def put(self, into: dict[str, float], key: str, value: float | Absent) -> None:
        if isinstance(value, Absent):
            self.missing[key] = value.reason
        else:
            into[key] = value


def _scaled(value: Any, factor: float) -> float | Absent:
    return value if isinstance(value, Absent) else float(value) * factor


def _member(value: Any, name: str) -> float | Absent:
    return value if isinstance(value, Absent) else float(getattr(value, name))


class NvmlBackend(DeviceSource):
    """The NVML device source. ``energy_interval``: seconds between two reads of the energy counter."""

    name = "nvml"

    def __init__(self, session: NvmlSession, energy_interval: float = DEFAULT_ENERGY_INTERVAL) -> None:
        if not math.isfinite(energy_interval) or energy_interval < 0:
            raise ConfigError(f"energy interval must be a number of seconds >= 0, got {energy_interval!r}.")
        self._session = session
        self._energy_interval = energy_interval
        self._devices: dict[str, _Device] = {}
        self._uuid_at: dict[int, str] = {}  # handle address -> uuid, to route XID events
        self._event_set: Any = None  # an nvmlEventSet_t, Absent when NVML gave none, None before attach
        self._xid_lock = threading.Lock()
        self._read_this_round: set[str] = set()
        self._pending_xids: dict[str, Counter[int]] = {}

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
        attributes = call(nv.nvmlDeviceGetAttributes, handle, gpu=where)
        capability = call(nv.nvmlDeviceGetCudaComputeCapability, handle, gpu=where)
        sm_count = None if isinstance(attributes, Absent) else int(attributes.multiprocessorCount)
        self._session.remember(text(uuid), handle)
        return GpuIdentity(
            index=index,
            uuid=text(uuid),
            name=string(nv.nvmlDeviceGetName),
            pci_bus_id="" if isinstance(pci, Absent) else text(pci.busId),
            driver_version=driver_version,
            serial=string(nv.nvmlDeviceGetSerial),
            sm_count=sm_count or None,  # 0 means NVML did not fill it in
            compute_capability="" if isinstance(capability, Absent) else "{}.{}".format(*capability),
        )

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        self._session.acquire(self)
        nv = nvml_module()
        if self._event_set is None:
            self._event_set = call(nv.nvmlEventSetCreate)
        verdicts: dict[str, str | None] = {}
        for gpu in gpus:
            try:
                verdicts[gpu.uuid] = self._attach_one(nv, gpu)
            except GpuLostError as exc:
                verdicts[gpu.uuid] = str(exc)
        return verdicts

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
                for reason, bit in _CLOCK_EVENT_REASONS
                if supported & getattr(nv, bit)
            ),
            xid_watch=self._watch_xids(nv, handle, label),
        )
        self._prime_samples(device)
        self._devices[gpu.uuid] = device
        self._uuid_at[address(handle)] = gpu.uuid
        return None

    def _watch_xids(self, nv: Any, handle: Any, label: str) -> Absent | None:
        if isinstance(self._event_set, Absent):
            return self._event_set
        types = call(nv.nvmlDeviceGetSupportedEventTypes, handle, gpu=label)
        if isinstance(types, Absent):
            return types
        if not types & nv.nvmlEventTypeXidCriticalError:
            return Absent("not_supported")
        done = call(nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
        return done if isinstance(done, Absent) else None

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        device = self._devices.get(gpu.uuid)
        if device is None:
            raise BackendError(f"the nvml backend is not attached to {describe(gpu)}.", reason="not_attached")
        nv = nvml_module()

        def get(fn: Any, *args: Any) -> Any:
            return call(fn, device.handle, *args, gpu=device.label)

        parts = _Parts()
        gauges, totals = parts.gauges, parts.totals
        utilization = self._utilization(device, now)
        memory = get(nv.nvmlDeviceGetMemoryInfo)
        parts.put(gauges, MEMORY_USED_BYTES, _member(memory, "used"))
        parts.put(gauges, MEMORY_TOTAL_BYTES, _member(memory, "total"))
        parts.put(gauges, POWER_WATTS, _scaled(get(nv.nvmlDeviceGetPowerUsage), 1e-3))
        parts.put(gauges, POWER_LIMIT_WATTS, _scaled(get(nv.nvmlDeviceGetEnforcedPowerLimit), 1e-3))
        parts.put(
            gauges, TEMPERATURE_CELSIUS, _scaled(get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU), 1)
        )
        parts.put(gauges, MEMORY_TEMPERATURE_CELSIUS, self._memory_temperature(device))
        parts.put(gauges, SM_CLOCK_HERTZ, _scaled(get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM), 1e6))
        parts.put(gauges, MEMORY_CLOCK_HERTZ, _scaled(get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM), 1e6))
        parts.put(gauges, SM_CLOCK_MAX_HERTZ, device.max_sm_clock)
        if now >= device.next_energy_at:
            device.energy = _scaled(get(nv.nvmlDeviceGetTotalEnergyConsumption), 1e-3)
            device.next_energy_at = now + self._energy_interval
        parts.put(totals, ENERGY_JOULES, device.energy)  # between reads, the last value read
        for key, kind in ((ECC_CORRECTED, "CORRECTED"), (ECC_UNCORRECTED, "UNCORRECTED")):
            error_type = getattr(nv, f"NVML_MEMORY_ERROR_TYPE_{kind}")
            parts.put(
                totals, key, _scaled(get(nv.nvmlDeviceGetTotalEccErrors, error_type, nv.NVML_VOLATILE_ECC), 1)
            )
        parts.put(totals, PCIE_REPLAYS, _scaled(get(nv.nvmlDeviceGetPcieReplayCounter), 1))
        clock_events = self._clock_events(device)
        if isinstance(clock_events, Absent):
            parts.missing[CLOCK_EVENTS] = clock_events.reason
            clock_events = {}
        if isinstance(utilization, Absent):
            parts.missing[UTILIZATION] = utilization.reason
        if device.xid_watch is not None:
            parts.missing[XID_EVENTS] = device.xid_watch.reason
        return Reading(
            source=self.name,
            gauges=gauges,
            activity={} if isinstance(utilization, Absent) else {UTILIZATION: utilization},
            totals=totals,
            clock_events=clock_events,
            xid_events=self._xids_for(gpu.uuid),
            missing=parts.missing,
        )

    def _utilization(self, device: _Device, now: float) -> Activity | Absent:
        """Time-weighted NVML utilization since the last call, from the driver's own samples."""
        nv = nvml_module()
        if device.samples_supported:
            since = device.last_sample_us or 0
            got = call(
                nv.nvmlDeviceGetSamples,
                device.handle,
                nv.NVML_GPU_UTILIZATION_SAMPLES,
                since,
                gpu=device.label,
            )
            if not isinstance(got, Absent):
                return self._integrate(device, *got)
            if got.reason == "not_found":  # no sample newer than the last one seen
                return ZERO_ACTIVITY
            if got.reason != "not_supported":
                return got
            device.samples_supported = False
        rates = call(nv.nvmlDeviceGetUtilizationRates, device.handle, gpu=device.label)
        previous, device.last_read = device.last_read, now
        if isinstance(rates, Absent):
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
        """Each sample's percentage holds from the previous sample's timestamp to its own."""
        active = covered = 0.0
        previous = device.last_sample_us
        for sample in sorted(samples, key=lambda s: int(s.timeStamp)):  # NVML gives only newer ones
            stamp = int(sample.timeStamp)
            if previous is not None:
                percent = value_of(sample.sampleValue, value_type)
                if isinstance(percent, Absent):
                    return percent
                seconds = (stamp - previous) / 1e6
                active += percent / 100 * seconds
                covered += seconds
            previous = stamp
        device.last_sample_us = previous
        return Activity(active, covered)

    def _memory_temperature(self, device: _Device) -> float | Absent:
        nv = nvml_module()
        fields = call(
            nv.nvmlDeviceGetFieldValues, device.handle, [nv.NVML_FI_DEV_MEMORY_TEMP], gpu=device.label
        )
        if isinstance(fields, Absent):
            return fields
        field = fields[0]
        if field.nvmlReturn != nv.NVML_SUCCESS:
            return failure(field.nvmlReturn, device.label)
        return value_of(field.value, field.valueType)

    def _clock_events(self, device: _Device) -> dict[str, bool] | Absent:
        if isinstance(device.clock_event_bits, Absent):
            return device.clock_event_bits
        nv = nvml_module()
        current = call(nv.nvmlDeviceGetCurrentClocksEventReasons, device.handle, gpu=device.label)
        if isinstance(current, Absent):
            return current
        return {reason: bool(current & bit) for reason, bit in device.clock_event_bits}

    def _xids_for(self, uuid: str) -> dict[int, int]:
        """XIDs seen for this GPU since its last read. The event set is drained once per round of reads."""
        with self._xid_lock:
            if not self._read_this_round or uuid in self._read_this_round:
                self._drain_events()
                self._read_this_round.clear()
            self._read_this_round.add(uuid)
            counts = self._pending_xids.pop(uuid, None)
        return dict(counts) if counts else {}

    def _drain_events(self) -> None:
        if self._event_set is None or isinstance(self._event_set, Absent):
            return
        nv = nvml_module()
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                event = call(nv.nvmlEventSetWait_v2, self._event_set, 0)
            except GpuLostError:
                return  # the lost GPU itself raises on its own read
            if isinstance(event, Absent):  # "timeout": nothing queued
                return
            uuid = self._uuid_at.get(address(event.device))
            if uuid is not None and event.eventType & nv.nvmlEventTypeXidCriticalError:
                self._pending_xids.setdefault(uuid, Counter())[int(event.eventData)] += 1

    def close(self) -> None:
        if self._event_set is not None and not isinstance(self._event_set, Absent):
            call(nvml_module().nvmlEventSetFree, self._event_set)
        self._event_set = None
        self._devices.clear()
        self._uuid_at.clear()
        self._session.release(self)
