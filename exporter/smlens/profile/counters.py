"""The PM sampling counters ``smlens profile`` records, and how each becomes a 0..1 ratio.

Every ratio divides a counter by its elapsed cycles times the counter's own peak per cycle, the
``<counter>.peak_sustained`` value CUPTI reports for the chip, recorded with each capture and never
assumed, because it differs between chips. Each ``CUPTI_*`` constant is a CUPTI metric name, prefixed so
that it is never taken for smlens' reading key of the same activity (:mod:`smlens.names`). This module
imports nothing of CUPTI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from smlens import names as n

CUPTI_SM_ACTIVE = "sm__cycles_active.avg"
CUPTI_SM_ELAPSED = "sm__cycles_elapsed.avg"
CUPTI_WARPS_ACTIVE = "sm__warps_active.avg"
CUPTI_TENSOR_ACTIVE = "sm__pipe_tensor_cycles_active.avg"
CUPTI_DRAM_BYTES = "dram__bytes.sum"
CUPTI_DRAM_ELAPSED = "dram__cycles_elapsed.avg"
CUPTI_GR_ACTIVE = "gr__cycles_active.avg"
CUPTI_GR_ELAPSED = "gr__cycles_elapsed.avg"
# The compute pipes besides tensor that PM sampling offers on Hopper (``ncu --query-metrics-collection
# pmsampling --chip gh100`` lists them; it lists no sm__pipe_fp32 or sm__pipe_fp16 cycles): the FMA pipes
# (FP32 FFMA/FMUL/FADD, and the FP16 and IMAD work they also run), the FP64 pipe and the ALU (integer and
# logic, FP32 compares).
CUPTI_FMA_ACTIVE = "sm__pipe_fma_cycles_active.avg"
CUPTI_FP64_ACTIVE = "sm__pipe_fp64_cycles_active.avg"
CUPTI_ALU_ACTIVE = "sm__pipe_alu_cycles_active.avg"
PIPE_COUNTERS = (CUPTI_FMA_ACTIVE, CUPTI_FP64_ACTIVE, CUPTI_ALU_ACTIVE)

# PM sampling takes one pass only, and on GH100 none of the three fits beside REQUIRED (docs/profile.md
# gives CUPTI's pass counts and the command that reads them), so a capture there holds REQUIRED alone.
# Where some fit, a capture keeps the most it can, FMA (FP32 and FP16 work) first, then ALU, then FP64
# (rare in ML work).
PIPE_PREFERENCE = (CUPTI_FMA_ACTIVE, CUPTI_ALU_ACTIVE, CUPTI_FP64_ACTIVE)

# What every recording holds; one made before the pipe counters were asked for, or on a GPU whose PM
# sampling cannot take them with these in one pass (GH100), lacks those alone.
REQUIRED = (
    CUPTI_SM_ACTIVE,
    CUPTI_SM_ELAPSED,
    CUPTI_WARPS_ACTIVE,
    CUPTI_TENSOR_ACTIVE,
    CUPTI_DRAM_BYTES,
    CUPTI_DRAM_ELAPSED,
    CUPTI_GR_ACTIVE,
    CUPTI_GR_ELAPSED,
)
COUNTERS = (*REQUIRED, *PIPE_COUNTERS)  # what a capture asks CUPTI for
# counter -> the sub-metric whose value is the counter's peak per elapsed cycle
PEAK_OF = {
    name: f"{name}.peak_sustained"
    for name in (
        CUPTI_SM_ACTIVE,
        CUPTI_WARPS_ACTIVE,
        CUPTI_TENSOR_ACTIVE,
        CUPTI_DRAM_BYTES,
        CUPTI_GR_ACTIVE,
        *PIPE_COUNTERS,
    )
}


def pipe_choices() -> list[tuple[str, ...]]:
    """The sets of pipe counters a capture tries beside REQUIRED, best first: all of them, then fewer, in
    PIPE_PREFERENCE order (each set in PIPE_COUNTERS order), then none."""
    rank = {c: i for i, c in enumerate(PIPE_PREFERENCE)}
    subsets = [s for k in range(len(PIPE_COUNTERS), -1, -1) for s in combinations(PIPE_COUNTERS, k)]
    return sorted(subsets, key=lambda s: (-len(s), sorted(rank[c] for c in s)))


@dataclass(frozen=True)
class Ratio:
    """One 0..1 series: ``counter / (elapsed x peak)``."""

    key: str
    title: str
    counter: str
    elapsed: str


# `busy` is the share of the sample's time the graphics/compute engine had work (a kernel was running):
# the sub-millisecond analogue of NVML's utilization.
RATIOS = (
    Ratio("busy", "kernel running (GR engine active)", CUPTI_GR_ACTIVE, CUPTI_GR_ELAPSED),
    Ratio("sm_active", "SM active", CUPTI_SM_ACTIVE, CUPTI_SM_ELAPSED),
    Ratio("occupancy", "SM occupancy (warps active / max)", CUPTI_WARPS_ACTIVE, CUPTI_SM_ELAPSED),
    Ratio("tensor", "tensor pipes active", CUPTI_TENSOR_ACTIVE, CUPTI_SM_ELAPSED),
    Ratio("dram", "DRAM bandwidth used", CUPTI_DRAM_BYTES, CUPTI_DRAM_ELAPSED),
)
# Each compute pipe's activity, by the key of smlens' reading of the same pipe (names.COMPUTE_SOL_PIPES):
# the verdict's compute speed of light is the busiest of them. FP16 has no cycles counter of its own here:
# its work shows on the FMA pipes.
PIPE_RATIOS = (
    Ratio(n.FP32_ACTIVE, "FP32 (FMA) pipes active", CUPTI_FMA_ACTIVE, CUPTI_SM_ELAPSED),
    Ratio(n.FP64_ACTIVE, "FP64 pipe active", CUPTI_FP64_ACTIVE, CUPTI_SM_ELAPSED),
    Ratio(n.INTEGER_ACTIVE, "integer (ALU) pipe active", CUPTI_ALU_ACTIVE, CUPTI_SM_ELAPSED),
)
PIPE_OF = {"tensor": n.TENSOR_ACTIVE, **{r.key: r.key for r in PIPE_RATIOS}}  # series key -> pipe key
KEYS = tuple(r.key for r in RATIOS)


def ratio(ratio: Ratio, columns: Mapping[str, np.ndarray], peaks: Mapping[str, float]) -> np.ndarray:
    """Each sample's ratio, clamped to 0..1; 0 where nothing elapsed (a sample the GPU did not clock)."""
    denominator = np.asarray(columns[ratio.elapsed], dtype=np.float64) * peaks[ratio.counter]
    numerator = np.asarray(columns[ratio.counter], dtype=np.float64)
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, np.clip(numerator / safe, 0.0, 1.0), 0.0)
