"""Fake nv-hostengines and a stub ``libdcgm`` that talks to them (test code written for smlens).

``LIBDCGM`` stands where ``libdcgm.so.4`` stands for NVIDIA's Python bindings: an object whose
attributes are C function pointers, called without ``argtypes`` exactly as NVIDIA's bindings call
the functions of their ``CDLL``. Each entry point is a ctypes callback with the C signature of
``dcgmlib/dcgm_agent.h`` (NVIDIA/DCGM), so what a binding passes is marshalled as it would be for the
real library, and the stub reads and writes the caller's structures through its own layouts (those
of the double, ``fake_dcgm/dcgm_structs.py``) and checks their ``version`` members. Both the double
and NVIDIA's real bindings run over this one stub: the conformance tests swap only the Python layer.

A test builds a :class:`FakeHostengine` with some :class:`FakeGpu`, makes it listen on an address
(or serve as the embedded engine), then drives it: ``publish`` stores one sample of the watched
fields, ``stop``/``start``/``restart`` take it away and bring it back with a fresh state, ``fail``
makes the next calls of one entry point return a code (DCGM_ST_TIMEOUT from a hung hostengine...).

Behaviour modelled on DCGM's source (docs/dcgm.md lists where each was checked):
* groups, field groups and watches belong to the connection that made them and vanish when it
  disconnects (persistAfterDisconnect=0) or the engine restarts; field-group names are unique
  hostengine-wide (DUPLICATE_KEY) and at most 64 field groups exist (MAX_LIMIT);
* watches are shared: a field watched by several clients is sampled once, at the fastest frequency;
* profiling: metric groups with the same major id need separate passes; DCGM multiplexes up to
  :data:`MAX_PASSES` of them across all clients' watches, one more fails with PROFILING_MULTI_PASS;
* while profiling is paused DCGM stores blank values; latest values carry per-field statuses;
* MIG: a GPU's :class:`FakeGpuInstance` list is its GPU instances (GIs) in DCGM's enumeration order.
  ``dcgmGetGpuInstanceHierarchy`` lists each GI (parent: its GPU) followed by its compute instances
  (parent: the GI), with entity ids numbered per GPU as DCGM's cache manager does (``gpuId *
  maxGpcs`` + position; maxGpcs is NVML's maximum MIG device count, here DCGM's fallback
  DCGM_MAX_INSTANCES_PER_GPU), so a reconfiguration can give an id to another GI.
  Entities are (entity group, id) pairs: groups hold them (``dcgmGroupAddEntity``), watches and
  samples are kept per entity. ``reconfigure`` replaces a GPU's GIs and nothing else: watches and
  cached samples stay on the entity ids, whatever GI an id now denotes (``ClearGpuMigInfo`` clears only
  the GI list; ``GetLatestSample`` serves an entity's cached samples without checking the entity).
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from ctypes import (
    CFUNCTYPE,
    POINTER,
    c_char_p,
    c_double,
    c_int,
    c_longlong,
    c_uint,
    c_uint16,
    c_ushort,
    c_void_p,
)
from dataclasses import dataclass, field
from typing import Any

from fakes.fake_dcgm import dcgm_fields as F
from fakes.fake_dcgm import dcgm_structs as S
from fakes.fake_dcgm import dcgmvalue as V

MetricGroups = Sequence[tuple[int, int, Sequence[int]]]  # (majorId, minorId, field ids)

# Shapes of what dcgmProfGetSupportedMetricGroups returns; the grouping is illustrative.
ONE_PASS: MetricGroups = (  # Ampere-like: the SM and every pipe counter fit in one pass
    (0, 0, (1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1013, 1014, 1015, 1016)),
    (1, 0, (1009, 1010)),
    (2, 0, (1011, 1012)),
)
# Volta/Turing-like: the pipes exclude SM active and each other, and there is no FP64 tensor pipe
# (DFMA, 1015: FP64 tensor cores came with the A100).
MULTI_PASS: MetricGroups = (
    (0, 0, (1001, 1002, 1003)),
    (0, 1, (1001, 1004, 1014)),
    (0, 2, (1001, 1006)),
    (0, 3, (1001, 1007)),
    (0, 4, (1001, 1008)),
    (0, 5, (1001, 1013)),
    (0, 6, (1001, 1016)),
    (1, 0, (1005,)),
    (2, 0, (1009, 1010)),
    (3, 0, (1011, 1012)),
)
NO_HMMA: MetricGroups = tuple(
    (major, minor, tuple(f for f in ids if f != 1014)) for major, minor, ids in ONE_PASS
)
PROFILING_FIELD_IDS = range(1001, 1100)
# DCGM stores the PCIe and NVLink byte rates as 64-bit integers, the other profiling fields as doubles.
INT64_PROFILING_FIELDS = frozenset({1009, 1010, 1011, 1012})
MAX_PASSES = 5  # DLG_MAX_METRIC_GROUPS, NVIDIA/DCGM testing/python3/tests/test_prof.py
FIRST_CLOCK_US = 1_800_000_000_000_000


class Refused(Exception):
    """The DCGM_ST_* code an entry point returns."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def passes_needed(metric_groups: MetricGroups, field_ids: Iterable[int]) -> int | None:
    """Fewest hardware passes that count ``field_ids`` (the most groups of one major id used);
    None if some field is in no group. Brute force: DCGM offers at most 10 groups per GPU."""
    wanted = set(field_ids)
    if not wanted:
        return 0
    best: int | None = None
    for size in range(1, len(metric_groups) + 1):
        for choice in itertools.combinations(metric_groups, size):
            if wanted <= {f for _, _, ids in choice for f in ids}:
                majors = [major for major, _, _ in choice]
                passes = max(majors.count(major) for major in majors)
                best = passes if best is None else min(best, passes)
    return best


