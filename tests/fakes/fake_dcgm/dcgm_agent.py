"""Test double of DCGM's ``dcgm_agent``: the calls smlens makes, with DCGM's signatures, return
types and errors, served by the fake hostengines of ``dcgm_fake_engine``."""

from __future__ import annotations

import ctypes
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import dcgm_fake_engine
import dcgm_fields
import dcgm_structs
import dcgmvalue

F = TypeVar("F", bound=Callable[..., Any])
_ids = itertools.count(1)


def ensure_byte_strings() -> Callable[[F], F]:
    """As in DCGM, string arguments reach the C library as UTF-8 bytes."""

    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.encode() if isinstance(a, str) else a for a in args)
            kwargs = {k: v.encode() if isinstance(v, str) else v for k, v in kwargs.items()}
            registry = dcgm_fake_engine.REGISTRY
            registry.calls.append(fn.__name__)
            if not registry.library_loaded:
                dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_UNINITIALIZED)
            if fn.__name__ != "dcgmInit" and not registry.initialized:
                dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_UNINITIALIZED)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def _connection(handle: ctypes.c_void_p) -> dcgm_fake_engine.Connection:
    connection = dcgm_fake_engine.REGISTRY.connections.get(handle.value or 0)
    if connection is None or not connection.engine.running:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    assert connection is not None
    if connection.generation != connection.engine.generation:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    return connection


def _engine(handle: ctypes.c_void_p) -> dcgm_fake_engine.FakeHostengine:
    return _connection(handle).engine


def _gpu(engine: dcgm_fake_engine.FakeHostengine, gpu_id: int) -> dcgm_fake_engine.FakeGpu:
    if not 0 <= gpu_id < len(engine.gpus):
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    return engine.gpus[gpu_id]


def _open(
    engine: dcgm_fake_engine.FakeHostengine, embedded: bool, persist: bool, address: str
) -> ctypes.c_void_p:
    handle = next(_ids)
    dcgm_fake_engine.REGISTRY.connections[handle] = dcgm_fake_engine.Connection(
        engine, engine.generation, embedded, persist, address
    )
    return ctypes.c_void_p(handle)


@ensure_byte_strings()
def dcgmInit() -> int:
    dcgm_fake_engine.REGISTRY.initialized = True
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmStartEmbedded(opMode: int) -> ctypes.c_void_p:
    engine = dcgm_fake_engine.REGISTRY.embedded
    if engine is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_INIT_ERROR)
    assert engine is not None
    return _open(engine, embedded=True, persist=False, address="embedded")


@ensure_byte_strings()
def dcgmStopEmbedded(dcgm_handle: ctypes.c_void_p) -> int:
    connection = _connection(dcgm_handle)
    connection.engine.drop_connection(dcgm_handle.value or 0)
    del dcgm_fake_engine.REGISTRY.connections[dcgm_handle.value or 0]
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmConnect_v2(
    ip_address: bytes,
    connectParams: dcgm_structs.c_dcgmConnectV2Params_v2,
    version: int = dcgm_structs.c_dcgmConnectV2Params_version,
) -> ctypes.c_void_p:
    connectParams.version = version
    text = ip_address.decode()
    if connectParams.addressIsUnixSocket:
        address = f"unix:{text}"
    elif ":" in text:
        address = text
    else:  # DCGM's default port
        address = f"{text}:5555"
    engine = dcgm_fake_engine.REGISTRY.engines.get(address)
    if engine is None or not engine.running:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    assert engine is not None
    return _open(engine, embedded=False, persist=bool(connectParams.persistAfterDisconnect), address=address)


@ensure_byte_strings()
def dcgmDisconnect(dcgm_handle: ctypes.c_void_p) -> int:
    registry = dcgm_fake_engine.REGISTRY
    connection = registry.connections.pop(dcgm_handle.value or 0, None)
    if connection is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    assert connection is not None
    if not connection.persist and connection.generation == connection.engine.generation:
        connection.engine.drop_connection(dcgm_handle.value or 0)
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmGetAllDevices(dcgm_handle: ctypes.c_void_p) -> list[int]:
    return list(range(len(_engine(dcgm_handle).gpus)))


@ensure_byte_strings()
def dcgmGetDeviceAttributes(
    dcgm_handle: ctypes.c_void_p, gpuId: int, version: int = dcgm_structs.dcgmDeviceAttributes_version3
) -> dcgm_structs.c_dcgmDeviceAttributes_v3:
    gpu = _gpu(_engine(dcgm_handle), gpuId)
    attributes = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attributes.version = version
    attributes.identifiers.uuid = gpu.uuid.encode()
    return attributes


@ensure_byte_strings()
def dcgmProfGetSupportedMetricGroups(
    dcgmHandle: ctypes.c_void_p, gpuId: int
) -> dcgm_structs.c_dcgmProfGetMetricGroups_v3:
    gpu = _gpu(_engine(dcgmHandle), gpuId)
    if gpu.profiling_error is not None:
        dcgm_structs._dcgmCheckReturn(gpu.profiling_error)
    reply = dcgm_structs.c_dcgmProfGetMetricGroups_v3()
    reply.version = dcgm_structs.dcgmProfGetMetricGroups_version3
    reply.gpuId = gpuId
    reply.numMetricGroups = len(gpu.metric_groups)
    for i, (major, minor, ids) in enumerate(gpu.metric_groups):
        group = reply.metricGroups[i]
        group.majorId, group.minorId, group.numFieldIds = major, minor, len(ids)
        for j, field_id in enumerate(ids):
            group.fieldIds[j] = field_id
    return reply


