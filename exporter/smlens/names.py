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
# What owns a workload's pods, as the accounting rules resolve it from kube-state-metrics (a Job, a
# JobSet, a Deployment...; the pod itself without kube-state-metrics; a Slurm job): never Prometheus' `job`.
OWNER_KIND = "owner_kind"
OWNER_NAME = "owner_name"
OWNER_KIND_POD = "Pod"
OWNER_KIND_SLURM_JOB = "SlurmJob"
# The label of gpu_verdict_seconds_total that names the verdict class its seconds were spent in.
VERDICT = "verdict"

# Keys of Reading.activity: time-weighted ratios that the sampler integrates into *_seconds_total.
UTILIZATION = "utilization"  # NVML: share of time at least one kernel ran
SM_ACTIVE = "sm_active"
SM_OCCUPANCY = "sm_occupancy"
TENSOR_ACTIVE = "tensor_active"
DRAM_ACTIVE = "dram_active"
# The tensor pipes, each a part of TENSOR_ACTIVE (any tensor).
HMMA_ACTIVE = "hmma_active"
IMMA_ACTIVE = "imma_active"
DFMA_ACTIVE = "dfma_active"
DMMA_ACTIVE = "dmma_active"
FP64_ACTIVE = "fp64_active"
FP32_ACTIVE = "fp32_active"
FP16_ACTIVE = "fp16_active"
INTEGER_ACTIVE = "integer_active"
PROFILING_ACTIVITIES = (
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    HMMA_ACTIVE,
    IMMA_ACTIVE,
    DFMA_ACTIVE,
    DMMA_ACTIVE,
    FP64_ACTIVE,
    FP32_ACTIVE,
    FP16_ACTIVE,
    INTEGER_ACTIVE,
)
ACTIVITIES = (UTILIZATION, *PROFILING_ACTIVITIES)
INSTANCE_ACTIVITIES = (SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)  # read per MIG GPU instance

# The compute pipes whose busiest one is a tick's compute speed of light (COMPUTE_SOL, an activity key
# the fold integrates, not one a backend reads): any tensor stands for HMMA, IMMA, DFMA and DMMA, its
# parts. A window's mean of it is not the largest of the pipes' window means, so it is integrated tick
# by tick.
COMPUTE_SOL_PIPES = (TENSOR_ACTIVE, FP64_ACTIVE, FP32_ACTIVE, FP16_ACTIVE, INTEGER_ACTIVE)
COMPUTE_SOL = "compute_sol"
# Label ``pipe`` of gpu_pipe_active_seconds_total: each pipe's value, by its activity key. Any tensor
# keeps its own family, gpu_tensor_active_seconds_total.
PIPE = "pipe"
PIPE_LABELS = (
    (HMMA_ACTIVE, "hmma"),
    (IMMA_ACTIVE, "imma"),
    (DFMA_ACTIVE, "dfma"),
    (DMMA_ACTIVE, "dmma"),
    (FP64_ACTIVE, "fp64"),
    (FP32_ACTIVE, "fp32"),
    (FP16_ACTIVE, "fp16"),
    (INTEGER_ACTIVE, "integer"),
)

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

# Clock-event reasons (label values of gpu_clock_event_active) that slow a GPU below what its workload
# asks for: the GPUClockSlowdown alert's. sw_power_cap is apart: under heavy load it is normal.
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")
POWER_CAP_REASON = "sw_power_cap"

# Memory in use above which a MIG instance counts as held by a workload: below a CUDA context's size,
# above what an instance without processes reports. The exporter's verdicts and the alerts share it.
MIG_HELD_MEMORY_BYTES = 128 * 1024 * 1024

# Most GPUs of a simulated node (--sim-gpus and scenario files alike): a simulated node stays node-sized.
MAX_SIM_GPUS = 64

# A snapshot older than this many sampling intervals is stale. /-/ready fails past the larger of that and
# STALE_MIN_SECONDS; the SmlensSamplingStalled alert has no floor (its `for:` gives the slack instead).
STALE_INTERVALS = 3
STALE_MIN_SECONDS = 5.0