Entity = tuple[int, int]  # (DCGM_FE_*, entity id), as dcgmGroupEntityPair_t


@dataclass
class FakeGpuInstance:
    """One MIG GPU instance as DCGM's hierarchy describes it (dcgmMigEntityInfo_t)."""

    nvml_id: int  # nvmlInstanceId: NVML's GPU instance id
    slices: int = 1  # nvmlProfileSlices
    # nvmlMigProfileId: the profile's nvmlGpuInstanceProfileInfo_t.id (as `nvidia-smi mig -lgip` lists it),
    # not its NVML_GPU_INSTANCE_PROFILE_* index
    profile_id: int = 0
    compute_instances: int = 1
    # a CI row carries its compute-instance profile's id and slice count (PopulateMigHierarchy); None:
    # one CI over the whole GI, as `nvidia-smi mig -cgi ... -C` makes
    ci_profile_id: int = 0
    ci_slices: int | None = None
    profiling_error: int | None = None  # DCGM_ST_* dcgmWatchFields returns for a group holding this GI


@dataclass
class FakeGpu:
    uuid: str
    metric_groups: MetricGroups = ONE_PASS
    profiling_error: int | None = None  # DCGM_ST_* that dcgmProfGetSupportedMetricGroups returns
    gpm: bool = False  # Hopper and newer: DCGM refuses to pause profiling
    lost: bool = False
    instances: list[FakeGpuInstance] = field(default_factory=list)  # MIG GPU instances, in DCGM's order


@dataclass
class Owned:
    owner: int  # connection id
    items: tuple[Any, ...]  # a group's entities, a field group's field ids
    name: str = ""


def gpu_entity(gpu_index: int) -> Entity:
    return (F.DCGM_FE_GPU, gpu_index)


