"""Test double of DCGM's ``dcgm_fields`` (written for smlens): the field types, entity groups and
profiling field ids smlens uses, with DCGM's values (NVIDIA/DCGM ``testing/python3/dcgm_fields.py``;
names as in DCGM 3.x to 4.5, DCGM 4.6 renamed several profiling constants but kept the ids)."""

from __future__ import annotations

from ctypes import c_uint32

# Field types: one byte, compared with chr(fieldValue.fieldType).
DCGM_FT_BINARY = "b"
DCGM_FT_DOUBLE = "d"
DCGM_FT_INT64 = "i"
DCGM_FT_STRING = "s"
DCGM_FT_TIMESTAMP = "t"

DCGM_FE_NONE = 0
DCGM_FE_GPU = 1
DCGM_FE_VGPU = 2
DCGM_FE_SWITCH = 3
DCGM_FE_GPU_I = 4
DCGM_FE_GPU_CI = 5

c_dcgm_field_eid_t = c_uint32

DCGM_FI_PROF_GR_ENGINE_ACTIVE = 1001
DCGM_FI_PROF_SM_ACTIVE = 1002
DCGM_FI_PROF_SM_OCCUPANCY = 1003
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = 1004
DCGM_FI_PROF_DRAM_ACTIVE = 1005
DCGM_FI_PROF_PIPE_FP64_ACTIVE = 1006
DCGM_FI_PROF_PIPE_FP32_ACTIVE = 1007
DCGM_FI_PROF_PIPE_FP16_ACTIVE = 1008
DCGM_FI_PROF_PCIE_TX_BYTES = 1009
DCGM_FI_PROF_PCIE_RX_BYTES = 1010
DCGM_FI_PROF_NVLINK_TX_BYTES = 1011
DCGM_FI_PROF_NVLINK_RX_BYTES = 1012
DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE = 1013
DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE = 1014
DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE = 1015
DCGM_FI_PROF_PIPE_INT_ACTIVE = 1016
