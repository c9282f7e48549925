"""MIG enumeration: the GPU instances of a GPU in MIG mode, each with its profile and MIG devices.

A GPU instance (GI) owns SMs and memory; it holds one or more compute instances, each of which is a MIG
device with its own handle and UUID (what the kubelet hands to pods). GPM samples a GI as a whole
(``nvmlGpmMigSampleGet``), so smlens reports per GI.

The profile name comes from the GI's profile (``nvmlDeviceGetGpuInstanceById``, which nvml.h says needs a
privileged user), else from the MIG device's name, which ends in the profile (``... MIG 1g.18gb``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from smlens.model import MigInstance
from smlens.sources.nvml.calls import Absent, call, call_named, text

_PREFIX = "MIG "
# No MIG device at an index (not_found), or one destroyed between two calls (invalid_argument on its handle).
_NOTHING_HERE = frozenset({"not_found", "invalid_argument"})


@dataclass(frozen=True)
class GpuInstanceLayout:
    """One GPU instance and the handles of its MIG devices (one per compute instance, by CI id)."""

    instance: MigInstance
    handles: tuple[Any, ...] = field(compare=False)


@dataclass(frozen=True)
class MigDevice:
    """What stays fixed about one MIG device while it exists (its UUID is immutable for its lifetime)."""

    gpu_instance: int
    compute_instance: int
    sm_count: int | None
    profile: str


def scan(
    nv: Any, handle: Any, label: str, known: dict[str, MigDevice] | None = None
) -> tuple[GpuInstanceLayout, ...] | Absent | None:
    """The GPU instances of one GPU, None when it is not in MIG mode, Absent when NVML cannot say.

    ``known`` (MIG device UUID -> MigDevice) carries what earlier scans learnt: a device seen before costs
    two calls (its handle and UUID) instead of seven. It is updated in place."""
    known = {} if known is None else known
    mode = call(nv.nvmlDeviceGetMigMode, handle, gpu=label)
    if isinstance(mode, Absent):
        return None if mode.reason == "not_supported" else mode
    if mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
        return None
    count = call(nv.nvmlDeviceGetMaxMigDeviceCount, handle, gpu=label)
    if isinstance(count, Absent):
        return count
    found: dict[int, list[tuple[MigDevice, str, Any]]] = defaultdict(list)
    for index in range(count):
        mig = call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, index, gpu=label)
        uuid = mig if isinstance(mig, Absent) else call(nv.nvmlDeviceGetUUID, mig, gpu=label)
        if isinstance(uuid, Absent):
            if uuid.reason in _NOTHING_HERE:
                continue
            return uuid  # the layout cannot be known: not the same as an empty index
        device = known.get(text(uuid)) or _identify(nv, handle, mig, label)
        if device is None:
            continue  # destroyed between two calls; the next scan sees the new layout
        known[text(uuid)] = device
        found[device.gpu_instance].append((device, text(uuid), mig))
    for gone in set(known) - {uuid for devices in found.values() for _, uuid, _ in devices}:
        del known[gone]
    layouts = []
    for gpu_instance, devices in sorted(found.items()):
        devices.sort(key=lambda d: d[0].compute_instance)
        sm_counts = [d[0].sm_count for d in devices]
        instance = MigInstance(
            gpu_instance=gpu_instance,
            profile=devices[0][0].profile,
            mig_uuids=tuple(d[1] for d in devices),
            sm_count=None if None in sm_counts else sum(s for s in sm_counts if s is not None),
        )
        layouts.append(GpuInstanceLayout(instance, tuple(d[2] for d in devices)))
    return tuple(layouts)


def _identify(nv: Any, handle: Any, mig: Any, label: str) -> MigDevice | None:
    gpu_instance = call(nv.nvmlDeviceGetGpuInstanceId, mig, gpu=label)
    compute_instance = call(nv.nvmlDeviceGetComputeInstanceId, mig, gpu=label)
    if isinstance(gpu_instance, Absent) or isinstance(compute_instance, Absent):
        return None
    attributes = call(nv.nvmlDeviceGetAttributes, mig, gpu=label)
    sms = None if isinstance(attributes, Absent) else int(attributes.multiprocessorCount)
    return MigDevice(gpu_instance, compute_instance, sms, _profile(nv, handle, gpu_instance, mig, label))


def _profile(nv: Any, handle: Any, gpu_instance: int, mig: Any, label: str) -> str:
    """``1g.18gb`` and the like, as nvidia-smi and the device plugin's resource names spell it."""
    instance = call(nv.nvmlDeviceGetGpuInstanceById, handle, gpu_instance, gpu=label)
    info = instance if isinstance(instance, Absent) else call(nv.nvmlGpuInstanceGetInfo, instance, gpu=label)
    if not isinstance(info, Absent):
        # nvidia-ml-py 12.x has no ...ByIdV (see tests/fakes/fake_pynvml.py): then the name below serves.
        by_id = "nvmlDeviceGetGpuInstanceProfileInfoByIdV"
        profile = call_named(nv, by_id, handle, info.profileId, gpu=label)
        if not isinstance(profile, Absent):
            return text(profile.name).removeprefix(_PREFIX)
    name = call(nv.nvmlDeviceGetName, mig, gpu=label)
    if isinstance(name, Absent) or _PREFIX not in text(name):
        return ""
    return text(name).rpartition(_PREFIX)[2]