class FakeHostengine:
    def __init__(self, gpus: Sequence[FakeGpu]) -> None:
        self.gpus = list(gpus)
        self.running = True
        self.generation = 0
        self.clock_us = FIRST_CLOCK_US
        self.failures: dict[str, list[int]] = {}  # entry point -> codes its next calls return
        self._reset_state()

    def _reset_state(self) -> None:
        self.paused = False
        self.groups: dict[int, Owned] = {}
        self.field_groups: dict[int, Owned] = {}
        self.watches: dict[tuple[Entity, int], dict[int, int]] = {}  # (entity, field) -> {owner: freq us}
        self.samples: dict[tuple[Entity, int], tuple[int, float | int]] = {}  # (entity, field) -> (ts, value)

    def stop(self) -> None:
        self.running = False
        self._reset_state()

    def start(self) -> None:
        self.running = True
        self.generation += 1

    def restart(self) -> None:
        self.stop()
        self.start()

    def fail(self, entry_point: str, code: int, times: int = 1) -> None:
        self.failures.setdefault(entry_point, []).extend([code] * times)

    def watched(self, gpu_index: int, entity: Entity | None = None) -> set[int]:
        """Fields some client watches on a GPU (or on ``entity``, one of its GPU instances)."""
        entity = entity or gpu_entity(gpu_index)
        return {f for (e, f), owners in self.watches.items() if e == entity and owners}

    def update_frequency(self, gpu_index: int, field_id: int) -> int:
        return min(self.watches[(gpu_entity(gpu_index), field_id)].values())

    def passes(self, gpu_index: int) -> int | None:
        """Passes DCGM runs for the profiling fields all clients watch on this GPU."""
        profiled = self.watched(gpu_index) & set(PROFILING_FIELD_IDS)
        return passes_needed(self.gpus[gpu_index].metric_groups, profiled)

    def publish(self, gpu_index: int, values: Mapping[int, float | int], step_us: int = 1_000_000) -> None:
        """One DCGM sample of the given fields, kept only for watched ones; blank while paused."""
        self.clock_us += step_us
        self._store(gpu_entity(gpu_index), values)

    def publish_instance(self, gpu_index: int, nvml_id: int, values: Mapping[int, float | int]) -> None:
        """One sample of a GPU instance's fields, at the time of the GPU's latest ``publish``."""
        self._store((F.DCGM_FE_GPU_I, self.instance_entity(gpu_index, nvml_id)), values)

    def _store(self, entity: Entity, values: Mapping[int, float | int]) -> None:
        watched = {f for (e, f), owners in self.watches.items() if e == entity and owners}
        for field_id, value in values.items():
            if field_id not in watched:
                continue
            if self.paused and field_id in PROFILING_FIELD_IDS:
                value = V.DCGM_INT64_BLANK if field_id in INT64_PROFILING_FIELDS else V.DCGM_FP64_BLANK
            self.samples[(entity, field_id)] = (self.clock_us, value)

    # -- MIG --------------------------------------------------------------------------------------

    def instance_entity(self, gpu_index: int, nvml_id: int) -> int:
        """The DCGM entity id of a GPU's GI: numbered by position, as DcgmCacheManager does."""
        positions = [gi.nvml_id for gi in self.gpus[gpu_index].instances]
        return gpu_index * S.DCGM_MAX_INSTANCES_PER_GPU + positions.index(nvml_id)

    def instance_at(self, entity_id: int) -> tuple[int, FakeGpuInstance] | None:
        gpu_index, position = divmod(entity_id, S.DCGM_MAX_INSTANCES_PER_GPU)
        if not 0 <= gpu_index < len(self.gpus) or position >= len(self.gpus[gpu_index].instances):
            return None
        return gpu_index, self.gpus[gpu_index].instances[position]

    def reconfigure(self, gpu_index: int, instances: Sequence[FakeGpuInstance]) -> None:
        """An administrator destroys or creates GPU instances: entity ids are handed out again; the
        watches and the last samples of the ids stay (DcgmCacheManager.cpp ClearGpuMigInfo), so an id
        given to another GI serves the previous GI's last sample until a new one is published."""
        self.gpus[gpu_index].instances = list(instances)

    def entity_exists(self, entity: Entity) -> bool:
        kind, ident = entity
        if kind == F.DCGM_FE_GPU:
            return 0 <= ident < len(self.gpus)
        if kind == F.DCGM_FE_GPU_I:
            return self.instance_at(ident) is not None
        if kind == F.DCGM_FE_GPU_CI:
            return (F.DCGM_FE_GPU_CI, ident) in {(row[0], row[1]) for row in self.hierarchy()}
        return False

    def hierarchy(self) -> list[tuple[int, int, Entity, tuple[int, FakeGpuInstance, int]]]:
        """(entity group, entity id, parent, (GPU index, GI, CI id or -1)) as DCGM lists them."""
        rows: list[tuple[int, int, Entity, tuple[int, FakeGpuInstance, int]]] = []
        for gpu_index, gpu in enumerate(self.gpus):
            next_ci = gpu_index * S.DCGM_MAX_INSTANCES_PER_GPU
            for gi in gpu.instances:
                gi_entity = self.instance_entity(gpu_index, gi.nvml_id)
                rows.append((F.DCGM_FE_GPU_I, gi_entity, gpu_entity(gpu_index), (gpu_index, gi, -1)))
                for ci in range(gi.compute_instances):
                    parent = (F.DCGM_FE_GPU_I, gi_entity)
                    rows.append((F.DCGM_FE_GPU_CI, next_ci, parent, (gpu_index, gi, ci)))
                    next_ci += 1
        return rows

    def drop_connection(self, connection: int) -> None:
        for table in (self.groups, self.field_groups):
            for key in [k for k, v in table.items() if v.owner == connection]:
                del table[key]
        for owners in self.watches.values():
            owners.pop(connection, None)

    def check_watchable(self, entity: Entity, field_ids: Sequence[int]) -> None:
        """A GPU instance is profiled with its GPU's metric groups, unless DCGM refuses it."""
        kind, ident = entity
        profiled = set(field_ids) & set(PROFILING_FIELD_IDS)
        if not profiled:
            return
        if kind == F.DCGM_FE_GPU_I:
            found = self.instance_at(ident)
            assert found is not None, "the group held an entity that no longer exists"
            gpu_index, instance = found
            if instance.profiling_error is not None:
                raise Refused(instance.profiling_error)
        else:
            gpu_index = ident
        gpu = self.gpus[gpu_index]
        if gpu.profiling_error is not None:
            raise Refused(gpu.profiling_error)
        passes = passes_needed(
            gpu.metric_groups, profiled | (self.watched(gpu_index, entity) & set(PROFILING_FIELD_IDS))
        )
        if passes is None:
            raise Refused(S.DCGM_ST_PROFILING_NOT_SUPPORTED)
        if passes > MAX_PASSES:
            raise Refused(S.DCGM_ST_PROFILING_MULTI_PASS)


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
    initialized: bool = False
    engines: dict[str, FakeHostengine] = field(default_factory=dict)  # by "host:port" or "unix:path"
    embedded: FakeHostengine | None = None
    connections: dict[int, Connection] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)  # stub errors, which ctypes would swallow

    def listen(self, engine: FakeHostengine, address: str = "localhost:5555") -> FakeHostengine:
        self.engines[address] = engine
        return engine


