"""Test double of DCGM's ``dcgm_structs`` (written for smlens, not NVIDIA's code).

It behaves as NVIDIA's module does where smlens can tell (checked against NVIDIA/DCGM
``testing/python3/dcgm_structs.py`` at v3.1.8, v3.3.9, v4.5.3 and v4.6.0, see docs/dcgm.md):

* every ``DCGM_ST_*`` return code with DCGM's number; ``DCGMError(code)`` builds the subclass of that
  code (``DCGMError_Timeout`` for ``DCGM_ST_TIMEOUT``...), with ``value`` holding the code;
* structures whose ``char[]`` members read back as ``str`` and accept ``str`` (NVIDIA's
  ``_DcgmStructure.__getattribute__``/``__setattr__``), with DCGM's C layouts, so that the version
  constants (``MAKE_DCGM_VERSION``: size | version << 24) come out equal to DCGM's;
* ``_dcgmInit`` loads "libdcgm" (here the stub library of ``fakes.dcgm_hostengine``) and calls go to
  it through ``_dcgmGetFunctionPointer``, as NVIDIA's bindings go to ``libdcgm.so``.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char, c_double, c_int, c_int64, c_short, c_uint, c_uint16, c_uint32, c_ushort, c_void_p
from typing import Any

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_CLOCKS = 256
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_MAX_NUM_GROUPS = 64
DCGM_MAX_NUM_FIELD_GROUPS = 64
DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP = 128
DCGM_PROF_MAX_NUM_GROUPS_V2 = 10
DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2 = 64

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2
DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1

# Return codes (dcgm_structs.h, dcgmReturn_t); -2 is unused.
DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_PENDING = -9
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_RESET_REQUIRED = -19
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_GROUP_INCOMPATIBLE = -23
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_GPU_IN_SYNC_BOOST_GROUP = -27
DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP = -28
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_NVVS_ERROR = -30
DCGM_ST_INSUFFICIENT_SIZE = -31
DCGM_ST_FIELD_UNSUPPORTED_BY_API = -32
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38


class DCGMError(Exception):
    """What every binding call raises for a code other than DCGM_ST_OK; ``value`` is the code and
    ``DCGMError(code)`` is an instance of that code's own subclass."""

    _by_code: dict[int, type[DCGMError]] = {}  # noqa: RUF012 - filled once below
    _code: int | None = None  # a subclass's own code: DCGMError_Timeout() needs no argument

    value: int
    info: Any

    def __new__(cls, value: int | None = None) -> DCGMError:
        code = cls._code if value is None else value
        if code is None:
            raise TypeError("DCGMError needs a DCGM_ST_* code")
        if cls is DCGMError:
            cls = DCGMError._by_code.get(code, DCGMError)
        error = Exception.__new__(cls)
        error.value, error.info = code, None
        return error

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _errorString(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DCGMError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _class_name(code_name: str) -> str:
    return "DCGMError_" + "".join(word.capitalize() for word in code_name.split("_"))


for _name, _code in list(globals().items()):
    if not _name.startswith("DCGM_ST_") or _code == DCGM_ST_OK:
        continue
    _cls = type(_class_name(_name.removeprefix("DCGM_ST_")), (DCGMError,), {"_code": _code})
    globals()[_cls.__name__] = _cls
    DCGMError._by_code[_code] = _cls


def dcgmExceptionClass(error_code: int) -> type[DCGMError] | None:
    return DCGMError._by_code.get(error_code)


# -- the library --------------------------------------------------------------------------------------

dcgmLib: Any = None


def _dcgmInit(libDcgmPath: str | None = None) -> None:
    """Load libdcgm once; the double's "system" library is the stub of ``fakes.dcgm_hostengine``."""
    global dcgmLib
    if dcgmLib is None:
        from fakes import dcgm_hostengine

        if not dcgm_hostengine.REGISTRY.library_present:
            _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)
        dcgmLib = dcgm_hostengine.LIBDCGM


def _dcgmGetFunctionPointer(name: str) -> Any:
    if dcgmLib is None:
        raise DCGMError(DCGM_ST_UNINITIALIZED)
    try:
        return getattr(dcgmLib, name)
    except AttributeError:
        raise DCGMError(DCGM_ST_FUNCTION_NOT_FOUND) from None


def _dcgmCheckReturn(ret: int) -> int:
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _errorString(code: int) -> str:
    try:
        fn = _dcgmGetFunctionPointer("dcgmErrorString")
        fn.restype = ctypes.c_char_p
        text = fn(code)
    except DCGMError:
        text = None
    return text.decode() if text else f"DCGM Error with code {code}"


# -- structures ---------------------------------------------------------------------------------------


def _to_c(value: Any) -> Any:
    return value.encode("utf-8") if isinstance(value, str) else value


class _DcgmStructure(ctypes.Structure):
    """char arrays read back as str; str may be assigned to them (as in NVIDIA's bindings)."""

    def __getattribute__(self, key: str) -> Any:
        value = super().__getattribute__(key)
        return value.decode("utf-8") if isinstance(value, bytes) else value

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, _to_c(value))


class DcgmUnion(ctypes.Union):
    def __getattribute__(self, key: str) -> Any:
        value = super().__getattribute__(key)
        return value.decode("utf-8") if isinstance(value, bytes) else value

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, _to_c(value))


class _PrintableStructure(_DcgmStructure):
    def __str__(self) -> str:
        members = ", ".join(f"{name}: {getattr(self, name)}" for name, *_ in self._fields_)
        return f"{type(self).__name__}({members})"


def make_dcgm_version(struct: type[ctypes.Structure], version: int) -> int:
    return ctypes.sizeof(struct) | (version << 24)


