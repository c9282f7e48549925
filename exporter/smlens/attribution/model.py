"""Immutable results of workload attribution: who holds each GPU and what each workload uses on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Names of attribution sources, used as the ``source`` label of smlens_attribution_up.
PODRESOURCES = "podresources"
PROCESSES = "processes"
SIM = "sim"


@dataclass(frozen=True, slots=True, order=True)
class Workload:
    """Who a device or a process belongs to. Fields that do not apply are empty strings.

    A Kubernetes container has ``namespace``, ``pod`` and ``container``; a Slurm job has
    ``slurm_job``; a process outside both is the empty workload (unattributed).
    """

    namespace: str = ""
    pod: str = ""
    container: str = ""
    slurm_job: str = ""


UNATTRIBUTED = Workload()


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device handed to one container, as the kubelet (or the sim layout) reports it.

    ``gpu_uuid`` is the physical GPU the device lives on, None when it could not be mapped
    to a GPU of this node. ``device`` is the id as reported (a GPU UUID, an index, a
    time-slicing replica such as ``GPU-...::2``, a MIG UUID, a DRA device name).
    ``partition`` is true for a MIG slice: the container holds part of the GPU, not all of it;
    ``gpu_instance`` is the MIG GPU instance the slice belongs to, when known.
    """

    owner: Workload
    resource: str
    device: str
    gpu_uuid: str | None
    partition: bool = False
    gpu_instance: int | None = None


@dataclass(frozen=True, slots=True)
class WorkloadUsage:
    """What the processes of one workload use on one GPU, summed over its processes.

    ``utilization`` is NVML's per-process utilization summed over the workload's processes
    (0..1, capped): the share of the refresh window in which a kernel of theirs ran, time-based
    like GPU utilization and NOT a measure of SM activity. None when the driver does not report it.
    """

    gpu_uuid: str
    workload: Workload
    processes: int
    memory_used_bytes: float | None
    utilization: float | None


@dataclass(frozen=True, slots=True)
class SourceState:
    """Health of one attribution source after its last refresh."""

    name: str
    up: bool
    reason: str = ""  # short label when down: socket_missing, permission_denied, timeout, ...
    message: str = ""  # one sentence for the log when down
    refresh_seconds: float | None = None


@dataclass(frozen=True)
class Attribution:
    """One immutable picture of who uses which GPU, published by the refresher."""

    allocations: tuple[Allocation, ...] = ()
    workloads: tuple[WorkloadUsage, ...] = ()
    sources: tuple[SourceState, ...] = ()
    refreshed_at: float | None = None  # unix time of the refresh that produced it
    owner_labels: bool = True  # put namespace/pod/container on the series of a GPU one container holds
    _by_gpu: Mapping[str, tuple[Allocation, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_gpu: dict[str, list[Allocation]] = {}
        for allocation in self.allocations:
            if allocation.gpu_uuid is not None:
                by_gpu.setdefault(allocation.gpu_uuid, []).append(allocation)
        object.__setattr__(self, "_by_gpu", MappingProxyType({k: tuple(v) for k, v in by_gpu.items()}))

    def allocations_of(self, gpu_uuid: str) -> tuple[Allocation, ...]:
        return self._by_gpu.get(gpu_uuid, ())

    def owners(self, gpu_uuid: str) -> tuple[Workload, ...]:
        """The distinct containers holding (part of) this GPU, sorted."""
        return tuple(sorted({a.owner for a in self.allocations_of(gpu_uuid)}))

    def sole_owner(self, gpu_uuid: str) -> Workload | None:
        """The container that holds this whole GPU alone, None if nobody does or it is shared or split."""
        allocations = self.allocations_of(gpu_uuid)
        owners = {a.owner for a in allocations}
        if len(owners) != 1 or any(a.partition for a in allocations):
            return None
        return owners.pop()

    def instance_owner(self, gpu_uuid: str, gpu_instance: int) -> Workload | None:
        """The container that holds the MIG devices of this GPU instance alone, None if nobody or several."""
        owners = {a.owner for a in self.allocations_of(gpu_uuid) if a.gpu_instance == gpu_instance}
        return owners.pop() if len(owners) == 1 else None


EMPTY_ATTRIBUTION = Attribution()