REGISTRY = Registry()
_ids = itertools.count(1)


def reset() -> Registry:
    """A fresh registry (the modules and the stub library stay loaded between tests)."""
    global REGISTRY
    REGISTRY = Registry()
    return REGISTRY


# -- the stub library ---------------------------------------------------------------------------------

_MESSAGES = {
    S.DCGM_ST_BADPARAM: "Bad parameter passed to function",
    S.DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    S.DCGM_ST_TIMEOUT: "Timeout",
    S.DCGM_ST_VER_MISMATCH: "API version mismatch",
    S.DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
    S.DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    S.DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
    S.DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
}
_message_buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}


def _connection(handle: int | None) -> Connection:
    connection = REGISTRY.connections.get(handle or 0)
    if connection is None or not connection.engine.running:
        raise Refused(S.DCGM_ST_CONNECTION_NOT_VALID)
    if connection.generation != connection.engine.generation:
        raise Refused(S.DCGM_ST_CONNECTION_NOT_VALID)
    return connection


def _engine(handle: int | None) -> FakeHostengine:
    return _connection(handle).engine


def _gpu(engine: FakeHostengine, gpu_id: int) -> FakeGpu:
    if not 0 <= gpu_id < len(engine.gpus):
        raise Refused(S.DCGM_ST_BADPARAM)
    return engine.gpus[gpu_id]


def _check_version(struct: Any, expected: int) -> None:
    if struct.version != expected:
        raise Refused(S.DCGM_ST_VER_MISMATCH)


def _open(engine: FakeHostengine, out: Any, embedded: bool, persist: bool, address: str) -> None:
    handle = next(_ids)
    REGISTRY.connections[handle] = Connection(engine, engine.generation, embedded, persist, address)
    out[0] = handle


def dcgmInit() -> None:
    REGISTRY.initialized = True


def dcgmShutdown() -> None:
    REGISTRY.initialized = False


def dcgmErrorString(code: int) -> int | None:
    text = _MESSAGES.get(code)
    if text is None:
        return None
    buffer = _message_buffers.setdefault(code, ctypes.create_string_buffer(text.encode()))
    return ctypes.addressof(buffer)


