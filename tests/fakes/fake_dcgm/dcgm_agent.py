"""Test double of DCGM's ``dcgm_agent`` (written for smlens): the calls smlens makes, with the
signatures, return values and errors of NVIDIA/DCGM ``testing/python3/dcgm_agent.py`` (v3.1.8 to
v4.6.0). Like NVIDIA's, each call turns str arguments into UTF-8 bytes, calls the C entry point of
the loaded library (the stub of ``fakes.dcgm_hostengine``) and raises ``DCGMError`` for a code other
than DCGM_ST_OK."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from ctypes import byref, c_double, c_int32, c_int64, c_uint, c_uint16, c_void_p
from typing import Any, TypeVar

import dcgm_fields
import dcgm_structs

F = TypeVar("F", bound=Callable[..., Any])


def ensure_byte_strings() -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a.encode("utf-8") if isinstance(a, str) else a for a in args)
            kwargs = {k: v.encode("utf-8") if isinstance(v, str) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def _call(name: str, *args: Any) -> int:
    return dcgm_structs._dcgmCheckReturn(dcgm_structs._dcgmGetFunctionPointer(name)(*args))


S = TypeVar("S")


def _reply(name: str, handle: c_void_p, struct: type[S], version: int) -> S:
    """A call whose one argument besides the handle is a versioned structure it fills."""
    reply: Any = struct()
    reply.version = version
    _call(name, handle, byref(reply))
    return reply  # type: ignore[no-any-return]


@ensure_byte_strings()
def dcgmInit() -> int:
    return _call("dcgmInit")


@ensure_byte_strings()
def dcgmStartEmbedded(opMode: int) -> c_void_p:
    handle = c_void_p()
    _call("dcgmStartEmbedded", opMode, byref(handle))
    return handle


@ensure_byte_strings()
def dcgmStopEmbedded(dcgm_handle: c_void_p) -> int:
    return _call("dcgmStopEmbedded", dcgm_handle)


@ensure_byte_strings()
def dcgmConnect_v2(
    ip_address: bytes,
    connectParams: dcgm_structs.c_dcgmConnectV2Params_v2,
    version: int = dcgm_structs.c_dcgmConnectV2Params_version,
) -> c_void_p:
    connectParams.version = version
    handle = c_void_p()
    _call("dcgmConnect_v2", ip_address, byref(connectParams), byref(handle))
    return handle


@ensure_byte_strings()
def dcgmDisconnect(dcgm_handle: c_void_p) -> int:
    return _call("dcgmDisconnect", dcgm_handle)


@ensure_byte_strings()
def dcgmGetAllDevices(dcgm_handle: c_void_p) -> list[int]:
    ids = (c_uint * dcgm_structs.DCGM_MAX_NUM_DEVICES)()
    count = c_uint()
    _call("dcgmGetAllDevices", dcgm_handle, ids, byref(count))
    return list(ids[: count.value])


@ensure_byte_strings()
def dcgmGetDeviceAttributes(
    dcgm_handle: c_void_p, gpuId: int, version: int = dcgm_structs.dcgmDeviceAttributes_version3
) -> dcgm_structs.c_dcgmDeviceAttributes_v3:
    if version != dcgm_structs.dcgmDeviceAttributes_version3:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    attributes = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attributes.version = version
    _call("dcgmGetDeviceAttributes", dcgm_handle, gpuId, byref(attributes))
    return attributes


@ensure_byte_strings()
def dcgmGetGpuInstanceHierarchy(dcgm_handle: c_void_p) -> dcgm_structs.c_dcgmMigHierarchy_v2:
    return _reply(
        "dcgmGetGpuInstanceHierarchy",
        dcgm_handle,
        dcgm_structs.c_dcgmMigHierarchy_v2,
        dcgm_structs.c_dcgmMigHierarchy_version2,
    )


@ensure_byte_strings()
def dcgmProfGetSupportedMetricGroups(
    dcgmHandle: c_void_p, gpuId: int
) -> dcgm_structs.c_dcgmProfGetMetricGroups_v3:
    reply = dcgm_structs.c_dcgmProfGetMetricGroups_v3()
    reply.version = dcgm_structs.dcgmProfGetMetricGroups_version3
    reply.gpuId = gpuId
    _call("dcgmProfGetSupportedMetricGroups", dcgmHandle, byref(reply))
    return reply


@ensure_byte_strings()
def dcgmGroupCreate(dcgm_handle: c_void_p, type: int, groupName: bytes) -> c_void_p:
    group_id = c_void_p()
    _call("dcgmGroupCreate", dcgm_handle, type, groupName, byref(group_id))
    return group_id


@ensure_byte_strings()
def dcgmGroupDestroy(dcgm_handle: c_void_p, group_id: c_void_p) -> int:
    return _call("dcgmGroupDestroy", dcgm_handle, group_id)


@ensure_byte_strings()
def dcgmGroupAddDevice(dcgm_handle: c_void_p, group_id: c_void_p, gpu_id: int) -> int:
    return _call("dcgmGroupAddDevice", dcgm_handle, group_id, gpu_id)


@ensure_byte_strings()
def dcgmGroupAddEntity(dcgm_handle: c_void_p, group_id: c_void_p, entityGroupId: int, entityId: int) -> int:
    return _call("dcgmGroupAddEntity", dcgm_handle, group_id, entityGroupId, entityId)


@ensure_byte_strings()
def dcgmFieldGroupCreate(dcgm_handle: c_void_p, fieldIds: Sequence[int], fieldGroupName: bytes) -> c_void_p:
    field_group_id = c_void_p()
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    _call(
        "dcgmFieldGroupCreate",
        dcgm_handle,
        c_int32(len(fieldIds)),
        byref(ids),
        fieldGroupName,
        byref(field_group_id),
    )
    return field_group_id


@ensure_byte_strings()
def dcgmFieldGroupDestroy(dcgm_handle: c_void_p, fieldGroupId: c_void_p) -> int:
    return _call("dcgmFieldGroupDestroy", dcgm_handle, fieldGroupId)


@ensure_byte_strings()
def dcgmFieldGroupGetAll(dcgm_handle: c_void_p) -> dcgm_structs.c_dcgmAllFieldGroup_v1:
    return _reply(
        "dcgmFieldGroupGetAll",
        dcgm_handle,
        dcgm_structs.c_dcgmAllFieldGroup_v1,
        dcgm_structs.dcgmAllFieldGroup_version1,
    )


@ensure_byte_strings()
def dcgmWatchFields(
    dcgm_handle: c_void_p,
    groupId: c_void_p,
    fieldGroupId: c_void_p,
    updateFreq: int,
    maxKeepAge: float,
    maxKeepSamples: int,
) -> int:
    return _call(
        "dcgmWatchFields",
        dcgm_handle,
        groupId,
        fieldGroupId,
        c_int64(updateFreq),
        c_double(maxKeepAge),
        c_int32(maxKeepSamples),
    )


@ensure_byte_strings()
def dcgmUnwatchFields(dcgm_handle: c_void_p, groupId: c_void_p, fieldGroupId: c_void_p) -> int:
    return _call("dcgmUnwatchFields", dcgm_handle, groupId, fieldGroupId)


@ensure_byte_strings()
def dcgmEntityGetLatestValues(
    dcgmHandle: c_void_p, entityGroup: int, entityId: int, fieldIds: Sequence[int]
) -> Any:
    values = (dcgm_structs.c_dcgmFieldValue_v1 * len(fieldIds))()
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    _call(
        "dcgmEntityGetLatestValues",
        dcgmHandle,
        c_uint(entityGroup),
        dcgm_fields.c_dcgm_field_eid_t(entityId),
        ids,
        c_uint(len(fieldIds)),
        values,
    )
    return values


@ensure_byte_strings()
def dcgmProfPause(dcgmHandle: c_void_p) -> int:
    return _call("dcgmProfPause", dcgmHandle)


@ensure_byte_strings()
def dcgmProfResume(dcgmHandle: c_void_p) -> int:
    return _call("dcgmProfResume", dcgmHandle)
