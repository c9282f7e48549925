"""Map the device ids that device plugins and DRA drivers report to the physical GPUs of this node.

Device plugin ids come in several shapes, depending on its ``deviceIDStrategy`` and sharing setup:
``GPU-<uuid>``, ``<index>``, time-slicing replicas ``GPU-<uuid>::<n>`` / ``<index>::<n>``, MIG
devices ``MIG-<uuid>`` (needs NVML to find the parent), legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` and
``<index>:<mig index>``. NVIDIA's DRA driver names devices ``gpu-<index>`` and
``gpu-<index>-mig-...``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from smlens.model import GpuIdentity

# Device plugin resources (globs) and DRA drivers whose devices are GPUs, unless configured otherwise.
DEFAULT_RESOURCE_NAMES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)

_REPLICA = re.compile(r"::\d+$")
_INDEX = re.compile(r"^\d+$")
_MIG_BY_INDEX = re.compile(r"^(\d+):\d+$")
_DRA_NAME = re.compile(r"(?:^|-)gpu-(\d+)(-mig-.*)?$")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a device lives: its GPU's uuid (None if not on a known GPU), whether it is a MIG slice and,
    when known, the id of its GPU instance."""

    gpu_uuid: str | None
    partition: bool = False
    gpu_instance: int | None = None


UNKNOWN = Placement(None)


class DeviceMap:
    """Resolves device ids against the GPUs this exporter serves."""

    def __init__(
        self, gpus: Sequence[GpuIdentity], mig_devices: Mapping[str, tuple[str, int]] | None = None
    ) -> None:
        """``mig_devices`` maps MIG device UUIDs to the GPU they are carved from and their GPU instance."""
        self.gpus = tuple(gpus)
        self._by_uuid = {gpu.uuid.lower(): gpu.uuid for gpu in gpus}
        self._by_index = {gpu.index: gpu.uuid for gpu in gpus}
        self._mig_devices = {mig.lower(): where for mig, where in (mig_devices or {}).items()}

    def _index(self, text: str) -> str | None:
        return self._by_index.get(int(text))

    def plugin_device(self, device_id: str) -> Placement:
        """Placement of one id from ``ContainerDevices.device_ids``."""
        base = _REPLICA.sub("", device_id.strip())
        lower = base.lower()
        if lower.startswith("gpu-"):
            return Placement(self._by_uuid.get(lower))
        if lower.startswith("mig-gpu-"):  # MIG-GPU-<uuid>/<gpu instance>/<compute instance>
            parent, _, rest = lower[len("mig-") :].partition("/")
            instance = rest.partition("/")[0]
            return Placement(self._by_uuid.get(parent), True, int(instance) if instance.isdigit() else None)
        if lower.startswith("mig-"):
            found = self._mig_devices.get(lower)
            return Placement(None, True) if found is None else Placement(found[0], True, found[1])
        if _INDEX.match(base):
            return Placement(self._index(base))
        mig = _MIG_BY_INDEX.match(base)
        if mig:
            return Placement(self._index(mig.group(1)), partition=True)
        return UNKNOWN

    def dra_device(self, device_name: str, cdi_names: Iterable[str]) -> Placement:
        """Placement of one DRA device, from its name or else from its CDI device names."""
        for candidate in (device_name, *(name.rpartition("=")[2] for name in cdi_names)):
            named = _DRA_NAME.search(candidate)
            if named:
                return Placement(self._index(named.group(1)), partition=named.group(2) is not None)
            placement = self.plugin_device(candidate)
            if placement.gpu_uuid is not None:
                return placement
        return UNKNOWN