def dcgmStartEmbedded(op_mode: int, out: Any) -> None:
    if REGISTRY.embedded is None or op_mode not in (S.DCGM_OPERATION_MODE_AUTO, S.DCGM_OPERATION_MODE_MANUAL):
        raise Refused(S.DCGM_ST_INIT_ERROR)
    _open(REGISTRY.embedded, out, embedded=True, persist=False, address="embedded")


def dcgmStopEmbedded(handle: int | None) -> None:
    connection = _connection(handle)
    connection.engine.drop_connection(handle or 0)
    del REGISTRY.connections[handle or 0]


def dcgmConnect_v2(address: bytes | None, params_ptr: Any, out: Any) -> None:
    if not address or not params_ptr or not out:
        raise Refused(S.DCGM_ST_BADPARAM)
    params = params_ptr[0]
    _check_version(params, S.c_dcgmConnectV2Params_version2)
    text = address.decode()
    if params.addressIsUnixSocket:
        key = f"unix:{text}"
    elif text.rpartition(":")[0] and not text.endswith("]"):
        key = text
    else:  # DCGM's default port
        key = f"{text}:5555"
    engine = REGISTRY.engines.get(key)
    if engine is None or not engine.running:
        raise Refused(S.DCGM_ST_CONNECTION_NOT_VALID)
    _open(engine, out, embedded=False, persist=bool(params.persistAfterDisconnect), address=key)


def dcgmDisconnect(handle: int | None) -> None:
    connection = REGISTRY.connections.pop(handle or 0, None)
    if connection is None:
        raise Refused(S.DCGM_ST_BADPARAM)
    if not connection.persist and connection.generation == connection.engine.generation:
        connection.engine.drop_connection(handle or 0)


def dcgmGetAllDevices(handle: int | None, ids: Any, count: Any) -> None:
    engine = _engine(handle)
    for i in range(len(engine.gpus)):
        ids[i] = i
    count[0] = len(engine.gpus)


def dcgmGetDeviceAttributes(handle: int | None, gpu_id: int, attributes_ptr: Any) -> None:
    gpu = _gpu(_engine(handle), gpu_id)
    attributes = attributes_ptr[0]
    _check_version(attributes, S.dcgmDeviceAttributes_version3)
    attributes.identifiers.uuid = gpu.uuid


def dcgmGetGpuInstanceHierarchy(handle: int | None, hierarchy_ptr: Any) -> None:
    """DcgmApi.cpp tsapiGetGpuInstanceHierarchy and DcgmCacheManager::PopulateMigHierarchy."""
    if not hierarchy_ptr:
        raise Refused(S.DCGM_ST_BADPARAM)
    hierarchy = hierarchy_ptr[0]
    _check_version(hierarchy, S.c_dcgmMigHierarchy_version2)
    engine = _engine(handle)
    rows = engine.hierarchy()
    if len(rows) > S.DCGM_MAX_HIERARCHY_INFO:
        raise Refused(S.DCGM_ST_INSUFFICIENT_SIZE)
    hierarchy.count = len(rows)
    for i, (kind, entity_id, (parent_kind, parent_id), (gpu_index, gi, ci)) in enumerate(rows):
        row = hierarchy.entityList[i]
        row.entity.entityGroupId, row.entity.entityId = kind, entity_id
        row.parent.entityGroupId, row.parent.entityId = parent_kind, parent_id
        row.info.gpuUuid = engine.gpus[gpu_index].uuid
        row.info.nvmlGpuIndex = gpu_index
        row.info.nvmlInstanceId = gi.nvml_id
        row.info.nvmlComputeInstanceId = 0xFFFFFFFF if ci < 0 else ci  # -1 in an unsigned int
        row.info.nvmlMigProfileId = gi.profile_id if ci < 0 else gi.ci_profile_id
        row.info.nvmlProfileSlices = gi.slices if ci < 0 or gi.ci_slices is None else gi.ci_slices


