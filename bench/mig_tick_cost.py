"""Benchmark: smlens' per-tick sampling cost against the bare NVML/GPM calls, for one H200 whole and
split into 7 MIG instances, with each call given the latency measured on an H200.

No GPU is needed: the NVML calls go to the fake pynvml of the tests (tests/fakes/fake_pynvml.py), and every
call is made to take at least its H200 latency (a busy wait from the call's start, so the fake's own Python
cost hides inside the latency, as the driver's does). Latencies and ticks are counted in the thread's CPU
time, so that a shared, busy machine preempting the benchmark does not change the figures. ``smlens`` is
smlens' sampler: the nvml and gpm backends' calls every tick, and their decoding, the per-instance fold and
the snapshots of ``--publish-every`` ticks at a time, as a scrape every that many intervals publishes them
(default 15: the chart's 15 s scrape at its 1 s interval), here on the same thread right after a capture where
serve publishes on a handler thread; ``bare`` is a loop making the same calls with handles, samples and
requests prepared in advance, as a hand-written poller would. Every side reads the MIG mode on every 10th
tick, as smlens does every 10 s at a 1 s interval. The two alternate tick by tick; the figure is the ratio of
their means, decoding included (target <= 1.25x).

    python3 bench/mig_tick_cost.py [--ticks 300] [--instances 7] [--latencies h200|reference]
    python3 bench/mig_tick_cost.py --real [--ticks 120] [--pause 0.5] [--batch 30] [--sides smlens,bare]
    (both take --publish-every N, default 15)

``--real`` times the same two sides on the host's GPU through real NVML, in wall-clock time, each tick after
its own ``--pause`` so that both pay the wake-up a sampler pays (smlens' samplers on a clock that moves 1 s
a tick), and more beside them: ``Sampler.tick()`` (capture and decode every tick), ``Minimal``, the bare
calls plus the least a Python sampler does with their values (a floor, not a design), ``Compact``, a
prototype that publishes smlens' own state for the GPU from one method (a measurement, not smlens' code),
and ``Deferred``, the same prototype decoding ``--batch`` ticks at a time. The slow reads (utilization
samples every 5 s, energy and PCIe replays every 15 s) are the same calls on every side and are left out of
all, as are MIG instances (a GPU in MIG mode is not measured this way).

Without ``--real`` it also prints how many functions of smlens a capture and a tick run
(``sys.setprofile``) and the keys in which the prototypes' states differ from smlens' own on the fake.

Per-call latencies (µs), ``reference``: the bare-metal H200 of ../shared/reference/h200-gpm-probe.md
(driver 580): memory info 4.8, power 5.5, temperature 2.2, clocks 2.2, clock-event reasons 2.0, volatile
ECC 7.2, utilization 10.4, nvmlGpmSampleGet 43.2, nvmlGpmMetricsGet 7.5 + 1.65 per metric (fits 10.8 µs
for 2 metrics and 14.1 µs for 4), field values with MEMORY_TEMP 32. ``h200`` (default): the project's H200,
where bench/nvml_call_cost.py measured 243 µs for the nvml backend's every-tick calls and 244 µs for the
GPM sample and metrics of one tick (docs/validation.md): the reference latencies scaled by group so that
they add up to those two totals. Not measured on either host, so assumed: nvmlGpmMigSampleGet costs what
nvmlGpmSampleGet does, every MIG enumeration call (mode, handles, ids, UUID, name, attributes) what a
clock read does, the enforced power limit what power does. The slow counters (energy, PCIe replays) are
read every 10^9 s here, in neither loop: they are the same calls on both sides and would only dilute the
ratio; XID events are off for the same reason.
"""

from __future__ import annotations

import argparse
import functools
import math
import operator
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "exporter"), str(REPO / "tests")]

import pynvml  # noqa: E402

