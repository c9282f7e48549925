"""DCGM's view of MIG: which DCGM entity (``DCGM_FE_GPU_I``) stands for each GPU instance that NVML lists.

smlens names a GPU instance the way NVML's layout does (:class:`~smlens.model.MigInstance`: NVML's GI id,
profile, MIG device UUIDs), so that the DCGM backend's activity and the nvml backend's memory of one
instance land on one series. DCGM numbers its GI entities itself (``gpuId *`` the GPU's maximum MIG
device count + the GI's position, DcgmCacheManager.cpp), so an id can pass to another GI when MIG is
reconfigured; the
hierarchy (``dcgmGetGpuInstanceHierarchy``) gives, per GI entity, its parent GPU, NVML's GI id
(``nvmlInstanceId``) and the profile's slice count (``nvmlProfileSlices``), which must agree with the
``<slices>g.`` of NVML's profile name before DCGM's values are credited to that instance.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from smlens.model import GpuIdentity, MigInstance
from smlens.sources.nvml.session import MigLayout


class MigLayouts(Protocol):
    """Where the GPU instances of a GPU come from: :class:`smlens.sources.nvml.session.NvmlSession`."""

    def mig_layout(self, gpu: GpuIdentity, now: float) -> MigLayout: ...

    def rescan_mig(self, gpu: GpuIdentity) -> None: ...


@dataclass(frozen=True)
class GiEntity:
    """One ``DCGM_FE_GPU_I`` entity of DCGM's hierarchy."""

    entity_id: int
    nvml_instance: int  # NVML's GPU instance id
    slices: int  # of its profile


# ctypes' own attribute read: NVIDIA's _DcgmStructure.__getattribute__ also decodes bytes and wraps classes on
# each read, which slows parsing a whole node's hierarchy every tick; the numbers read here need neither.
_read = ctypes.Structure.__getattribute__


def gi_entities(hierarchy: Any, fields: Any) -> dict[int, dict[int, GiEntity]]:
    """DCGM GPU id -> NVML GI id -> its entity, from a ``c_dcgmMigHierarchy_v2``; compute instances
    (``DCGM_FE_GPU_CI``) are left out: smlens reads per GPU instance, as GPM samples them."""
    found: dict[int, dict[int, GiEntity]] = {}
    rows = _read(hierarchy, "entityList")
    for i in range(int(_read(hierarchy, "count"))):
        row = rows[i]
        pair, parent = _read(row, "entity"), _read(row, "parent")
        if int(_read(pair, "entityGroupId")) != fields.DCGM_FE_GPU_I:
            continue
        if int(_read(parent, "entityGroupId")) != fields.DCGM_FE_GPU:
            continue
        info = _read(row, "info")
        entity = GiEntity(
            int(_read(pair, "entityId")),
            int(_read(info, "nvmlInstanceId")),
            int(_read(info, "nvmlProfileSlices")),
        )
        found.setdefault(int(_read(parent, "entityId")), {})[entity.nvml_instance] = entity
    return found


_SLICES = re.compile(r"(\d+)g\.")


def profile_slices(profile: str) -> int | None:
    """The compute slices a profile name says (``3g.40gb`` -> 3); None for a name without them."""
    match = _SLICES.match(profile)
    return int(match.group(1)) if match else None


def match_instances(
    instances: tuple[MigInstance, ...], entities: Mapping[int, GiEntity]
) -> dict[MigInstance, GiEntity | str]:
    """Each NVML instance's DCGM entity, or why it has none: DCGM does not list that GI (yet), or lists
    it with another slice count (the GI was recreated and one of the two layouts is behind)."""
    matched: dict[MigInstance, GiEntity | str] = {}
    for instance in instances:
        entity = entities.get(instance.gpu_instance)
        slices = profile_slices(instance.profile)
        if entity is None:
            matched[instance] = "not_in_dcgm"
        elif slices is not None and slices != entity.slices:
            matched[instance] = "mig_layout_changing"
        else:
            matched[instance] = entity
    return matched
