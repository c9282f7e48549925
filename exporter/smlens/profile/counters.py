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

import numpy as np

CUPTI_SM_ACTIVE = "sm__cycles_active.avg"
CUPTI_SM_ELAPSED = "sm__cycles_elapsed.avg"
CUPTI_WARPS_ACTIVE = "sm__warps_active.avg"
CUPTI_TENSOR_ACTIVE = "sm__pipe_tensor_cycles_active.avg"
CUPTI_DRAM_BYTES = "dram__bytes.sum"
CUPTI_DRAM_ELAPSED = "dram__cycles_elapsed.avg"
CUPTI_GR_ACTIVE = "gr__cycles_active.avg"
CUPTI_GR_ELAPSED = "gr__cycles_elapsed.avg"

COUNTERS = (
    CUPTI_SM_ACTIVE,
    CUPTI_SM_ELAPSED,
    CUPTI_WARPS_ACTIVE,
    CUPTI_TENSOR_ACTIVE,
    CUPTI_DRAM_BYTES,
    CUPTI_DRAM_ELAPSED,
    CUPTI_GR_ACTIVE,
    CUPTI_GR_ELAPSED,
)
# counter -> the sub-metric whose value is the counter's peak per elapsed cycle
PEAK_OF = {
    name: f"{name}.peak_sustained"
    for name in (CUPTI_SM_ACTIVE, CUPTI_WARPS_ACTIVE, CUPTI_TENSOR_ACTIVE, CUPTI_DRAM_BYTES, CUPTI_GR_ACTIVE)
}


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
KEYS = tuple(r.key for r in RATIOS)


def ratio(ratio: Ratio, columns: Mapping[str, np.ndarray], peaks: Mapping[str, float]) -> np.ndarray:
    """Each sample's ratio, clamped to 0..1; 0 where nothing elapsed (a sample the GPU did not clock)."""
    denominator = np.asarray(columns[ratio.elapsed], dtype=np.float64) * peaks[ratio.counter]
    numerator = np.asarray(columns[ratio.counter], dtype=np.float64)
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, np.clip(numerator / safe, 0.0, 1.0), 0.0)
