"""Immutable data that flows from backends through the sampler to the collector and the API.

Backends return one :class:`Reading` per GPU per tick. The sampler folds readings into
cumulative :class:`GpuState` objects and publishes them together as one :class:`Snapshot`.
Absent values are absent keys, never zeros. The keys are named in :mod:`smlens.names`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from smlens.attribution.model import EMPTY_ATTRIBUTION, Attribution


@dataclass(frozen=True, slots=True)
class Activity:
    """``active_seconds`` of ``covered_seconds`` wall time; the mean ratio is their quotient."""

    active_seconds: float
    covered_seconds: float

    @property
    def ratio(self) -> float | None:
        if self.covered_seconds <= 0:
            return None
        return self.active_seconds / self.covered_seconds

    def __add__(self, other: Activity) -> Activity:
        return Activity(
            self.active_seconds + other.active_seconds, self.covered_seconds + other.covered_seconds
        )

    @staticmethod
    def of(ratio: float, seconds: float) -> Activity:
        """Activity for ``seconds`` spent at a constant ``ratio`` (clamped to 0..1)."""
        return Activity(min(max(ratio, 0.0), 1.0) * seconds, seconds)


ZERO_ACTIVITY = Activity(0.0, 0.0)


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


@dataclass(frozen=True)
class Reading:
    """What one backend read from one GPU during one tick.

    ``activity`` holds time-weighted ratios for the interval the backend observed;
    ``missing`` names values the backend could not read, with a short reason
    (``not_supported``, ``no_permission``, ...).
    """

    source: str
    gauges: Mapping[str, float] = field(default_factory=dict)
    activity: Mapping[str, Activity] = field(default_factory=dict)
    totals: Mapping[str, float] = field(default_factory=dict)
    increments: Mapping[str, float] = field(default_factory=dict)
    clock_events: Mapping[str, bool] = field(default_factory=dict)
    xid_events: Mapping[int, int] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)
    profiling: bool = False
    # How the profiling source counts: "one_pass", or "multiplexed" when the hardware counters are
    # shared out over several passes (DCGM, other clients' fields included); empty when not known.
    profiling_mode: str = ""


@dataclass(frozen=True)
class GpuState:
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

    def ratio(self, key: str) -> float | None:
        """Latest value of an activity ratio (0..1), or None when unavailable."""
        return self.gauges.get(key)


@dataclass(frozen=True)
class BackendStats:
    """Health and cost of one backend, cumulative since start."""

    name: str
    up: bool
    last_duration_seconds: float
    duration_seconds_total: float
    samples_total: int
    errors_total: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One complete, immutable picture of the node, published once per tick."""

    hostname: str
    sequence: int
    taken_at: float  # unix time at the end of the tick
    interval_seconds: float
    tick_duration_seconds: float
    sampler_cpu_seconds_total: float  # CPU time of the sampling thread since start
    gpus: tuple[GpuState, ...]
    backends: tuple[BackendStats, ...]
    attribution: Attribution = EMPTY_ATTRIBUTION  # who holds and uses each GPU, refreshed in the background
