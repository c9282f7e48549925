"""GPM backend: SM active, SM occupancy, tensor, DRAM and FP pipe activity, PCIe and NVLink traffic, from
NVML GPM (GPU Performance Monitoring, Hopper and newer).

Each GPU owns two GPM samples. A read takes a new sample into the older one's place and asks NVML for the
metrics between the previous sample and the new one, so consecutive reads cover consecutive intervals
exactly; the first read after attach only takes a sample. NVML_GPM_METRIC_GRAPHICS_UTIL is never asked
for: alone it costs ~1.5 ms per GPU per call on an H200 and repeats NVML utilization.

Made by :func:`smlens.backends.nvml.open_nvml_backends`, sharing one NVML session with the nvml backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smlens.backends.base import Backend
from smlens.errors import BackendError
from smlens.model import Activity, GpuIdentity, Reading
from smlens.names import (
    DRAM_ACTIVE,
    FP16_ACTIVE,
    FP32_ACTIVE,
    FP64_ACTIVE,
    HMMA_ACTIVE,
    NVLINK_RX_BYTES,
    NVLINK_TX_BYTES,
    PCIE_RX_BYTES,
    PCIE_TX_BYTES,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
)
from smlens.nvml.calls import Absent, attach_each, call, describe, failure, nvml_module
from smlens.nvml.session import NvmlSession

RATIO_METRICS = (  # Reading.activity key, GPM metric in percent
    (SM_ACTIVE, "NVML_GPM_METRIC_SM_UTIL"),
    (SM_OCCUPANCY, "NVML_GPM_METRIC_SM_OCCUPANCY"),
    (TENSOR_ACTIVE, "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    (HMMA_ACTIVE, "NVML_GPM_METRIC_HMMA_TENSOR_UTIL"),
    (DRAM_ACTIVE, "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    (FP64_ACTIVE, "NVML_GPM_METRIC_FP64_UTIL"),
    (FP32_ACTIVE, "NVML_GPM_METRIC_FP32_UTIL"),
    (FP16_ACTIVE, "NVML_GPM_METRIC_FP16_UTIL"),
)
TRAFFIC_METRICS = (  # Reading.increments key, GPM metric in MiB/s
    (PCIE_TX_BYTES, "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    (PCIE_RX_BYTES, "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
    (NVLINK_TX_BYTES, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    (NVLINK_RX_BYTES, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
)
METRICS = RATIO_METRICS + TRAFFIC_METRICS
_IS_RATIO = tuple((key, i < len(RATIO_METRICS)) for i, (key, _) in enumerate(METRICS))
MIB = 1 << 20
NOT_SUPPORTED = "GPM not supported on this GPU (needs Hopper or newer)"


def metrics_request(nv: Any) -> Any:
    """A ``c_nvmlGpmMetricsGet_t`` asking for :data:`METRICS`; its two samples are set before each use."""
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    for i, (_, metric) in enumerate(METRICS):
        request.metrics[i].metricId = getattr(nv, metric)
    return request


@dataclass
class _GpmGpu:
    handle: Any
    label: str
    samples: tuple[Any, Any]
    request: Any
    results: tuple[Any, ...]  # views of request.metrics[i], fetched once: each access costs ~1 us
    newest: int = 0  # which of the two samples was taken last
    taken_at: float | None = None  # `now` of that sample; None before the first read


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
        samples = [call(nv.nvmlGpmSampleAlloc), call(nv.nvmlGpmSampleAlloc)]
        failed = next((s for s in samples if isinstance(s, Absent)), None)
        if failed is not None:
            for sample in samples:
                if not isinstance(sample, Absent):
                    call(nv.nvmlGpmSampleFree, sample)
            return f"GPM sample allocation failed ({failed.reason})"
        request = metrics_request(nv)
        results = tuple(request.metrics[i] for i in range(len(METRICS)))
        self._gpus[gpu.uuid] = _GpmGpu(handle, label, (samples[0], samples[1]), request, results)
        return None

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        state = self._gpus.get(gpu.uuid)
        if state is None:
            raise BackendError(f"the gpm backend does not serve {describe(gpu)}.", reason="not_attached")
        nv = nvml_module()
        slot = 1 - state.newest
        taken = call(nv.nvmlGpmSampleGet, state.handle, state.samples[slot], gpu=state.label)
        if isinstance(taken, Absent):  # the previous sample stays, so the next interval is still exact
            raise BackendError(f"GPM sample of {state.label} failed ({taken.reason}).", reason=taken.reason)
        previous, previous_at = state.samples[state.newest], state.taken_at
        state.newest, state.taken_at = slot, now
        if previous_at is None:
            return Reading(source=self.name, profiling=True)
        request = state.request
        request.sample1, request.sample2 = previous, state.samples[slot]
        got = call(nv.nvmlGpmMetricsGet, request, gpu=state.label)
        if isinstance(got, Absent):
            raise BackendError(f"GPM metrics of {state.label} failed ({got.reason}).", reason=got.reason)
        seconds = now - previous_at
        activity: dict[str, Activity] = {}
        increments: dict[str, float] = {}
        missing: dict[str, str] = {}
        for (key, is_ratio), result in zip(_IS_RATIO, state.results, strict=True):
            returned = result.nvmlReturn
            if returned != nv.NVML_SUCCESS:
                missing[key] = failure(returned, state.label).reason
            elif not math.isfinite(result.value):  # one NaN would poison the *_seconds_total integral
                missing[key] = "not_a_number"
            elif is_ratio:
                activity[key] = Activity.of(result.value / 100, seconds)
            else:
                increments[key] = max(result.value, 0.0) * MIB * seconds
        return Reading(
            source=self.name, activity=activity, increments=increments, missing=missing, profiling=True
        )

    @staticmethod
    def _free(nv: Any, state: _GpmGpu | None) -> None:
        if state is not None:
            for sample in state.samples:
                call(nv.nvmlGpmSampleFree, sample)

    def close(self) -> None:
        if self._gpus:
            nv = nvml_module()
            for state in self._gpus.values():
                self._free(nv, state)
            self._gpus.clear()
        self._session.release(self)