# Verdict codes (``verdict.code`` in /api/v1/gpus and `smlens check --json`): what a GPU's window means
# say limits it (docs/metrics.md#verdicts says which workload gets which).
VERDICT_UNKNOWN = "unknown"
VERDICT_DOWN = "down"
VERDICT_IDLE = "idle"
VERDICT_IDLE_MEMORY_HELD = "idle_memory_held"
VERDICT_NO_PROFILING = "no_profiling"
VERDICT_HOLLOW = "hollow"
VERDICT_STALLED = "stalled"
VERDICT_MEMORY_BOUND = "memory_bound"
VERDICT_COMPUTE_BOUND = "compute_bound"
VERDICT_PARTIAL = "partial"
VERDICT_CODES = (
    VERDICT_UNKNOWN,
    VERDICT_DOWN,
    VERDICT_IDLE,
    VERDICT_IDLE_MEMORY_HELD,
    VERDICT_NO_PROFILING,
    VERDICT_HOLLOW,
    VERDICT_STALLED,
    VERDICT_MEMORY_BOUND,
    VERDICT_COMPUTE_BOUND,
    VERDICT_PARTIAL,
)
# Classes in which a GPU is held but does little: what the waste panels, their rankings and `smlens report`
# count as wasted; idle counts only while a workload holds the GPU (idle without one is spare capacity).
WASTED_VERDICTS = (VERDICT_HOLLOW, VERDICT_STALLED, VERDICT_IDLE_MEMORY_HELD)
WASTED_WHEN_HELD = (VERDICT_IDLE,)
WASTED_WORDS = (
    f"{' + '.join(WASTED_VERDICTS)} + {' + '.join(WASTED_WHEN_HELD)} while a workload holds the GPU"
)
# The name of each compute-SOL pipe in a compute-bound verdict (``verdict.pipe``, the label ``pipe``).
SOL_PIPE_NAMES = {TENSOR_ACTIVE: "tensor", **dict(PIPE_LABELS)}

# ---------------------------------------------------------------------------------------------------
# Metric names: every family smlens exports, defined once for the exposition, the rules and the
# dashboards. Counter families are named without ``_total``, which the exposition appends: PromQL
# reads them as f"{NAME}_total".
# ---------------------------------------------------------------------------------------------------

# Per GPU: identity and state.
GPU_INFO = "gpu_info"
GPU_UP = "gpu_up"
GPU_PROFILING_AVAILABLE = "gpu_profiling_available"
GPU_PROFILING_MODE = "gpu_profiling_mode"

# Per GPU: the last tick's ratios (gauges).
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO = "gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO = "gpu_tensor_active_ratio"
GPU_HMMA_ACTIVE_RATIO = "gpu_hmma_active_ratio"
GPU_DRAM_ACTIVE_RATIO = "gpu_dram_active_ratio"
GPU_FP64_ACTIVE_RATIO = "gpu_fp64_active_ratio"
GPU_FP32_ACTIVE_RATIO = "gpu_fp32_active_ratio"
GPU_FP16_ACTIVE_RATIO = "gpu_fp16_active_ratio"

# Per GPU: integrals of the ratios and the seconds they cover (counters), whose rates give exact means.
GPU_BUSY_SECONDS = "gpu_busy_seconds"
GPU_SM_ACTIVE_SECONDS = "gpu_sm_active_seconds"
GPU_SM_OCCUPANCY_SECONDS = "gpu_sm_occupancy_seconds"
GPU_TENSOR_ACTIVE_SECONDS = "gpu_tensor_active_seconds"
GPU_DRAM_ACTIVE_SECONDS = "gpu_dram_active_seconds"
GPU_PIPE_ACTIVE_SECONDS = "gpu_pipe_active_seconds"  # label PIPE
GPU_COMPUTE_SOL_SECONDS = "gpu_compute_sol_seconds"
GPU_UTILIZATION_SAMPLED_SECONDS = "gpu_utilization_sampled_seconds"
GPU_PROFILED_SECONDS = "gpu_profiled_seconds"

# Per GPU: plain gauges.
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes"
GPU_POWER_WATTS = "gpu_power_watts"
GPU_POWER_LIMIT_WATTS = "gpu_power_limit_watts"
GPU_TEMPERATURE_CELSIUS = "gpu_temperature_celsius"
GPU_MEMORY_TEMPERATURE_CELSIUS = "gpu_memory_temperature_celsius"
GPU_SM_CLOCK_HERTZ = "gpu_sm_clock_hertz"
GPU_MEMORY_CLOCK_HERTZ = "gpu_memory_clock_hertz"
GPU_SM_CLOCK_MAX_HERTZ = "gpu_sm_clock_max_hertz"
GPU_CLOCK_EVENT_ACTIVE = "gpu_clock_event_active"