from fakes.fake_pynvml import FakeGpu, FakeGpuInstance, FakeMigDevice, FakeNode  # noqa: E402
from smlens.model import Activity, BackendStats, GpuIdentity, GpuState, Snapshot  # noqa: E402
from smlens.names import (  # noqa: E402
    ENERGY_JOULES,
    MEMORY_TEMPERATURE_CELSIUS,
    PCIE_REPLAYS,
    SM_ACTIVE,
    SM_CLOCK_MAX_HERTZ,
    xid_label,
)
from smlens.pipeline.sampler import Sampler  # noqa: E402
from smlens.sources.nvml.backend import (  # noqa: E402
    CLOCK_EVENT_REASONS,
    CLOCK_EVENTS,
    bind_tick_reads,
    decode_plain,
    open_nvml_backends,
)
from smlens.sources.nvml.calls import Absent, failure, value_of  # noqa: E402
from smlens.sources.nvml.gpm import (  # noqa: E402
    INSTANCE_METRICS,
    METRICS,
    MIB,
    RATIO_METRICS,
    metrics_request,
    results_layout,
)

REFERENCE_US = {
    "nvmlDeviceGetMemoryInfo": 4.8,
    "nvmlDeviceGetPowerUsage": 5.5,
    "nvmlDeviceGetEnforcedPowerLimit": 5.5,
    "nvmlDeviceGetTemperature": 2.2,
    "nvmlDeviceGetClockInfo": 2.2,
    "nvmlDeviceGetCurrentClocksEventReasons": 2.0,
    "nvmlDeviceGetTotalEccErrors": 7.2,
    "nvmlDeviceGetUtilizationRates": 10.4,
    "nvmlDeviceGetFieldValues": 32.0,
    "nvmlGpmSampleGet": 43.2,
    "nvmlGpmMigSampleGet": 43.2,
}
ENUMERATION = "nvmlDeviceGetClockInfo"  # what every other call costs: MIG mode, handles, ids, names
GPU = "GPU-11111111-1111-2222-3333-444444444444"
# bench/nvml_call_cost.py on the project's H200 (docs/validation.md): every-tick calls of one GPU.
H200_NVML_TICK_US, H200_GPM_TICK_US = 243.0, 244.0
_NVML_TICK = (  # the calls behind H200_NVML_TICK_US, with the event drain costed like a clock read
    *("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"),
    *("nvmlDeviceGetTemperature", "nvmlDeviceGetFieldValues", "nvmlDeviceGetClockInfo"),
    *("nvmlDeviceGetClockInfo", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTotalEccErrors"),
    *("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetClockInfo"),
)
_GPM = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet")


def metrics_get_us(metrics: int) -> float:
    return 7.5 + 1.65 * metrics


def latencies(profile: str) -> tuple[dict[str, float], float, float]:
    """Per-call µs, and the factors applied to the reference's NVML and GPM calls."""
    if profile == "reference":
        return dict(REFERENCE_US), 1.0, 1.0
    nvml = H200_NVML_TICK_US / sum(REFERENCE_US[name] for name in _NVML_TICK)
    gpm = H200_GPM_TICK_US / (REFERENCE_US["nvmlGpmSampleGet"] + metrics_get_us(len(METRICS)))
    return {name: us * (gpm if name in _GPM else nvml) for name, us in REFERENCE_US.items()}, nvml, gpm


def with_latency(node: FakeNode, table: dict[str, float], gpm_factor: float) -> None:
    """Make every scripted call of the node's module take at least its latency in ``table``."""
    module = node.module
    for name in dir(module):
        fn = getattr(module, name)
        if not name.startswith("nvml") or not callable(fn) or isinstance(fn, type):
            continue

        def timed(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name) -> Any:
            started = time.thread_time()
            if _name == "nvmlGpmMetricsGet":
                cost = metrics_get_us(int(args[0].numMetrics)) * gpm_factor
            else:
                cost = table.get(_name, table[ENUMERATION])
            try:
                return _fn(*args)
            finally:
                until = started + cost / 1e6
                while time.thread_time() < until:
                    pass

        setattr(module, name, timed)


def fake_node(instances: int, table: dict[str, float], gpm_factor: float) -> FakeNode:
    gpm = {pynvml.NVML_GPM_METRIC_SM_UTIL: 50.0, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 10.0}
    split = [
        FakeGpuInstance(gi, [FakeMigDevice(f"MIG-{gi:08x}")], gpm_rates=dict(gpm))
        for gi in range(7, 7 + instances)
    ]
    node = FakeNode(
        [
            FakeGpu(
                GPU,
                event_types=0,  # no XID watch: its drain is the same call on both sides
                mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE if instances else pynvml.NVML_DEVICE_MIG_DISABLE,
                utilization_samples=None if instances else [],
                gpm_rates=dict(gpm),
                gpu_instances=split,
            )
        ]
    )
    node.privileged = True  # as a privileged DaemonSet: the GPU's aggregate memory is readable in MIG mode
    sys.modules["pynvml"] = node.module
    with_latency(node, table, gpm_factor)
    return node


class Bare:
    """The calls smlens' two backends need every tick, made directly, with everything prepared once.

    ``real``: on a GPU host, where NVML gives utilization samples (read every 5 s by smlens, and left out of
    both sides here) instead of per-tick rates, and smlens drains its XID event set once per tick: a set
    with the GPU registered for XID events, empty on a healthy node."""

    def __init__(self, nv: Any, instances: int, real: bool = False) -> None:
        self.nv, self.real = nv, real
        nv.nvmlInit()
        self.handle = nv.nvmlDeviceGetHandleByIndex(0)
        self.mig = instances > 0
        self.mig_handles = [nv.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, i) for i in range(instances)]
        self.gpu_instances = [nv.nvmlDeviceGetGpuInstanceId(h) for h in self.mig_handles]
        self.whole = self._pair(METRICS)
        self.parts = [self._pair(INSTANCE_METRICS) for _ in self.mig_handles]
        self.newest = 0
        self.ticks = 0
        # The GPU registered for XIDs, as smlens' nvml backend registers it; where it cannot be (the fake's
        # GPU here has no XID events), smlens drains nothing, and neither do these sides.
        self.events = nv.nvmlEventSetCreate() if real else None
        try:
            if self.events is not None:
                nv.nvmlDeviceRegisterEvents(self.handle, nv.nvmlEventTypeXidCriticalError, self.events)
        except nv.NVMLError:
            nv.nvmlEventSetFree(self.events)
            self.events = None
        nv.nvmlGpmSampleGet(self.handle, self.whole[0][0])  # the chains start, as smlens' first tick does
        for gi, (samples, _) in zip(self.gpu_instances, self.parts, strict=True):
            nv.nvmlGpmMigSampleGet(self.handle, gi, samples[0])

    def _pair(self, metrics: Any) -> tuple[list[Any], Any]:
        return [self.nv.nvmlGpmSampleAlloc(), self.nv.nvmlGpmSampleAlloc()], metrics_request(self.nv, metrics)

    def mig_mode(self) -> None:
        """The MIG mode read smlens makes every MIG_RESCAN_INTERVAL (10 s): every 10th tick at 1 s."""
        self.ticks += 1
        if self.ticks % 10 == 0:
            self.nv.nvmlDeviceGetMigMode(self.handle)

    def tick(self) -> None:
        nv, handle = self.nv, self.handle
        self.mig_mode()
        nv.nvmlDeviceGetMemoryInfo(handle)
        nv.nvmlDeviceGetPowerUsage(handle)
        nv.nvmlDeviceGetEnforcedPowerLimit(handle)
        nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
        nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])
        nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)
        nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
        if self.events is not None:
            try:  # noqa: SIM105 - contextlib.suppress would add its own cost to what is timed
                nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError_Timeout:
                pass
        elif not self.real and not self.mig:  # in MIG mode NVML has no utilization; smlens stops asking
            nv.nvmlDeviceGetUtilizationRates(handle)
        slot, self.newest = 1 - self.newest, 1 - self.newest
        self._step(self.whole, slot, lambda s: nv.nvmlGpmSampleGet(handle, s))
        for mig, gi, pair in zip(self.mig_handles, self.gpu_instances, self.parts, strict=True):
            self._step(pair, slot, lambda s, gi=gi: nv.nvmlGpmMigSampleGet(handle, gi, s))
            nv.nvmlDeviceGetMemoryInfo(mig)

    def _step(self, pair: tuple[list[Any], Any], slot: int, take: Callable[[Any], Any]) -> None:
        samples, request = pair
        take(samples[slot])
        request.sample1, request.sample2 = samples[1 - slot], samples[slot]
        self.nv.nvmlGpmMetricsGet(request)


