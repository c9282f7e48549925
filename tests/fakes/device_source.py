"""A device source standing in for the nvml backend: identities and utilization, no profiling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from smlens import names as n
from smlens.model import Activity, GpuIdentity, Reading
from smlens.sources.base import DeviceSource


class NvmlLikeNode(DeviceSource):
    name = "node"

    def __init__(
        self,
        identities: Sequence[GpuIdentity],
        interval: float = 1.0,
        gauges: Mapping[str, float] | None = None,
    ) -> None:
        self.identities = list(identities)
        self.interval = interval
        self.gauges = dict(gauges or {})

    def discover(self) -> list[GpuIdentity]:
        return self.identities

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        return {gpu.uuid: None for gpu in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        return Reading(
            source=self.name, activity={n.UTILIZATION: Activity.of(1.0, self.interval)}, gauges=self.gauges
        )