def dcgmProfGetSupportedMetricGroups(handle: int | None, reply_ptr: Any) -> None:
    reply = reply_ptr[0]
    _check_version(reply, S.dcgmProfGetMetricGroups_version3)
    gpu = _gpu(_engine(handle), reply.gpuId)
    if gpu.profiling_error is not None:
        raise Refused(gpu.profiling_error)
    reply.numMetricGroups = len(gpu.metric_groups)
    for i, (major, minor, ids) in enumerate(gpu.metric_groups):
        group = reply.metricGroups[i]
        group.majorId, group.minorId, group.numFieldIds = major, minor, len(ids)
        for j, field_id in enumerate(ids):
            group.fieldIds[j] = field_id


def dcgmGroupCreate(handle: int | None, group_type: int, name: bytes | None, out: Any) -> None:
    engine = _engine(handle)
    if group_type != S.DCGM_GROUP_EMPTY or not name:
        raise Refused(S.DCGM_ST_BADPARAM)
    if len(engine.groups) >= S.DCGM_MAX_NUM_GROUPS:
        raise Refused(S.DCGM_ST_MAX_LIMIT)
    group_id = next(_ids)
    engine.groups[group_id] = Owned(handle or 0, (), name.decode())
    out[0] = group_id


def _owned(table: dict[int, Owned], key: int | None) -> Owned:
    item = table.get(key or 0)
    if item is None:
        raise Refused(S.DCGM_ST_BADPARAM)
    return item


def dcgmGroupDestroy(handle: int | None, group_id: int | None) -> None:
    engine = _engine(handle)
    _owned(engine.groups, group_id)
    del engine.groups[group_id or 0]


def dcgmGroupAddDevice(handle: int | None, group_id: int | None, gpu_id: int) -> None:
    dcgmGroupAddEntity(handle, group_id, F.DCGM_FE_GPU, gpu_id)


def dcgmGroupAddEntity(handle: int | None, group_id: int | None, entity_group: int, entity_id: int) -> None:
    """BADPARAM for an unknown entity or one already in the group, GPU_IS_LOST for an entity of a lost
    GPU (DcgmGroupManager.inl DcgmGroupInfo::AddEntityToGroup: the entity's status is its GPU's)."""
    engine = _engine(handle)
    group = _owned(engine.groups, group_id)
    entity = (entity_group, entity_id)
    if not engine.entity_exists(entity):
        raise Refused(S.DCGM_ST_BADPARAM)
    found = engine.instance_at(entity_id) if entity_group == F.DCGM_FE_GPU_I else None
    gpu_index = found[0] if found is not None else entity_id if entity_group == F.DCGM_FE_GPU else None
    if gpu_index is not None and engine.gpus[gpu_index].lost:
        raise Refused(S.DCGM_ST_GPU_IS_LOST)
    if entity in group.items:
        raise Refused(S.DCGM_ST_BADPARAM)
    group.items = (*group.items, entity)


def dcgmFieldGroupCreate(handle: int | None, count: int, ids: Any, name: bytes | None, out: Any) -> None:
    engine = _engine(handle)
    if count <= 0 or not name or count > S.DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP:
        raise Refused(S.DCGM_ST_BADPARAM)
    if len(engine.field_groups) >= S.DCGM_MAX_NUM_FIELD_GROUPS:
        raise Refused(S.DCGM_ST_MAX_LIMIT)
    text = name.decode()
    if any(g.name == text for g in engine.field_groups.values()):
        raise Refused(S.DCGM_ST_DUPLICATE_KEY)
    field_group_id = next(_ids)
    engine.field_groups[field_group_id] = Owned(handle or 0, tuple(ids[i] for i in range(count)), text)
    out[0] = field_group_id


def dcgmFieldGroupDestroy(handle: int | None, field_group_id: int | None) -> None:
    engine = _engine(handle)
    _owned(engine.field_groups, field_group_id)
    del engine.field_groups[field_group_id or 0]


def dcgmFieldGroupGetAll(handle: int | None, reply_ptr: Any) -> None:
    engine = _engine(handle)
    reply = reply_ptr[0]
    _check_version(reply, S.dcgmAllFieldGroup_version1)
    reply.numFieldGroups = len(engine.field_groups)
    for i, (field_group_id, owned) in enumerate(engine.field_groups.items()):
        info = reply.fieldGroups[i]
        info.version = S.dcgmFieldGroupInfo_version1
        info.fieldGroupId = field_group_id
        info.fieldGroupName = owned.name
        info.numFieldIds = len(owned.items)
        for j, field_id in enumerate(owned.items):
            info.fieldIds[j] = field_id


