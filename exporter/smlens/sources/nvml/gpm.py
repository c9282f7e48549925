"""GPM backend: SM active, SM occupancy, tensor, DRAM and every compute pipe's activity, PCIe and NVLink
traffic, from NVML GPM (GPU Performance Monitoring, Hopper and newer).

Each GPU owns two GPM samples. A read takes a new sample into the older one's place and asks NVML for the
metrics between the previous sample and the new one, so consecutive reads cover consecutive intervals
exactly; the first read after attach only takes a sample. NVML_GPM_METRIC_GRAPHICS_UTIL is never asked
for: it repeats NVML utilization (gpu_utilization_ratio), and it is slow to compute.

On a GPU in MIG mode each GPU instance gets its own two samples too (``nvmlGpmMigSampleGet``), with the
ratio metrics only; its activity comes back in ``Reading.instances``. The MIG layout comes from the NVML
session; a failed instance sample makes the session scan the GPU again, so instances created or destroyed
while smlens runs appear or leave without a restart.

Made by :func:`smlens.sources.nvml.backend.open_nvml_backends`, sharing one NVML session with the nvml
backend.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smlens.errors import BackendError
from smlens.model import Activity, GpuIdentity, InstanceReading, MigInstance, Reading
from smlens.names import (
    DFMA_ACTIVE,
    DMMA_ACTIVE,
    DRAM_ACTIVE,
    FP16_ACTIVE,
    FP32_ACTIVE,
    FP64_ACTIVE,
    HMMA_ACTIVE,
    IMMA_ACTIVE,
    INSTANCE_ACTIVITIES,
    INTEGER_ACTIVE,
    NVLINK_RX_BYTES,
    NVLINK_TX_BYTES,
    PCIE_RX_BYTES,
    PCIE_TX_BYTES,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
)
from smlens.sources.base import Backend, Captured, finish
from smlens.sources.nvml.calls import Absent, attach_each, call, describe, failure, nvml_module
from smlens.sources.nvml.session import MigLayout, NvmlSession

RATIO_METRICS = (  # Reading.activity key, GPM metric in percent
    (SM_ACTIVE, "NVML_GPM_METRIC_SM_UTIL"),
    (SM_OCCUPANCY, "NVML_GPM_METRIC_SM_OCCUPANCY"),
    (TENSOR_ACTIVE, "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    (HMMA_ACTIVE, "NVML_GPM_METRIC_HMMA_TENSOR_UTIL"),
    (IMMA_ACTIVE, "NVML_GPM_METRIC_IMMA_TENSOR_UTIL"),
    (DFMA_ACTIVE, "NVML_GPM_METRIC_DFMA_TENSOR_UTIL"),
    (DMMA_ACTIVE, "NVML_GPM_METRIC_DMMA_TENSOR_UTIL"),
    (DRAM_ACTIVE, "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    (FP64_ACTIVE, "NVML_GPM_METRIC_FP64_UTIL"),
    (FP32_ACTIVE, "NVML_GPM_METRIC_FP32_UTIL"),
    (FP16_ACTIVE, "NVML_GPM_METRIC_FP16_UTIL"),
    (INTEGER_ACTIVE, "NVML_GPM_METRIC_INTEGER_UTIL"),
)
TRAFFIC_METRICS = (  # Reading.increments key, GPM metric in MiB/s
    (PCIE_TX_BYTES, "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    (PCIE_RX_BYTES, "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
    (NVLINK_TX_BYTES, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    (NVLINK_RX_BYTES, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
)
METRICS = RATIO_METRICS + TRAFFIC_METRICS
# Per MIG GPU instance: only the four the verdicts and rules use, since each metric asked costs time in
# nvmlGpmMetricsGet and in the Python that turns it into an Activity, for every instance.
INSTANCE_METRICS = tuple(m for m in RATIO_METRICS if m[0] in INSTANCE_ACTIVITIES)
_IS_RATIO = tuple((key, i < len(RATIO_METRICS)) for i, (key, _) in enumerate(METRICS))
_INSTANCE_IS_RATIO = tuple((key, True) for key, _ in INSTANCE_METRICS)
MIB = 1 << 20
Stepped = tuple[float, tuple[Any, ...]]  # seconds between two samples, and the metrics' flat results
NOT_SUPPORTED = "GPM not supported on this GPU (needs Hopper or newer)"


def metrics_request(nv: Any, metrics: Sequence[tuple[str, str]] = METRICS) -> Any:
    """A ``c_nvmlGpmMetricsGet_t`` asking for ``metrics``; its two samples are set before each use."""
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    for i, (_, metric) in enumerate(metrics):
        request.metrics[i].metricId = getattr(nv, metric)
    return request


def results_layout(request: Any, metrics: int) -> struct.Struct:
    """Where each metric's nvmlReturn and value lie in a ``c_nvmlGpmMetricsGet_t``, for one unpack of all.

    The offsets come from the ctypes types themselves, so the layout follows the installed pynvml; nvml.h
    fixes the two fields' types (a 4-byte return code before an 8-byte double)."""
    element = type(request.metrics[0])
    size, returned, value = ctypes.sizeof(element), element.nvmlReturn.offset, element.value.offset
    one = f"{returned}xI{value - returned - 4}xd{size - value - 8}x"
    return struct.Struct(f"={type(request).metrics.offset}x" + one * metrics)


