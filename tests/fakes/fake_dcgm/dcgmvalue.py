"""Test double of DCGM's ``dcgmvalue`` (written for smlens): the sentinels DCGM stores instead of a
value, per type, and the tests for them; values as in NVIDIA/DCGM ``testing/python3/dcgmvalue.py``
(v3.1.8 to v4.6.0 agree). A sentinel is BLANK plus 0 (blank), 1 (not found), 2 (not supported) or 3
(no permission); strings use ``<<<...>>>`` markers."""

from __future__ import annotations

DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2 ** 47
DCGM_STR_BLANK = "<<<NULL>>>"

DCGM_INT32_NOT_FOUND = DCGM_INT32_BLANK + 1
DCGM_INT64_NOT_FOUND = DCGM_INT64_BLANK + 1
DCGM_FP64_NOT_FOUND = DCGM_FP64_BLANK + 1.0
DCGM_STR_NOT_FOUND = "<<<NOT_FOUND>>>"

DCGM_INT32_NOT_SUPPORTED = DCGM_INT32_BLANK + 2
DCGM_INT64_NOT_SUPPORTED = DCGM_INT64_BLANK + 2
DCGM_FP64_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
DCGM_STR_NOT_SUPPORTED = "<<<NOT_SUPPORTED>>>"

DCGM_INT32_NOT_PERMISSIONED = DCGM_INT32_BLANK + 3
DCGM_INT64_NOT_PERMISSIONED = DCGM_INT64_BLANK + 3
DCGM_FP64_NOT_PERMISSIONED = DCGM_FP64_BLANK + 3.0
DCGM_STR_NOT_PERMISSIONED = "<<<NOT_PERM>>>"


def DCGM_INT32_IS_BLANK(val: int) -> bool:
    return val >= DCGM_INT32_BLANK


def DCGM_INT64_IS_BLANK(val: int) -> bool:
    return val >= DCGM_INT64_BLANK


def DCGM_FP64_IS_BLANK(val: float) -> bool:
    return val >= DCGM_FP64_BLANK


def DCGM_STR_IS_BLANK(val: str) -> bool:
    return val.startswith("<<<") and ">>>" in val