def dcgmWatchFields(
    handle: int | None, group_id: int | None, field_group_id: int | None, freq: int, age: float, samples: int
) -> None:
    engine = _engine(handle)
    group = _owned(engine.groups, group_id)
    field_group = _owned(engine.field_groups, field_group_id)
    if freq <= 0 or age < 0 or samples < 0:
        raise Refused(S.DCGM_ST_BADPARAM)
    if not group.items:
        raise Refused(S.DCGM_ST_GROUP_IS_EMPTY)
    for entity in group.items:
        engine.check_watchable(entity, field_group.items)
    for entity in group.items:
        for field_id in field_group.items:
            engine.watches.setdefault((entity, field_id), {})[handle or 0] = freq


def dcgmUnwatchFields(handle: int | None, group_id: int | None, field_group_id: int | None) -> None:
    engine = _engine(handle)
    group = _owned(engine.groups, group_id)
    field_group = _owned(engine.field_groups, field_group_id)
    for entity in group.items:
        for field_id in field_group.items:
            engine.watches.get((entity, field_id), {}).pop(handle or 0, None)


def dcgmEntityGetLatestValues(
    handle: int | None, entity_group: int, entity_id: int, ids: Any, count: int, values: Any
) -> None:
    engine = _engine(handle)
    entity = (entity_group, entity_id)
    if entity_group == F.DCGM_FE_GPU_I:
        found = engine.instance_at(entity_id)
        gpu_index = -1 if found is None else found[0]  # a GI gone since: its id keeps watches and samples
    elif entity_group == F.DCGM_FE_GPU:
        gpu_index = entity_id
    else:
        raise Refused(S.DCGM_ST_NOT_SUPPORTED)
    if gpu_index >= 0 and _gpu(engine, gpu_index).lost:
        raise Refused(S.DCGM_ST_GPU_IS_LOST)
    watched = engine.watched(gpu_index, entity)
    for i in range(count):
        field_id = ids[i]
        value = values[i]
        is_int = field_id in INT64_PROFILING_FIELDS
        value.version = S.dcgmFieldValue_version1
        value.fieldId = field_id
        value.fieldType = ord(F.DCGM_FT_INT64 if is_int else F.DCGM_FT_DOUBLE)
        sample = engine.samples.get((entity, field_id))
        if sample is None:  # DCGM keeps serving old samples of a field no longer watched
            value.status = S.DCGM_ST_NO_DATA if field_id in watched else S.DCGM_ST_NOT_WATCHED
            if is_int:
                value.value.i64 = V.DCGM_INT64_BLANK
            else:
                value.value.dbl = V.DCGM_FP64_BLANK
            continue
        value.status = S.DCGM_ST_OK
        value.ts = sample[0]
        if is_int:
            value.value.i64 = int(sample[1])
        else:
            value.value.dbl = float(sample[1])


def _profiling_control(handle: int | None, paused: bool) -> None:
    engine = _engine(handle)
    if any(gpu.gpm for gpu in engine.gpus):
        raise Refused(S.DCGM_ST_NOT_SUPPORTED)
    engine.paused = paused


def dcgmProfPause(handle: int | None) -> None:
    _profiling_control(handle, paused=True)


def dcgmProfResume(handle: int | None) -> None:
    _profiling_control(handle, paused=False)


