"""Names that cross the boundary between backends, exporter, bundle, API and CLI, defined once.

This module imports nothing, so that every layer, the lowest included, can use it.
"""

from __future__ import annotations

# Labels of the per-GPU series, in the order the exporter writes them.
GPU = "gpu"
UUID = "uuid"
HOSTNAME = "hostname"
GPU_LABELS = (GPU, UUID, HOSTNAME)

# Labels a MIG GPU instance's series carry on top of GPU_LABELS.
GPU_INSTANCE = "gpu_instance"
MIG_PROFILE = "mig_profile"
MIG_UUID = "mig_uuid"
INSTANCE_LABELS = (*GPU_LABELS, GPU_INSTANCE, MIG_PROFILE, MIG_UUID)

# NVIDIA's Xid catalog ("Analyzing Xid Errors with the Xid Catalog",
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) lists the codes 1 to 172. Those
# keep their own xid label value; any other code (a later driver's, or garbage from a broken source)
# is counted under "other", so that a GPU has at most 173 XID series whatever its driver reports.
XID_CATALOG_LAST = 172
XID_OTHER = "other"


def xid_label(code: int) -> str:
    return str(code) if 1 <= code <= XID_CATALOG_LAST else XID_OTHER


# Labels naming the workload that holds a GPU (added to its series when one container holds it).
NAMESPACE = "namespace"
POD = "pod"
CONTAINER = "container"
OWNER_LABELS = (NAMESPACE, POD, CONTAINER)
SLURM_JOB = "slurm_job"

# Keys of Reading.activity: time-weighted ratios that the sampler integrates into *_seconds_total.
UTILIZATION = "utilization"  # NVML: share of time at least one kernel ran
SM_ACTIVE = "sm_active"
SM_OCCUPANCY = "sm_occupancy"
TENSOR_ACTIVE = "tensor_active"
DRAM_ACTIVE = "dram_active"
HMMA_ACTIVE = "hmma_active"
FP64_ACTIVE = "fp64_active"
FP32_ACTIVE = "fp32_active"
FP16_ACTIVE = "fp16_active"
PROFILING_ACTIVITIES = (
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    HMMA_ACTIVE,
    FP64_ACTIVE,
    FP32_ACTIVE,
    FP16_ACTIVE,
)
ACTIVITIES = (UTILIZATION, *PROFILING_ACTIVITIES)
INSTANCE_ACTIVITIES = (SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)  # read per MIG GPU instance

# Keys of Reading.gauges (base units).
MEMORY_USED_BYTES = "memory_used_bytes"
MEMORY_TOTAL_BYTES = "memory_total_bytes"
POWER_WATTS = "power_watts"
POWER_LIMIT_WATTS = "power_limit_watts"
TEMPERATURE_CELSIUS = "temperature_celsius"
MEMORY_TEMPERATURE_CELSIUS = "memory_temperature_celsius"
SM_CLOCK_HERTZ = "sm_clock_hertz"
MEMORY_CLOCK_HERTZ = "memory_clock_hertz"
SM_CLOCK_MAX_HERTZ = "sm_clock_max_hertz"

# Keys of Reading.totals: counters the device keeps itself (monotonic until a driver reload).
ENERGY_JOULES = "energy_joules"
ECC_CORRECTED = "ecc_corrected_errors"
ECC_UNCORRECTED = "ecc_uncorrected_errors"
PCIE_REPLAYS = "pcie_replays"

# Keys of Reading.increments: amounts smlens accumulates into its own counters.
PCIE_TX_BYTES = "pcie_tx_bytes"
PCIE_RX_BYTES = "pcie_rx_bytes"
NVLINK_TX_BYTES = "nvlink_tx_bytes"
NVLINK_RX_BYTES = "nvlink_rx_bytes"

# Most GPUs of a simulated node (--sim-gpus and scenario files alike): a simulated node stays node-sized.
MAX_SIM_GPUS = 64

# A snapshot older than this many sampling intervals is stale. /-/ready fails past the larger of that and
# STALE_MIN_SECONDS; the SmlensSamplingStalled alert has no floor (its `for:` gives the slack instead).
STALE_INTERVALS = 3
STALE_MIN_SECONDS = 5.0

# Verdict codes (``verdict.code`` in /api/v1/gpus and `smlens check --json`).
VERDICT_UNKNOWN = "unknown"
VERDICT_DOWN = "down"
VERDICT_IDLE = "idle"
VERDICT_NO_PROFILING = "no_profiling"
VERDICT_SM_UNDERUSED = "sm_underused"
VERDICT_HOLLOW = "hollow"
VERDICT_MEMORY_BOUND = "memory_bound"
VERDICT_LOW_OCCUPANCY = "low_occupancy"
VERDICT_WORKING = "working"
VERDICT_PARTIAL = "partial"
VERDICT_CODES = (
    VERDICT_UNKNOWN,
    VERDICT_DOWN,
    VERDICT_IDLE,
    VERDICT_NO_PROFILING,
    VERDICT_SM_UNDERUSED,
    VERDICT_HOLLOW,
    VERDICT_MEMORY_BOUND,
    VERDICT_LOW_OCCUPANCY,
    VERDICT_WORKING,
    VERDICT_PARTIAL,
)