def _chars(length: int = DCGM_MAX_STR_LENGTH) -> type[ctypes.Array[c_char]]:
    return c_char * length


class c_dcgmConnectV2Params_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("persistAfterDisconnect", c_uint),
        ("timeoutMs", c_uint),
        ("addressIsUnixSocket", c_uint),
    ]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmClockSet_v1(_PrintableStructure):
    _fields_ = [("version", c_uint), ("memClock", c_uint), ("smClock", c_uint)]


class c_dcgmDeviceSupportedClockSets_v1(_PrintableStructure):
    _fields_ = [("version", c_uint), ("count", c_uint), ("clockSet", c_dcgmClockSet_v1 * DCGM_MAX_CLOCKS)]


class c_dcgmDeviceThermals_v1(_PrintableStructure):
    _fields_ = [("version", c_uint), ("slowdownTemp", c_uint), ("shutdownTemp", c_uint)]


class c_dcgmDevicePowerLimits_v1(_PrintableStructure):
    _fields_ = [
        (name, c_uint)
        for name in (
            "version",
            "curPowerLimit",
            "defaultPowerLimit",
            "enforcedPowerLimit",
            "minPowerLimit",
            "maxPowerLimit",
        )
    ]


class c_dcgmDeviceIdentifiers_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        *((name, _chars()) for name in ("brandName", "deviceName", "pciBusId", "serial", "uuid", "vbios")),
        ("inforomImageVersion", _chars()),
        ("pciDeviceId", c_uint32),
        ("pciSubSystemId", c_uint32),
        ("driverVersion", _chars()),
        ("virtualizationMode", c_uint32),
    ]


class c_dcgmDeviceMemoryUsage_v1(_PrintableStructure):
    _fields_ = [(name, c_uint) for name in ("version", "bar1Total", "fbTotal", "fbUsed", "fbFree")]


class c_dcgmDeviceSettings_v2(_PrintableStructure):
    _fields_ = [
        (name, c_uint)
        for name in ("version", "persistenceModeEnabled", "migModeEnabled", "confidentialComputeMode")
    ]


class c_dcgmDeviceAttributes_v3(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("clockSets", c_dcgmDeviceSupportedClockSets_v1),
        ("thermalSettings", c_dcgmDeviceThermals_v1),
        ("powerLimits", c_dcgmDevicePowerLimits_v1),
        ("identifiers", c_dcgmDeviceIdentifiers_v1),
        ("memoryUsage", c_dcgmDeviceMemoryUsage_v1),
        ("settings", c_dcgmDeviceSettings_v2),
    ]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmFieldValue_v1_value(DcgmUnion):
    _fields_ = [
        ("i64", c_int64),
        ("dbl", c_double),
        ("str", _chars()),
        ("blob", ctypes.c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("fieldId", c_ushort),
        ("fieldType", c_short),
        ("status", c_int),
        ("ts", c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)


class c_dcgmFieldGroupInfo_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("numFieldIds", c_uint32),
        ("fieldGroupId", c_void_p),
        ("fieldGroupName", _chars()),
        ("fieldIds", c_uint16 * DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP),
    ]


dcgmFieldGroupInfo_version1 = make_dcgm_version(c_dcgmFieldGroupInfo_v1, 1)


class c_dcgmAllFieldGroup_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("numFieldGroups", c_uint32),
        ("fieldGroups", c_dcgmFieldGroupInfo_v1 * DCGM_MAX_NUM_FIELD_GROUPS),
    ]


dcgmAllFieldGroup_version1 = make_dcgm_version(c_dcgmAllFieldGroup_v1, 1)


class c_dcgmProfMetricGroupInfo_v2(_PrintableStructure):
    _fields_ = [
        ("majorId", c_ushort),
        ("minorId", c_ushort),
        ("numFieldIds", c_uint32),
        ("fieldIds", c_ushort * DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2),
    ]


class c_dcgmProfGetMetricGroups_v3(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("unused", c_uint32),
        ("gpuId", c_uint32),
        ("numMetricGroups", c_uint32),
        ("metricGroups", c_dcgmProfMetricGroupInfo_v2 * DCGM_PROF_MAX_NUM_GROUPS_V2),
    ]


dcgmProfGetMetricGroups_version3 = make_dcgm_version(c_dcgmProfGetMetricGroups_v3, 3)


# -- MIG: the GPU instance hierarchy (dcgm_structs.h dcgmMigHierarchy_v2; Python names as NVIDIA's) -----

DCGM_MAX_INSTANCES_PER_GPU = 8
DCGM_MAX_TOTAL_INSTANCES = 14  # GPU instances plus compute instances of one GPU
DCGM_MAX_HIERARCHY_INFO = DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES


class c_dcgmGroupEntityPair_t(_PrintableStructure):
    _fields_ = [("entityGroupId", c_uint32), ("entityId", c_uint32)]


class c_dcgmMigEntityInfo_t(_PrintableStructure):
    _fields_ = [
        ("gpuUuid", _chars(128)),
        ("nvmlGpuIndex", c_uint),
        ("nvmlInstanceId", c_uint),
        ("nvmlComputeInstanceId", c_uint),
        ("nvmlMigProfileId", c_uint),
        ("nvmlProfileSlices", c_uint),
    ]


class c_dcgmMigHierarchyInfo_v2(_PrintableStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("parent", c_dcgmGroupEntityPair_t),
        ("info", c_dcgmMigEntityInfo_t),
    ]


class c_dcgmMigHierarchy_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("count", c_uint),
        ("entityList", c_dcgmMigHierarchyInfo_v2 * DCGM_MAX_HIERARCHY_INFO),
    ]


c_dcgmMigHierarchy_version2 = make_dcgm_version(c_dcgmMigHierarchy_v2, 2)