@ensure_byte_strings()
def dcgmGroupCreate(dcgm_handle: ctypes.c_void_p, type: int, groupName: bytes) -> ctypes.c_void_p:
    engine = _engine(dcgm_handle)
    if type != dcgm_structs.DCGM_GROUP_EMPTY:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    group_id = next(_ids)
    engine.groups[group_id] = dcgm_fake_engine.Owned(dcgm_handle.value or 0, (), groupName.decode())
    return ctypes.c_void_p(group_id)


@ensure_byte_strings()
def dcgmGroupAddDevice(dcgm_handle: ctypes.c_void_p, group_id: ctypes.c_void_p, gpu_id: int) -> int:
    engine = _engine(dcgm_handle)
    _gpu(engine, gpu_id)
    group = engine.groups.get(group_id.value or 0)
    if group is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    assert group is not None
    group.items = (*group.items, gpu_id)
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmFieldGroupCreate(
    dcgm_handle: ctypes.c_void_p, fieldIds: Sequence[int], fieldGroupName: bytes
) -> ctypes.c_void_p:
    engine = _engine(dcgm_handle)
    name = fieldGroupName.decode()
    if not fieldIds or any(g.name == name for g in engine.field_groups.values()):
        dcgm_structs._dcgmCheckReturn(
            dcgm_structs.DCGM_ST_BADPARAM if not fieldIds else dcgm_structs.DCGM_ST_DUPLICATE_KEY
        )
    field_group_id = next(_ids)
    engine.field_groups[field_group_id] = dcgm_fake_engine.Owned(
        dcgm_handle.value or 0, tuple(fieldIds), name
    )
    return ctypes.c_void_p(field_group_id)


@ensure_byte_strings()
def dcgmWatchFields(
    dcgm_handle: ctypes.c_void_p,
    groupId: ctypes.c_void_p,
    fieldGroupId: ctypes.c_void_p,
    updateFreq: int,
    maxKeepAge: float,
    maxKeepSamples: int,
) -> int:
    engine = _engine(dcgm_handle)
    group = engine.groups.get(groupId.value or 0)
    field_group = engine.field_groups.get(fieldGroupId.value or 0)
    if group is None or field_group is None or updateFreq <= 0 or maxKeepAge < 0 or maxKeepSamples < 0:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    assert group is not None and field_group is not None
    if not group.items:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_GROUP_IS_EMPTY)
    for gpu_id in group.items:
        engine.check_watchable(gpu_id, field_group.items)
    for gpu_id in group.items:
        for field_id in field_group.items:
            engine.watches[(gpu_id, field_id)] = (dcgm_handle.value or 0, updateFreq)
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmEntityGetLatestValues(
    dcgmHandle: ctypes.c_void_p, entityGroup: int, entityId: int, fieldIds: Sequence[int]
) -> ctypes.Array[dcgm_structs.c_dcgmFieldValue_v1]:
    engine = _engine(dcgmHandle)
    if entityGroup != dcgm_fields.DCGM_FE_GPU:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_NOT_SUPPORTED)
    if _gpu(engine, entityId).lost:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_GPU_IS_LOST)
    values = (dcgm_structs.c_dcgmFieldValue_v1 * len(fieldIds))()
    for value, field_id in zip(values, fieldIds, strict=True):
        is_int = field_id in dcgm_fields.INT64_PROFILING_FIELDS
        value.version = dcgm_structs.dcgmFieldValue_version1
        value.fieldId = field_id
        value.fieldType = ord(dcgm_fields.DCGM_FT_INT64 if is_int else dcgm_fields.DCGM_FT_DOUBLE)
        sample = engine.samples.get((entityId, field_id))
        if sample is None:  # DCGM keeps serving old samples of a field no longer watched
            watched = (entityId, field_id) in engine.watches
            value.status = dcgm_structs.DCGM_ST_NO_DATA if watched else dcgm_structs.DCGM_ST_NOT_WATCHED
            if is_int:
                value.value.i64 = dcgmvalue.DCGM_INT64_BLANK
            else:
                value.value.dbl = dcgmvalue.DCGM_FP64_BLANK
            continue
        value.status = dcgm_structs.DCGM_ST_OK
        value.ts = sample[0]
        if is_int:
            value.value.i64 = int(sample[1])
        else:
            value.value.dbl = float(sample[1])
    return values


def _profiling_control(dcgmHandle: ctypes.c_void_p, paused: bool) -> int:
    engine = _engine(dcgmHandle)
    if any(gpu.gpm for gpu in engine.gpus):
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_NOT_SUPPORTED)
    engine.paused = paused
    return dcgm_structs.DCGM_ST_OK


@ensure_byte_strings()
def dcgmProfPause(dcgmHandle: ctypes.c_void_p) -> int:
    return _profiling_control(dcgmHandle, paused=True)


@ensure_byte_strings()
def dcgmProfResume(dcgmHandle: ctypes.c_void_p) -> int:
    return _profiling_control(dcgmHandle, paused=False)