@dataclass
class _Pair:
    """Two GPM samples taken in turn and the request that reads the metrics between them."""

    samples: tuple[Any, Any]
    request: Any
    # (nvmlReturn, value) of every metric of ``request``, flat: one C call instead of two ctypes field
    # reads per metric.
    unpack: Callable[[], tuple[Any, ...]]
    newest: int = 0  # which of the two samples was taken last
    taken_at: float | None = None  # `now` of that sample; None before the first read

    @staticmethod
    def allocate(nv: Any, metrics: Sequence[tuple[str, str]]) -> _Pair | Absent:
        samples = [call(nv.nvmlGpmSampleAlloc), call(nv.nvmlGpmSampleAlloc)]
        failed = next((s for s in samples if isinstance(s, Absent)), None)
        if failed is not None:
            for sample in samples:
                if not isinstance(sample, Absent):
                    call(nv.nvmlGpmSampleFree, sample)
            return failed
        request = metrics_request(nv, metrics)
        unpack = functools.partial(results_layout(request, len(metrics)).unpack_from, request)
        return _Pair((samples[0], samples[1]), request, unpack)

    def step(
        self, nv: Any, take: Callable[..., Any], args: tuple[Any, ...], now: float, label: str
    ) -> Stepped | Absent | None:
        """Take a sample with ``take(*args, sample)`` in place of the older one. Returns the seconds since
        the previous sample and the metrics between them (each metric's nvmlReturn and value, flat: one
        C call instead of two ctypes field reads per metric), None after the first sample, Absent when
        NVML failed."""
        slot = 1 - self.newest
        error = nv.NVMLError
        try:
            take(*args, self.samples[slot])
        except error as exc:  # the previous sample stays, so the next interval is still exact
            return failure(exc.value, label)
        previous, previous_at = self.samples[self.newest], self.taken_at
        self.newest, self.taken_at = slot, now
        if previous_at is None:
            return None
        self.request.sample1, self.request.sample2 = previous, self.samples[slot]
        try:
            nv.nvmlGpmMetricsGet(self.request)
        except error as exc:
            return failure(exc.value, label)
        return now - previous_at, self.unpack()

    def free(self, nv: Any) -> None:
        for sample in self.samples:
            call(nv.nvmlGpmSampleFree, sample)


def decode(
    nv: Any, metrics: Sequence[tuple[str, bool]], stepped: Stepped, label: str
) -> tuple[dict[str, Activity], dict[str, float], dict[str, str]]:
    """The activity of the ratio metrics and the bytes of the traffic metrics over a step's seconds, and
    why the others are missing. ``metrics``: (Reading key, is a ratio) in the request's order."""
    activity: dict[str, Activity] = {}
    increments: dict[str, float] = {}
    missing: dict[str, str] = {}
    seconds, flat = stepped
    success = nv.NVML_SUCCESS
    for (key, is_ratio), returned, value in zip(metrics, flat[::2], flat[1::2], strict=True):
        if returned != success:
            missing[key] = failure(returned, label).reason
        elif not math.isfinite(value):  # one NaN would poison the *_seconds_total integral
            missing[key] = "not_a_number"
        elif is_ratio:
            activity[key] = Activity.of(value / 100, seconds)
        else:
            increments[key] = max(value, 0.0) * MIB * seconds
    return activity, increments, missing


@dataclass
class _GpmGpu:
    identity: GpuIdentity
    handle: Any
    label: str
    whole: _Pair
    instances: dict[MigInstance, _Pair] = field(default_factory=dict)
    mig_unsupported: str | None = None  # why GPM gives nothing per GPU instance, once NVML said so
    whole_unsupported: Absent | None = None  # set when a GPU in MIG mode cannot be sampled whole