class Minimal(Bare):
    """The bare calls of a whole GPU and the least a Python sampler does with what they return: every value
    in base units into a fresh dict, the GPM metrics decoded in one unpack (those with an error code or a
    NaN left out), each ratio integrated into active and covered seconds, the dict published. No error
    handling per call, no clock-event decoding, no backend health, no per-GPU objects, fold or snapshot:
    a floor for any Python sampler, not a design."""

    def __init__(self, nv: Any) -> None:
        super().__init__(nv, 0, real=True)
        request = self.whole[1]
        self.unpack = functools.partial(results_layout(request, len(METRICS)).unpack_from, request)
        self.ratio = tuple(i < len(RATIO_METRICS) for i in range(len(METRICS)))
        self.totals = {key: [0.0, 0.0] for key, _ in RATIO_METRICS}
        self.taken_at = time.monotonic()
        self.published: dict[str, float] = {}

    def tick(self) -> None:
        nv, handle, values = self.nv, self.handle, {}
        self.mig_mode()
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        values["memory_used_bytes"], values["memory_total_bytes"] = float(memory.used), float(memory.total)
        values["power_watts"] = nv.nvmlDeviceGetPowerUsage(handle) * 1e-3
        values["power_limit_watts"] = nv.nvmlDeviceGetEnforcedPowerLimit(handle) * 1e-3
        values["temperature_celsius"] = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
        field = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])[0]
        if field.nvmlReturn == nv.NVML_SUCCESS:
            values["memory_temperature_celsius"] = float(field.value.uiVal)
        values["sm_clock_hertz"] = nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM) * 1e6
        values["memory_clock_hertz"] = nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM) * 1e6
        values["ecc_corrected"] = float(
            nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        )
        values["ecc_uncorrected"] = float(
            nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
        )
        values["clock_events"] = float(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        if self.events is not None:
            try:  # noqa: SIM105 - as in Bare
                nv.nvmlEventSetWait_v2(self.events, 0)
            except nv.NVMLError_Timeout:
                pass
        slot, self.newest = 1 - self.newest, 1 - self.newest
        self._step(self.whole, slot, lambda s: nv.nvmlGpmSampleGet(handle, s))
        now = time.monotonic()
        seconds, self.taken_at = now - self.taken_at, now
        flat, success = self.unpack(), nv.NVML_SUCCESS
        for (key, _), is_ratio, returned, value in zip(
            METRICS, self.ratio, flat[::2], flat[1::2], strict=True
        ):
            if returned != success or value != value:
                continue
            if is_ratio:
                total = self.totals[key]
                total[0] += min(max(value / 100, 0.0), 1.0) * seconds
                total[1] += seconds
                values[key] = value / 100
            else:
                values[key] = value * (1 << 20)
        self.published = values


class Compact(Bare):
    """A prototype of the compact per-tick path that docs/performance.md says would close the per-tick
    target, for a whole GPU: what smlens' tick publishes for it (a ``GpuState`` and a ``Snapshot``,
    smlens' own types, with the values of its nvml and gpm backends, each NVML error turned into its reason
    by ``failure``, the clock-event reasons decoded, the XID events drained, the GPM ratios integrated, the
    tick's wall and CPU time kept), made by one method instead of two backends' readings and the generic
    fold. Left out: other backends, MIG, the utilization samples and slow counters (read every 5 and 15 s
    and left out of every side here), backend health bookkeeping, XIDs of registered devices (it drains
    Bare's empty event set), the fold's carried totals and last ratios, and the profiling choice: a lower
    bound for that design. A measurement, not smlens' code."""

    def __init__(self, nv: Any, identity: GpuIdentity) -> None:
        super().__init__(nv, 0, real=True)
        self.identity, handle = identity, self.handle
        self.reads = bind_tick_reads(nv, handle)
        supported = nv.nvmlDeviceGetSupportedClocksEventReasons(handle)
        self.reasons = tuple(
            (reason, getattr(nv, bit)) for reason, bit in CLOCK_EVENT_REASONS if supported & getattr(nv, bit)
        )
        request = self.whole[1]
        self.unpack = functools.partial(results_layout(request, len(METRICS)).unpack_from, request)
        self.metrics = tuple((key, i < len(RATIO_METRICS)) for i, (key, _) in enumerate(METRICS))
        # Read at attach and at the slow cadence in smlens, and carried into every tick's state in between.
        self.max_sm_clock = nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM) * 1e6
        self.counters = {
            ENERGY_JOULES: nv.nvmlDeviceGetTotalEnergyConsumption(handle) * 1e-3,
            PCIE_REPLAYS: float(nv.nvmlDeviceGetPcieReplayCounter(handle)),
        }
        self.activity: dict[str, tuple[float, float]] = {}
        self.increments: dict[str, float] = {}
        self.xids: Mapping[str, int] = MappingProxyType({})
        self.errors: Mapping[str, int] = MappingProxyType({})
        self.taken_at = time.monotonic()
        self.sequence, self.cpu = 0, 0.0
        self.published: Snapshot | None = None

    def tick(self) -> None:
        self.build(self.capture())

    def capture(self) -> tuple[Any, ...]:
        """The tick's NVML and GPM calls with the tick's clocks: each result, or the Absent of its error."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        nv, handle = self.nv, self.handle
        self.mig_mode()
        error = nv.NVMLError
        results: list[Any] = []
        try:
            results.append(nv.nvmlDeviceGetMemoryInfo(handle))
        except error as exc:
            results.append(failure(exc.value, "GPU 0"))
        for _, name, args, _, _ in self.reads:
            try:
                results.append(getattr(nv, name)(*args))
            except error as exc:
                results.append(failure(exc.value, "GPU 0"))
        try:
            results.append(nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP])[0])
        except error as exc:
            results.append(failure(exc.value, "GPU 0"))
        try:
            results.append(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except error as exc:
            results.append(failure(exc.value, "GPU 0"))
        events = []
        for _ in range(256 if self.events is not None else 0):
            try:
                events.append(int(nv.nvmlEventSetWait_v2(self.events, 0).eventData))
            except error:
                break
        slot = 1 - self.newest
        samples, request = self.whole
        try:
            nv.nvmlGpmSampleGet(handle, samples[slot])
            request.sample1, request.sample2 = samples[self.newest], samples[slot]
            nv.nvmlGpmMetricsGet(request)
        except error as exc:
            gpm: Any = failure(exc.value, "GPU 0")
        else:
            self.newest = slot
            gpm = self.unpack()
        return results, events, gpm, time.monotonic(), started, cpu_started

    def build(self, captured: tuple[Any, ...]) -> None:
        """What smlens would publish for the captured tick."""
        results, events, gpm, now, started, cpu_started = captured
        nv, label = self.nv, "GPU 0"
        success = nv.NVML_SUCCESS
        gauges: dict[str, float] = {SM_CLOCK_MAX_HERTZ: self.max_sm_clock}
        totals: dict[str, float] = dict(self.counters)
        missing: dict[str, str] = {}
        decode_plain(results, self.reads, gauges, totals, missing)
        field, current = results[-2], results[-1]
        if isinstance(field, Absent):
            missing[MEMORY_TEMPERATURE_CELSIUS] = field.reason
        else:
            temperature = (
                value_of(field.value, field.valueType)
                if field.nvmlReturn == success
                else failure(field.nvmlReturn, label)
            )
            if isinstance(temperature, Absent):
                missing[MEMORY_TEMPERATURE_CELSIUS] = temperature.reason
            else:
                gauges[MEMORY_TEMPERATURE_CELSIUS] = temperature
        if isinstance(current, Absent):
            missing[CLOCK_EVENTS] = current.reason
            clock_events: dict[str, bool] = {}
        else:
            clock_events = {reason: bool(current & bit) for reason, bit in self.reasons}
        if events:
            counts = dict(self.xids)
            for data in events:
                xid = xid_label(data)
                counts[xid] = counts.get(xid, 0) + 1
            self.xids = MappingProxyType(counts)
        if isinstance(gpm, Absent):
            missing[SM_ACTIVE] = gpm.reason
        else:
            seconds, self.taken_at = now - self.taken_at, now
            for (key, is_ratio), returned, value in zip(self.metrics, gpm[::2], gpm[1::2], strict=True):
                if returned != success:
                    missing[key] = failure(returned, label).reason
                elif not math.isfinite(value):
                    missing[key] = "not_a_number"
                elif is_ratio:
                    ratio = min(max(value / 100, 0.0), 1.0)
                    active, covered = self.activity.get(key, (0.0, 0.0))
                    self.activity[key] = (active + ratio * seconds, covered + seconds)
                    gauges[key] = ratio
                else:
                    self.increments[key] = self.increments.get(key, 0.0) + max(value, 0.0) * MIB * seconds
        totals.update(self.increments)
        spent = time.perf_counter() - started
        state = GpuState(
            identity=self.identity,
            up=True,
            gauges=MappingProxyType(gauges),
            activity_totals=MappingProxyType({k: Activity(a, c) for k, (a, c) in self.activity.items()}),
            totals=MappingProxyType(totals),
            clock_events=MappingProxyType(clock_events),
            xid_totals=self.xids,
            missing=MappingProxyType(missing),
            profiling_source="gpm",
            profiling_available=SM_ACTIVE not in missing,
            profiling_reason=missing.get(SM_ACTIVE, ""),
            sources=("nvml", "gpm"),
        )
        self.sequence += 1
        self.cpu += time.thread_time() - cpu_started
        self.published = Snapshot(
            hostname="bench",
            sequence=self.sequence,
            taken_at=time.time(),
            interval_seconds=1.0,
            tick_duration_seconds=spent,
            sampler_cpu_seconds_total=self.cpu,
            gpus=(state,),
            backends=(
                BackendStats("nvml", True, spent, spent, self.sequence, self.errors),
                BackendStats("gpm", True, spent, spent, self.sequence, self.errors),
            ),
        )


class Deferred(Compact):
    """The compact prototype split in two: each tick only makes the calls and keeps what they return
    (``capture``); every ``batch`` ticks the kept ticks are built into states in one go (``build``), while
    the code is warm. A prototype of deferring a tick's decoding (published states lag by up to ``batch``
    ticks unless a reader asks for them); its cost is the mean over ticks, the batch included."""

    def __init__(self, nv: Any, identity: GpuIdentity, batch: int) -> None:
        super().__init__(nv, identity)
        self.batch = batch
        self.pending: list[tuple[Any, ...]] = []

    def tick(self) -> None:
        self.pending.append(self.capture())
        if len(self.pending) >= self.batch:
            for captured in self.pending:
                self.build(captured)
            self.pending.clear()


def virtual_clock(now: list[float]) -> Callable[[], float]:
    """A clock reading ``now[0]``, called in C as smlens' own clock (time.monotonic) is: a lambda would add
    a Python call to each of the sampler's clock reads, which smlens does not make."""
    return functools.partial(operator.getitem, now, 0)


