"""Test double of DCGM's ``dcgm_structs``: the return codes, constants, ctypes structures and the
``DCGMError`` hierarchy that smlens touches, with DCGM's own names and values (DCGM 3.x and 4.x agree
on all of them). Structures keep DCGM's field layout; where smlens reads only one member of a big
structure (device attributes), only that member is modelled."""

from __future__ import annotations

import ctypes
from ctypes import c_char, c_double, c_int, c_int64, c_short, c_uint, c_uint32, c_ushort

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_NO_DATA = -14
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_MULTI_PASS = -38

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2
DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_PROF_MAX_NUM_GROUPS_V2 = 10
DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2 = 64

_MESSAGES = {
    DCGM_ST_BADPARAM: "Bad parameter passed to function",
    DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_INIT_ERROR: "DCGM initialization error",
    DCGM_ST_UNINITIALIZED: "Object is in an undefined state",
    DCGM_ST_NO_DATA: "No data is available",
    DCGM_ST_NOT_WATCHED: "Field is not being updated",
    DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
    DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
    DCGM_ST_REQUIRES_ROOT: "This operation is not supported when the host engine is running as non root",
    DCGM_ST_MODULE_NOT_LOADED: "This request is serviced by a module of DCGM that is not currently loaded",
    DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
    DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
}


class DCGMError(Exception):
    """Raised by every binding call whose return code is not DCGM_ST_OK; ``value`` is that code.
    As in DCGM, each code has its own subclass (``dcgmExceptionClass``)."""

    by_code: dict[int, type[DCGMError]] = {}  # noqa: RUF012 - filled once below

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"DCGM error {self.value}")


def _camel(code_name: str) -> str:
    return "DCGMError_" + "".join(part.capitalize() for part in code_name.removeprefix("DCGM_ST_").split("_"))


for _name, _code in list(globals().items()):
    if _name.startswith("DCGM_ST_") and _code != DCGM_ST_OK:
        _cls = type(_camel(_name), (DCGMError,), {})
        globals()[_cls.__name__] = _cls
        DCGMError.by_code[_code] = _cls


def dcgmExceptionClass(error_code: int) -> type[DCGMError] | None:
    return DCGMError.by_code.get(error_code)


def _dcgmCheckReturn(ret: int) -> int:
    if ret != DCGM_ST_OK:
        raise DCGMError.by_code.get(ret, DCGMError)(ret)
    return ret


def _dcgmInit(libDcgmPath: str | None = None) -> None:
    """Loads libdcgm in DCGM; here it fails when the test says the library is absent."""
    import dcgm_fake_engine

    if not dcgm_fake_engine.REGISTRY.library_present:
        _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)
    dcgm_fake_engine.REGISTRY.library_loaded = True


def make_dcgm_version(struct: type[ctypes.Structure], version: int) -> int:
    return ctypes.sizeof(struct) | (version << 24)


class c_dcgmConnectV2Params_v2(ctypes.Structure):
    _fields_ = [
        ("version", c_uint),
        ("persistAfterDisconnect", c_uint),
        ("timeoutMs", c_uint),
        ("addressIsUnixSocket", c_uint),
    ]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmDeviceIdentifiers_v1(ctypes.Structure):
    _fields_ = [
        ("version", c_uint),
        ("brandName", c_char * DCGM_MAX_STR_LENGTH),
        ("deviceName", c_char * DCGM_MAX_STR_LENGTH),
        ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
        ("serial", c_char * DCGM_MAX_STR_LENGTH),
        ("uuid", c_char * DCGM_MAX_STR_LENGTH),
        ("vbios", c_char * DCGM_MAX_STR_LENGTH),
        ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("pciDeviceId", c_uint32),
        ("pciSubSystemId", c_uint32),
        ("driverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("virtualizationMode", c_uint32),
    ]


class c_dcgmDeviceAttributes_v3(ctypes.Structure):
    # DCGM's structure also holds clock sets, thermals, power limits, memory usage and settings.
    _fields_ = [
        ("version", c_uint),
        ("identifiers", c_dcgmDeviceIdentifiers_v1),
    ]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmFieldValue_v1_value(ctypes.Union):
    _fields_ = [
        ("i64", c_int64),
        ("dbl", c_double),
        ("str", c_char * DCGM_MAX_STR_LENGTH),
        ("blob", ctypes.c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v1(ctypes.Structure):
    _fields_ = [
        ("version", c_uint),
        ("fieldId", c_ushort),
        ("fieldType", c_short),
        ("status", c_int),
        ("ts", c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)


class c_dcgmProfMetricGroupInfo_v2(ctypes.Structure):
    _fields_ = [
        ("majorId", c_ushort),
        ("minorId", c_ushort),
        ("numFieldIds", c_uint32),
        ("fieldIds", c_ushort * DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2),
    ]


class c_dcgmProfGetMetricGroups_v3(ctypes.Structure):
    _fields_ = [
        ("version", c_uint32),
        ("unused", c_uint32),
        ("gpuId", c_uint32),
        ("numMetricGroups", c_uint32),
        ("metricGroups", c_dcgmProfMetricGroupInfo_v2 * DCGM_PROF_MAX_NUM_GROUPS_V2),
    ]


dcgmProfGetMetricGroups_version3 = make_dcgm_version(c_dcgmProfGetMetricGroups_v3, 3)