_HANDLE = c_void_p  # dcgmHandle_t, dcgmGpuGrp_t and dcgmFieldGrp_t are uintptr_t
_OUT_HANDLE = POINTER(c_void_p)
# Entry point -> (Python implementation, C parameter types from dcgm_agent.h); all return dcgmReturn_t.
_ENTRY_POINTS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "dcgmInit": (dcgmInit, ()),
    "dcgmShutdown": (dcgmShutdown, ()),
    "dcgmStartEmbedded": (dcgmStartEmbedded, (c_int, _OUT_HANDLE)),
    "dcgmStopEmbedded": (dcgmStopEmbedded, (_HANDLE,)),
    "dcgmConnect_v2": (dcgmConnect_v2, (c_char_p, POINTER(S.c_dcgmConnectV2Params_v2), _OUT_HANDLE)),
    "dcgmDisconnect": (dcgmDisconnect, (_HANDLE,)),
    "dcgmGetAllDevices": (dcgmGetAllDevices, (_HANDLE, POINTER(c_uint), POINTER(c_int))),
    "dcgmGetDeviceAttributes": (
        dcgmGetDeviceAttributes,
        (_HANDLE, c_uint, POINTER(S.c_dcgmDeviceAttributes_v3)),
    ),
    "dcgmGetGpuInstanceHierarchy": (dcgmGetGpuInstanceHierarchy, (_HANDLE, POINTER(S.c_dcgmMigHierarchy_v2))),
    "dcgmProfGetSupportedMetricGroups": (
        dcgmProfGetSupportedMetricGroups,
        (_HANDLE, POINTER(S.c_dcgmProfGetMetricGroups_v3)),
    ),
    "dcgmGroupCreate": (dcgmGroupCreate, (_HANDLE, c_int, c_char_p, _OUT_HANDLE)),
    "dcgmGroupDestroy": (dcgmGroupDestroy, (_HANDLE, _HANDLE)),
    "dcgmGroupAddDevice": (dcgmGroupAddDevice, (_HANDLE, _HANDLE, c_uint)),
    # dcgm_field_entity_group_t is an enum and dcgm_field_eid_t an unsigned int (dcgm_fields.h)
    "dcgmGroupAddEntity": (dcgmGroupAddEntity, (_HANDLE, _HANDLE, c_uint, c_uint)),
    "dcgmFieldGroupCreate": (
        dcgmFieldGroupCreate,
        (_HANDLE, c_int, POINTER(c_uint16), c_char_p, _OUT_HANDLE),
    ),
    "dcgmFieldGroupDestroy": (dcgmFieldGroupDestroy, (_HANDLE, _HANDLE)),
    "dcgmFieldGroupGetAll": (dcgmFieldGroupGetAll, (_HANDLE, POINTER(S.c_dcgmAllFieldGroup_v1))),
    "dcgmWatchFields": (dcgmWatchFields, (_HANDLE, _HANDLE, _HANDLE, c_longlong, c_double, c_int)),
    "dcgmUnwatchFields": (dcgmUnwatchFields, (_HANDLE, _HANDLE, _HANDLE)),
    "dcgmEntityGetLatestValues": (
        dcgmEntityGetLatestValues,
        (_HANDLE, c_uint, c_int, POINTER(c_ushort), c_uint, POINTER(S.c_dcgmFieldValue_v1)),
    ),
    "dcgmProfPause": (dcgmProfPause, (_HANDLE,)),
    "dcgmProfResume": (dcgmProfResume, (_HANDLE,)),
}


class StubLibDcgm:
    """The entry points as C function pointers without argtypes, like the attributes of a CDLL."""

    def __init__(self) -> None:
        self._callbacks: list[Any] = []  # kept alive: the pointers below point into them
        for name, (implementation, parameters) in _ENTRY_POINTS.items():
            setattr(self, name, self._export(name, implementation, parameters))
        error_string = CFUNCTYPE(c_void_p, c_int)(dcgmErrorString)
        self._callbacks.append(error_string)
        self.dcgmErrorString = CFUNCTYPE(c_char_p)(ctypes.cast(error_string, c_void_p).value)

    def _export(self, name: str, implementation: Callable[..., Any], parameters: tuple[Any, ...]) -> Any:
        def entry(*args: Any) -> int:
            REGISTRY.calls.append(name)
            try:
                if not REGISTRY.initialized and name != "dcgmInit":
                    raise Refused(S.DCGM_ST_UNINITIALIZED)
                handle = args[0] if parameters[:1] == (_HANDLE,) else None
                connection = REGISTRY.connections.get(handle or 0)
                failures = connection.engine.failures.get(name) if connection is not None else None
                if failures:
                    raise Refused(failures.pop(0))
                implementation(*args)
            except Refused as refused:
                return refused.code
            except Exception as exc:  # a bug in the stub or a caller passing nonsense: make it loud
                REGISTRY.crashes.append(f"{name}: {exc!r}")
                return S.DCGM_ST_GENERIC_ERROR
            return S.DCGM_ST_OK

        callback = CFUNCTYPE(c_int, *parameters)(entry)
        self._callbacks.append(callback)
        return CFUNCTYPE(c_int)(ctypes.cast(callback, c_void_p).value)


LIBDCGM = StubLibDcgm()
