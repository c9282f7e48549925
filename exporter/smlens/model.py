"""Immutable data that flows from backends through the sampler to the collector and the API.

Backends return one :class:`Reading` per GPU per tick. The sampler folds readings into
cumulative :class:`GpuState` objects and publishes them together as one :class:`Snapshot`.
Absent values are absent keys, never zeros. The keys are named in :mod:`smlens.names`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple


class Activity(NamedTuple):
    """``active_seconds`` of ``covered_seconds`` wall time; the mean ratio is their quotient."""

    active_seconds: float
    covered_seconds: float

    @property
    def ratio(self) -> float | None:
        if self.covered_seconds <= 0:
            return None
        return self.active_seconds / self.covered_seconds

    def __add__(self, other: Activity) -> Activity:  # type: ignore[override]  # a sum, not a tuple's join
        return Activity(
            self.active_seconds + other.active_seconds, self.covered_seconds + other.covered_seconds
        )

    @staticmethod
    def of(ratio: float, seconds: float) -> Activity:
        """Activity for ``seconds`` spent at a constant ``ratio`` (clamped to 0..1)."""
        return Activity(min(max(ratio, 0.0), 1.0) * seconds, seconds)


ZERO_ACTIVITY = Activity(0.0, 0.0)
EMPTY: Mapping[Any, Any] = MappingProxyType({})  # the default of every mapping field below


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What stays fixed about one GPU while the exporter runs."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""
    driver_version: str = ""
    serial: str = ""
    sm_count: int | None = None
    compute_capability: str = ""


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG GPU instance of a GPU, as found at one scan of its MIG layout.

    ``mig_uuids`` are the UUIDs of its MIG devices (one per compute instance, usually one);
    ``sm_count`` the SMs of those compute instances together, None when NVML does not say.
    A GPU instance destroyed and created again is a different MigInstance.
    """

    gpu_instance: int
    profile: str  # e.g. "1g.18gb"; empty when NVML does not say
    mig_uuids: tuple[str, ...]
    sm_count: int | None = None
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # a dict key of the samplers, hashed several times per tick
        object.__setattr__(
            self, "_hash", hash((self.gpu_instance, self.profile, self.mig_uuids, self.sm_count))
        )

    def __hash__(self) -> int:
        return self._hash

    @property
    def mig_uuid(self) -> str:
        return ",".join(self.mig_uuids)


class InstanceReading(NamedTuple):
    """What one backend read from one GPU instance during one tick (see :class:`Reading`)."""

    instance: MigInstance
    gauges: Mapping[str, float] = EMPTY
    activity: Mapping[str, Activity] = EMPTY
    missing: Mapping[str, str] = EMPTY


class Reading(NamedTuple):
    """What one backend read from one GPU during one tick.

    ``activity`` holds time-weighted ratios for the interval the backend observed;
    ``missing`` names values the backend could not read, with a short reason
    (``not_supported``, ``no_permission``, ...).
    """

    source: str
    gauges: Mapping[str, float] = EMPTY
    activity: Mapping[str, Activity] = EMPTY
    totals: Mapping[str, float] = EMPTY
    increments: Mapping[str, float] = EMPTY
    clock_events: Mapping[str, bool] = EMPTY
    xid_events: Mapping[int, int] = EMPTY
    missing: Mapping[str, str] = EMPTY
    profiling: bool = False
    # How the profiling source counts: "one_pass", or "multiplexed" when the hardware counters are
    # shared out over several passes (DCGM, other clients' fields included); empty when not known.
    profiling_mode: str = ""
    instances: tuple[InstanceReading, ...] = ()  # per MIG GPU instance, when the GPU is in MIG mode
    # True when the backend knew the GPU's MIG layout this tick: ``instances`` then names every GPU
    # instance the GPU has (none when it is not in MIG mode).
    mig_layout_read: bool = False


class InstanceState(NamedTuple):
    """One MIG GPU instance at the end of a tick: latest gauges and ratios, cumulative activity."""

    instance: MigInstance
    gauges: Mapping[str, float]
    activity_totals: Mapping[str, Activity]
    missing: Mapping[str, str]


class GpuState(NamedTuple):
    """Everything known about one GPU at the end of a tick, cumulative where it says so."""

    identity: GpuIdentity
    up: bool
    gauges: Mapping[str, float]
    activity_totals: Mapping[str, Activity]
    totals: Mapping[str, float]
    clock_events: Mapping[str, bool]
    xid_totals: Mapping[str, int]  # by names.xid_label: bounded
    missing: Mapping[str, str]
    profiling_source: str | None  # the backend serving SM-level metrics for this GPU, if any
    profiling_available: bool  # did that source deliver in the last tick
    profiling_reason: str  # why profiling is unavailable, empty when it is
    sources: tuple[str, ...]
    profiling_mode: str = ""  # see Reading.profiling_mode
    instances: tuple[InstanceState, ...] = ()  # MIG GPU instances, when the GPU is in MIG mode

    def ratio(self, key: str) -> float | None:
        """Latest value of an activity ratio (0..1), or None when unavailable."""
        return self.gauges.get(key)


class BackendStats(NamedTuple):
    """Health and cost of one backend, cumulative since start."""

    name: str
    up: bool
    last_duration_seconds: float
    duration_seconds_total: float
    samples_total: int
    errors_total: Mapping[str, int] = EMPTY


# ---- workload attribution: who holds each GPU and what each workload uses on it ----


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

    def __post_init__(self) -> None:
        # Names come from file names, which need not be UTF-8 (a lone surrogate from os.listdir): each bad
        # byte becomes "?" here, so that every answer and the exposition can encode them.
        for name in ("namespace", "pod", "container", "slurm_job"):
            object.__setattr__(self, name, valid_text(getattr(self, name)))


def valid_text(text: str) -> str:
    """``text`` with "?" for each character that UTF-8 cannot encode (lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="replace").decode()
    return text


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


# ---- accounting: seconds per verdict class and owner (pipeline.accounting folds them) ----


class Account(NamedTuple):
    """Whose seconds, on which GPU or instance, in which class. ``gpu_instance`` is None for a GPU."""

    uuid: str
    gpu_instance: int | None
    mig_profile: str
    verdict: str
    owner: Workload


class Entry(NamedTuple):
    seconds: float
    added_at: float  # the sampler's clock at the last tick that added to it


Ledger = Mapping[Account, Entry]


class Snapshot(NamedTuple):
    """One complete, immutable picture of the node, published once per tick."""

    hostname: str
    sequence: int
    taken_at: float  # unix time at the end of the tick
    interval_seconds: float
    tick_duration_seconds: float
    sampler_cpu_seconds_total: float  # CPU time of the ticks so far, on whichever thread ran them
    gpus: tuple[GpuState, ...]
    backends: tuple[BackendStats, ...]
    attribution: Attribution = EMPTY_ATTRIBUTION  # who holds and uses each GPU, refreshed in the background
    ledger: Ledger = EMPTY  # seconds per verdict class and owner, when the exporter accounts them