class GpmBackend(Backend):
    """SM-level activity from NVML GPM for the GPUs that support it."""

    name = "gpm"
    provides_profiling = True

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._gpus: dict[str, _GpmGpu] = {}

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        self._session.acquire(self)
        nv = nvml_module()
        return attach_each(gpus, lambda gpu: self._attach_one(nv, gpu))

    def _attach_one(self, nv: Any, gpu: GpuIdentity) -> str | None:
        self._free(nv, self._gpus.pop(gpu.uuid, None))
        handle = self._session.handle(gpu)
        if isinstance(handle, Absent):
            return f"NVML has no handle for this GPU ({handle.reason})"
        label = describe(gpu)
        support = call(nv.nvmlGpmQueryDeviceSupport, handle, gpu=label)
        if isinstance(support, Absent):
            if support.reason == "function_not_found":
                return "GPM not available: the NVIDIA driver is too old (GPM needs R520 or newer)"
            if support.reason == "not_supported":
                return NOT_SUPPORTED
            return f"GPM support query failed ({support.reason})"
        if not support.isSupportedDevice:
            return NOT_SUPPORTED
        pair = _Pair.allocate(nv, METRICS)
        if isinstance(pair, Absent):
            return f"GPM sample allocation failed ({pair.reason})"
        self._gpus[gpu.uuid] = _GpmGpu(gpu, handle, label, pair)
        return None

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        return finish(self.capture(gpu, now))

    def capture(self, gpu: GpuIdentity, now: float) -> Captured:
        state = self._gpus.get(gpu.uuid)
        if state is None:
            raise BackendError(f"the gpm backend does not serve {describe(gpu)}.", reason="not_attached")
        nv = nvml_module()
        handle, label = state.handle, state.label
        stepped = (
            state.whole_unsupported
            if state.whole_unsupported is not None
            else state.whole.step(nv, nv.nvmlGpmSampleGet, (handle,), now, label)
        )
        layout = self._session.mig_layout(state.identity, now)
        if layout is None and not state.instances:  # not in MIG mode, as most GPUs
            instances: tuple[InstanceReading, ...] = ()
        else:
            instances = self._read_instances(nv, state, layout, now)
        layout_read = not isinstance(layout, Absent)
        if isinstance(stepped, Absent):
            if not instances:
                state.whole_unsupported = None  # not, or no longer, in MIG mode: ask again next tick
                raise BackendError(f"GPM sample of {label} failed ({stepped.reason}).", reason=stepped.reason)
            # nvml.h does not say whether a GPU in MIG mode can be sampled whole; its instances still can.
            if stepped.reason == "not_supported":
                state.whole_unsupported = stepped
            return Reading(
                source=self.name,
                missing={SM_ACTIVE: stepped.reason},
                instances=instances,
                mig_layout_read=layout_read,
            )
        if stepped is None:
            return Reading(source=self.name, profiling=True, instances=instances, mig_layout_read=layout_read)
        return functools.partial(self._reading, stepped, label, instances, layout_read)

    def _reading(
        self, stepped: Stepped, label: str, instances: tuple[InstanceReading, ...], layout_read: bool
    ) -> Reading:
        activity, increments, missing = decode(nvml_module(), _IS_RATIO, stepped, label)
        return Reading(
            source=self.name,
            activity=activity,
            increments=increments,
            missing=missing,
            profiling=True,
            instances=instances,
            mig_layout_read=layout_read,
        )

    def _read_instances(
        self, nv: Any, state: _GpmGpu, layout: MigLayout, now: float
    ) -> tuple[InstanceReading, ...]:
        """One sample per GPU instance; instances gone from the layout give their samples back."""
        found = () if layout is None or isinstance(layout, Absent) else layout
        current = {f.instance for f in found}
        for gone in [i for i in state.instances if i not in current]:
            state.instances.pop(gone).free(nv)
        if not found:
            return ()
        readings = []
        handle, label = state.handle, state.label
        for layout_entry in found:
            instance = layout_entry.instance
            if state.mig_unsupported is not None:
                readings.append(InstanceReading(instance, missing={SM_ACTIVE: state.mig_unsupported}))
                continue
            pair = state.instances.get(instance)
            if pair is None:
                allocated = _Pair.allocate(nv, INSTANCE_METRICS)
                if isinstance(allocated, Absent):
                    readings.append(InstanceReading(instance, missing={SM_ACTIVE: allocated.reason}))
                    continue
                pair = state.instances[instance] = allocated
            stepped = pair.step(nv, nv.nvmlGpmMigSampleGet, (handle, instance.gpu_instance), now, label)
            if isinstance(stepped, Absent):
                if stepped.reason == "not_supported":
                    state.mig_unsupported = stepped.reason
                elif stepped.reason in ("not_found", "invalid_argument"):  # destroyed since the last scan
                    self._session.rescan_mig(state.identity)
                readings.append(InstanceReading(instance, missing={SM_ACTIVE: stepped.reason}))
                continue
            if stepped is None:
                readings.append(InstanceReading(instance))
                continue
            activity, _, missing = decode(nv, _INSTANCE_IS_RATIO, stepped, label)
            readings.append(InstanceReading(instance, activity=activity, missing=missing))
        return tuple(readings)

    @staticmethod
    def _free(nv: Any, state: _GpmGpu | None) -> None:
        if state is not None:
            state.whole.free(nv)
            for pair in state.instances.values():
                pair.free(nv)

    def close(self) -> None:
        if self._gpus:
            nv = nvml_module()
            for state in self._gpus.values():
                self._free(nv, state)
            self._gpus.clear()
        self._session.release(self)