# Per GPU: plain counters.
GPU_ENERGY_JOULES = "gpu_energy_joules"
GPU_PCIE_REPLAYS = "gpu_pcie_replays"
GPU_PCIE_TRANSMIT_BYTES = "gpu_pcie_transmit_bytes"
GPU_PCIE_RECEIVE_BYTES = "gpu_pcie_receive_bytes"
GPU_NVLINK_TRANSMIT_BYTES = "gpu_nvlink_transmit_bytes"
GPU_NVLINK_RECEIVE_BYTES = "gpu_nvlink_receive_bytes"
GPU_ECC_ERRORS = "gpu_ecc_errors"
GPU_XID_ERRORS = "gpu_xid_errors"

# Per MIG GPU instance. The twins of whole-GPU families take their name from mig_twin, so that an
# aggregation over a whole-GPU family never mixes a GPU with its own slices.


def mig_twin(name: str) -> str:
    """The per-instance twin of a whole-GPU name: gpu_x -> gpu_mig_x."""
    return "gpu_mig_" + name.removeprefix("gpu_")


GPU_MIG_INFO = mig_twin(GPU_INFO)
GPU_MIG_MEMORY_USED_BYTES = mig_twin(GPU_MEMORY_USED_BYTES)
GPU_MIG_MEMORY_TOTAL_BYTES = mig_twin(GPU_MEMORY_TOTAL_BYTES)
GPU_MIG_PROFILED_SECONDS = mig_twin(GPU_PROFILED_SECONDS)
GPU_MIG_SM_SHARE_RATIO = "gpu_mig_sm_share_ratio"

# Accounting: seconds per verdict class and owner, per GPU and MIG GPU instance (label VERDICT, the
# owner's labels, and gpu_instance/mig_profile for an instance).
GPU_VERDICT_SECONDS = "gpu_verdict_seconds"
VERDICT_SECONDS_LABELS = (*GPU_LABELS, GPU_INSTANCE, MIG_PROFILE, VERDICT, *OWNER_LABELS, SLURM_JOB)

# Attribution: who holds a GPU, and what its workloads' processes use.
GPU_ALLOCATION_INFO = "gpu_allocation_info"
GPU_WORKLOAD_PREFIX = "gpu_workload_"
GPU_WORKLOAD_MEMORY_USED_BYTES = "gpu_workload_memory_used_bytes"
GPU_WORKLOAD_UTILIZATION_RATIO = "gpu_workload_utilization_ratio"
GPU_WORKLOAD_PROCESSES = "gpu_workload_processes"
SMLENS_ATTRIBUTION_UP = "smlens_attribution_up"
SMLENS_ATTRIBUTION_REFRESH_DURATION_SECONDS = "smlens_attribution_refresh_duration_seconds"
SMLENS_ATTRIBUTION_REFRESH_TIMESTAMP_SECONDS = "smlens_attribution_refresh_timestamp_seconds"

# The exporter's own health.
SMLENS_BUILD_INFO = "smlens_build_info"
SMLENS_BACKEND_UP = "smlens_backend_up"
SMLENS_BACKEND_LAST_SAMPLE_DURATION_SECONDS = "smlens_backend_last_sample_duration_seconds"
SMLENS_BACKEND_SAMPLE_SECONDS = "smlens_backend_sample_seconds"
SMLENS_BACKEND_SAMPLES = "smlens_backend_samples"
SMLENS_BACKEND_ERRORS = "smlens_backend_errors"
SMLENS_TICK_DURATION_SECONDS = "smlens_tick_duration_seconds"
SMLENS_SAMPLER_CPU_SECONDS = "smlens_sampler_cpu_seconds"
SMLENS_SAMPLING_INTERVAL_SECONDS = "smlens_sampling_interval_seconds"
SMLENS_SNAPSHOT_TIMESTAMP_SECONDS = "smlens_snapshot_timestamp_seconds"
SMLENS_SNAPSHOT_AGE_SECONDS = "smlens_snapshot_age_seconds"  # per scrape: exposition/live.py
