"""Controls of the DCGM test double (not part of DCGM): fake nv-hostengines that the fake
``dcgm_agent`` talks to, the way DCGM's client library talks to a real one.

A test builds a :class:`FakeHostengine` with some :class:`FakeGpu`, makes it listen on an address
(or serve as the embedded engine), then drives it: ``publish`` stores one sample of the watched
fields, ``stop``/``start``/``restart`` take it away and bring it back with a fresh state, as a real
hostengine restart does. Behaviour copied from DCGM: one connection's groups and watches vanish
when it disconnects (persistAfterDisconnect=0); a restarted engine forgets every connection, watch
and the profiling pause; while profiling is paused DCGM stores blank values; latest values report
per-field statuses (NOT_WATCHED, NO_DATA). Stricter than DCGM on purpose: watching profiling fields
that need two passes (same major id, different minor ids) fails with PROFILING_MULTI_PASS instead
of being multiplexed, so a test notices if smlens ever asks for that.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import dcgm_fields
import dcgm_structs
import dcgmvalue

MetricGroups = Sequence[tuple[int, int, Sequence[int]]]  # (majorId, minorId, field ids)

# Shapes of what dcgmProfGetSupportedMetricGroups returns; the grouping is illustrative.
ONE_PASS: MetricGroups = (  # Ampere-like: the SM and pipe counters fit in one pass
    (0, 0, (1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1014)),
    (1, 0, (1009, 1010)),
    (2, 0, (1011, 1012)),
)
MULTI_PASS: MetricGroups = (  # Volta/Turing-like: the pipes exclude SM active and each other
    (0, 0, (1001, 1002, 1003)),
    (0, 1, (1001, 1004, 1014)),
    (0, 2, (1001, 1006)),
    (0, 3, (1001, 1007)),
    (0, 4, (1001, 1008)),
    (1, 0, (1005,)),
    (2, 0, (1009, 1010)),
    (3, 0, (1011, 1012)),
)
NO_HMMA: MetricGroups = tuple(
    (major, minor, tuple(f for f in ids if f != 1014)) for major, minor, ids in ONE_PASS
)
PROFILING_FIELD_IDS = range(1001, 1100)


@dataclass
class FakeGpu:
    uuid: str
    metric_groups: MetricGroups = ONE_PASS
    profiling_error: int | None = None  # DCGM_ST_* that dcgmProfGetSupportedMetricGroups returns
    gpm: bool = False  # Hopper and newer: DCGM refuses to pause profiling
    lost: bool = False


@dataclass
class Owned:
    owner: int  # connection id
    items: tuple[int, ...]
    name: str = ""


class FakeHostengine:
    def __init__(self, gpus: Sequence[FakeGpu]) -> None:
        self.gpus = list(gpus)
        self.running = True
        self.generation = 0
        self.clock_us = 1_800_000_000_000_000
        self._reset_state()

    def _reset_state(self) -> None:
        self.paused = False
        self.groups: dict[int, Owned] = {}
        self.field_groups: dict[int, Owned] = {}
        self.watches: dict[tuple[int, int], tuple[int, int]] = {}  # (gpu, field) -> (owner, freq us)
        self.samples: dict[tuple[int, int], tuple[int, float | int]] = {}  # (gpu, field) -> (ts, value)

    def stop(self) -> None:
        self.running = False
        self._reset_state()

    def start(self) -> None:
        self.running = True
        self.generation += 1

    def restart(self) -> None:
        self.stop()
        self.start()

    def watched(self, gpu_index: int) -> set[int]:
        return {f for (g, f) in self.watches if g == gpu_index}

    def publish(self, gpu_index: int, values: Mapping[int, float | int], step_us: int = 1_000_000) -> None:
        """One DCGM sample of the given fields, kept only for watched ones; blank while paused."""
        self.clock_us += step_us
        for field_id, value in values.items():
            if (gpu_index, field_id) not in self.watches:
                continue
            if self.paused and field_id in PROFILING_FIELD_IDS:
                int_field = field_id in dcgm_fields.INT64_PROFILING_FIELDS
                value = dcgmvalue.DCGM_INT64_BLANK if int_field else dcgmvalue.DCGM_FP64_BLANK
            self.samples[(gpu_index, field_id)] = (self.clock_us, value)

    def drop_connection(self, connection: int) -> None:
        for table in (self.groups, self.field_groups):
            for key in [k for k, v in table.items() if v.owner == connection]:
                del table[key]
        for key in [k for k, v in self.watches.items() if v[0] == connection]:
            del self.watches[key]

    def check_watchable(self, gpu_index: int, field_ids: Sequence[int]) -> None:
        gpu = self.gpus[gpu_index]
        if gpu.profiling_error is not None:
            dcgm_structs._dcgmCheckReturn(gpu.profiling_error)
        wanted = self.watched(gpu_index) | set(field_ids)
        by_major: dict[int, list[frozenset[int]]] = {}
        for major, _, ids in gpu.metric_groups:
            by_major.setdefault(major, []).append(frozenset(ids))
        if not wanted <= frozenset().union(*itertools.chain.from_iterable(by_major.values())):
            dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_PROFILING_NOT_SUPPORTED)
        for choice in itertools.product(*by_major.values()):
            if wanted <= frozenset().union(*choice):
                return
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_PROFILING_MULTI_PASS)


@dataclass
class Connection:
    engine: FakeHostengine
    generation: int
    embedded: bool
    persist: bool
    address: str


@dataclass
class Registry:
    library_present: bool = True
    library_loaded: bool = False
    initialized: bool = False
    engines: dict[str, FakeHostengine] = field(default_factory=dict)  # by "host:port" or "unix:path"
    embedded: FakeHostengine | None = None
    connections: dict[int, Connection] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def listen(self, engine: FakeHostengine, address: str = "localhost:5555") -> FakeHostengine:
        self.engines[address] = engine
        return engine


REGISTRY = Registry()


def reset() -> Registry:
    """A fresh registry (the modules stay imported between tests)."""
    global REGISTRY
    REGISTRY = Registry()
    return REGISTRY