def scraped(sampler: Sampler, every: int) -> Callable[[], None]:
    """A capture every tick and a publish every ``every``-th, as when a scrape every ``every`` intervals
    publishes what the sampler captured (the probes publish nothing)."""
    count = [0]

    def tick() -> None:
        sampler.capture()
        count[0] += 1
        if count[0] % every == 0:
            sampler.publish()

    return tick


def functions_run(tick: Callable[[], Any]) -> set[tuple[str, str]]:
    """The (module, function) pairs of smlens that one call of ``tick`` runs, generated ones left out."""
    seen: set[tuple[str, str]] = set()

    def note(frame: Any, event: str, _: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and "/smlens/" in path:
            seen.add((path.rsplit("/smlens/", 1)[1], frame.f_code.co_name))

    sys.setprofile(note)
    try:
        tick()
    finally:
        sys.setprofile(None)
    return seen


def compare_compact(node: FakeNode, sampler: Sampler) -> None:
    """Does the Compact prototype publish the keys smlens' own state has for the same whole GPU?"""
    prototypes = {
        "Compact": Compact(node.module, sampler.gpus[0]),
        "Deferred": Deferred(node.module, sampler.gpus[0], 2),
    }
    for _ in range(2):
        node.advance(1.0)
        for prototype in prototypes.values():
            prototype.tick()
    for name, prototype in prototypes.items():
        assert prototype.published is not None and sampler.latest is not None
        ours, theirs = prototype.published.gpus[0], sampler.latest.gpus[0]
        differ = {
            part: sorted(set(getattr(theirs, part)) ^ set(getattr(ours, part)))
            for part in ("gauges", "totals", "activity_totals", "clock_events", "missing")
        }
        differ = {part: keys for part, keys in differ.items() if keys}
        print(f"  {name} prototype against smlens' state, keys that differ: {differ or 'none'}")


def run(
    instances: int, ticks: int, table: dict[str, float], gpm_factor: float, every: int
) -> tuple[float, float]:
    """Mean CPU µs per tick for smlens (the publishing of every ``every``-th tick included, as a scrape
    publishes) and for the bare calls."""
    node = fake_node(instances, table, gpm_factor)
    now = [0.0]
    nvml, gpm = open_nvml_backends(energy_interval=1e9, utilization_interval=5.0)
    sampler = Sampler(nvml, [gpm], hostname="bench", interval=1.0, clock=virtual_clock(now))
    sampler.open()
    bare = Bare(node.module, instances)
    node.advance(1.0)
    now[0] += 1.0
    sampler.tick()  # primes the GPM chains, the MIG layout and the utilization probe
    smlens_us: list[float] = []
    bare_us: list[float] = []
    tick = scraped(sampler, every)
    for _ in range(ticks):
        node.advance(1.0)
        now[0] += 1.0
        started = time.thread_time()
        tick()
        smlens_us.append((time.thread_time() - started) * 1e6)
        started = time.thread_time()
        bare.tick()
        bare_us.append((time.thread_time() - started) * 1e6)
    latest = sampler.publish()
    assert latest is not None and len(latest.gpus[0].instances) == instances, "the instances were not read"
    node.advance(1.0)
    now[0] += 1.0
    print(f"  functions of smlens a capture runs: {len(functions_run(sampler.capture))}")
    node.advance(1.0)
    now[0] += 1.0
    print(f"  functions of smlens a tick runs, capture and publish: {len(functions_run(sampler.tick))}")
    if not instances:
        compare_compact(node, sampler)
    sampler.close()
    return statistics.fmean(smlens_us), statistics.fmean(bare_us)


REAL_SIDES = ("smlens", "tick", "bare", "minimal", "compact", "deferred")


def run_real(
    ticks: int, pause: float, batch: int, every: int, sides: Sequence[str] = REAL_SIDES
) -> dict[str, list[float]]:
    """Wall-clock µs per tick on this host's GPU 0, whole, by side (``sides``, of REAL_SIDES): smlens (a
    capture every tick, a publish every ``every``-th), smlens' ``Sampler.tick()`` (capture and publish
    every tick), the bare calls, the minimal sampler and the two prototypes, each after its own pause (all
    pay the wake-up a sampler pays), each first in turn."""
    samplers, clocks = [], []
    for _ in range(2):  # each with its own backends and GPM samples
        nvml, gpm = open_nvml_backends(energy_interval=1e9, utilization_interval=1e9)
        # A clock that moves 1 s a tick: smlens checks the MIG mode every 10 s of it, as at a 1 s interval
        clock = [0.0]
        sampler = Sampler(nvml, [gpm], hostname="bench", interval=1.0, clock=virtual_clock(clock))
        sampler.open(nvml.discover()[:1])  # GPU 0, as the bare side
        samplers.append(sampler)
        clocks.append(clock)
    threaded, eager = samplers
    making: dict[str, tuple[str, Callable[[], Callable[[], Any]]]] = {
        "smlens": ("smlens", lambda: scraped(threaded, every)),
        "tick": ("smlens tick()", lambda: eager.tick),
        "bare": ("bare calls", lambda: Bare(pynvml, 0, real=True).tick),
        "minimal": ("minimal sampler", lambda: Minimal(pynvml).tick),
        "compact": ("compact prototype", lambda: Compact(pynvml, threaded.gpus[0]).tick),
        "deferred": (f"deferred x{batch}", lambda: Deferred(pynvml, threaded.gpus[0], batch).tick),
    }
    ticking = {making[key][0]: making[key][1]() for key in REAL_SIDES if key in sides}
    clock_of = {"smlens": clocks[0], "smlens tick()": clocks[1]}
    spent: dict[str, list[float]] = {side: [] for side in ticking}
    order = list(ticking)
    try:
        for tick in ticking.values():  # primes the GPM chains and the one utilization read
            time.sleep(pause)
            tick()
        for i in range(ticks):
            for side in order[i % len(order) :] + order[: i % len(order)]:  # each side first in turn
                time.sleep(pause)
                if side in clock_of:
                    clock_of[side][0] += 1.0
                started = time.perf_counter()
                ticking[side]()
                spent[side].append((time.perf_counter() - started) * 1e6)
    finally:
        for sampler in samplers:
            sampler.close()
    return spent


def report_real(ticks: int, pause: float, batch: int, every: int, sides: Sequence[str]) -> None:
    spent = run_real(ticks, pause, batch, every, sides)
    print(f"this host's GPU 0, whole, real NVML and GPM, {ticks} ticks of each, {pause} s apart, wall clock")
    for what, pick in (("median", statistics.median), ("mean", statistics.fmean)):
        bare = pick(spent["bare calls"])
        sides = "   ".join(
            f"{side} {pick(us):7.1f} us ({pick(us) / bare:.2f}x)" for side, us in spent.items()
        )
        print(f"{what:8s} {sides}")
    print("target: smlens' ratio to the bare calls <= 1.25x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--instances", type=int, default=7)
    parser.add_argument("--latencies", choices=("h200", "reference"), default="h200")
    parser.add_argument("--real", action="store_true", help="on a GPU host: its GPU 0 through real NVML")
    parser.add_argument("--pause", type=float, default=0.5, help="--real: seconds before each tick")
    parser.add_argument("--batch", type=int, default=30, help="--real: ticks the deferred prototype keeps")
    parser.add_argument(
        "--publish-every",
        type=int,
        default=15,
        help="smlens publishes every this many ticks (default: the chart's 15 s scrape at 1 s)",
    )
    parser.add_argument(
        "--sides",
        default=",".join(REAL_SIDES),
        help=f"--real: the sides to time, comma-separated, of {','.join(REAL_SIDES)} (bare always)",
    )
    args = parser.parse_args()
    if args.real:
        chosen = {side.strip() for side in args.sides.split(",")} | {"bare"}
        if chosen - set(REAL_SIDES):
            unknown = ", ".join(repr(side) for side in sorted(chosen - set(REAL_SIDES)))
            parser.error(f"--sides: unknown side {unknown}; the sides are {','.join(REAL_SIDES)}.")
        report_real(args.ticks, args.pause, args.batch, args.publish_every, tuple(chosen))
        return
    table, nvml, gpm = latencies(args.latencies)
    print(
        f"one H200 on the fake pynvml, {args.latencies} call latencies (reference x {nvml:.2f} for NVML, "
        f"x {gpm:.2f} for GPM), mean per tick over {args.ticks} ticks"
    )
    for instances in (0, args.instances):
        smlens, bare = run(instances, args.ticks, table, gpm, args.publish_every)
        what = "whole GPU, MIG off" if not instances else f"MIG on, {instances} GPU instances"
        print(f"{what:32s} smlens {smlens:7.1f} us   bare calls {bare:7.1f} us   ratio {smlens / bare:.2f}x")
    print("target: ratio <= 1.25x")


if __name__ == "__main__":
    main()
