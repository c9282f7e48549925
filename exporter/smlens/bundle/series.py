"""The series contract: which of the exporter's series the bundle reads, and how its means are made.

Every mean is a ratio of counter rates (``gpu_*_seconds_total`` over their coverage counters): the
counters are smlens' (:mod:`smlens.names`), or the dcgm-exporter mapping's stand-ins for them
(:mod:`smlens.bundle.dcgm_exporter`). Nothing here depends on how the rules lay them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from smlens import names as n


@dataclass(frozen=True)
class Mean:
    """A time-weighted mean: ``numerator`` seconds over ``denominator`` seconds (counter names, no
    _total); ``metric`` is its part of the recorded series' names."""

    metric: str
    numerator: str
    denominator: str


UTILIZATION_MEAN = Mean("gpu_utilization", n.GPU_BUSY_SECONDS, n.GPU_UTILIZATION_SAMPLED_SECONDS)
SM_ACTIVE_MEAN = Mean("gpu_sm_active", n.GPU_SM_ACTIVE_SECONDS, n.GPU_PROFILED_SECONDS)
SM_OCCUPANCY_MEAN = Mean("gpu_sm_occupancy", n.GPU_SM_OCCUPANCY_SECONDS, n.GPU_PROFILED_SECONDS)
TENSOR_ACTIVE_MEAN = Mean("gpu_tensor_active", n.GPU_TENSOR_ACTIVE_SECONDS, n.GPU_PROFILED_SECONDS)
DRAM_ACTIVE_MEAN = Mean("gpu_dram_active", n.GPU_DRAM_ACTIVE_SECONDS, n.GPU_PROFILED_SECONDS)
MEANS = (UTILIZATION_MEAN, SM_ACTIVE_MEAN, SM_OCCUPANCY_MEAN, TENSOR_ACTIVE_MEAN, DRAM_ACTIVE_MEAN)
# DRAM activity is the memory speed of light; the compute speed of light (the busiest compute pipe, tick by
# tick) has a mean of its own over the profiled seconds of the GPUs that report it (layers.COMPUTE_SOL).
MEMORY_SOL_MEAN = DRAM_ACTIVE_MEAN
COUNTERS = (
    *dict.fromkeys(c for mean in MEANS for c in (mean.numerator, mean.denominator)),
    n.GPU_COMPUTE_SOL_SECONDS,
)

# MIG GPU instances have the GPM means only: NVML gives an instance no utilization.
INSTANCE_MEASURED = (SM_ACTIVE_MEAN, SM_OCCUPANCY_MEAN, TENSOR_ACTIVE_MEAN, DRAM_ACTIVE_MEAN)
INSTANCE_MEANS = tuple(
    Mean(n.mig_twin(mean.metric), n.mig_twin(mean.numerator), n.GPU_MIG_PROFILED_SECONDS)
    for mean in INSTANCE_MEASURED
)

# The `exporter` label of the series that dcgm_exporter.py maps from dcgm-exporter; smlens' own have none.
DCGM_EXPORTER = "dcgm-exporter"

# XIDs that point at the GPU, its memory or its links rather than at the application (NVIDIA's XID
# catalogue): double-bit ECC, row remapping, NVLink, fell off the bus, contained/uncontained ECC, GSP.
HARDWARE_XIDS = ("48", "63", "64", "74", "79", "94", "95", "119", "120")
