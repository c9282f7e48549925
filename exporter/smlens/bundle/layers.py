"""The recorded layers and the names of their series: what the recording rules write and the alerts,
the dashboards and the dcgm-exporter mapping read.

Every aggregate sums numerators and denominators separately before dividing: a node's SM activity is
the SM-active GPU-seconds of its GPUs over their profiled GPU-seconds, never a mean of per-GPU ratios.
Recorded names follow ``level:metric:operations``; the window of the means is part of the name.
"""

from __future__ import annotations

from dataclasses import dataclass

from smlens import names as n
from smlens.bundle.series import COUNTERS, SM_ACTIVE_MEAN, Mean

# The per-GPU level keeps a GPU's labels and its owner's (hostname first, as people read them).
GPU_LEVEL_LABELS = (n.HOSTNAME, n.GPU, n.UUID, *n.OWNER_LABELS)


@dataclass(frozen=True)
class Level:
    """A layer of recorded series: its name, the labels it keeps besides the cluster label, the layer
    it sums (None: the raw counters), whether it keeps the cluster label, and which of its series get
    ratios (aggregate buckets of GPUs no workload holds are summed upwards but get no ratio)."""

    name: str
    labels: tuple[str, ...]
    below: Level | None
    clustered: bool = True
    ratio_selector: str = ""


GPU = Level("gpu", GPU_LEVEL_LABELS, None)
HOSTNAME = Level("hostname", (n.HOSTNAME,), GPU)
NAMESPACE_POD = Level("namespace_pod", (n.NAMESPACE, n.POD), GPU, ratio_selector='{pod!=""}')
NAMESPACE = Level("namespace", (n.NAMESPACE,), NAMESPACE_POD, ratio_selector='{namespace!=""}')
CLUSTER = Level("cluster", (), HOSTNAME)
FLEET = Level("fleet", (), CLUSTER, clustered=False)
AGGREGATES = (HOSTNAME, NAMESPACE_POD, NAMESPACE, CLUSTER, FLEET)
# Layers that count GPUs by state: the node layer counts per-GPU series, the others sum the counts.
COUNTED = (HOSTNAME, CLUSTER, FLEET)
# MIG GPU instances: their own layer, beside the GPU's. An instance's series keep the parent GPU's
# labels, the instance's and its owner's.
INSTANCE = Level(
    "gpu_instance",
    (n.HOSTNAME, n.GPU, n.UUID, n.GPU_INSTANCE, n.MIG_PROFILE, n.MIG_UUID, *n.OWNER_LABELS),
    None,
)


def level_labels(level: Level, cluster: str) -> tuple[str, ...]:
    """The labels a layer's series carry, the cluster label first."""
    return (cluster, *level.labels) if level.clustered else level.labels


# Busy seconds of the GPUs that have SM data: the denominator of SM efficiency at every layer.
PROFILED_BUSY = "gpu_profiled_busy_seconds"
HOLLOW = "gpu_busy_but_hollow_seconds"
# What every aggregate layer sums from the layer below.
SUMMED = (*COUNTERS, PROFILED_BUSY, HOLLOW)
EFFICIENCY = Mean("gpu_sm_efficiency", SM_ACTIVE_MEAN.numerator, PROFILED_BUSY)
GPU_STATES = ("busy", "working", "hollow")
UNPROFILED_COUNT = "gpus_unprofiled:count"

# GPU lists of the dashboards: per cluster, the GPUs with the largest gap between utilization and SM
# active (the fleet scatter's points) and the hollow ones among them (the fleet table's rows); per
# pod, its GPUs with the largest gap (the workload dashboard's table).
TOP_GPUS = 20
TOP_POINTS = 200


def sum_name(level: Level, summed: str, window: str) -> str:
    """A layer's GPU-seconds per second of a counter (or of the busy-profiled and hollow seconds)."""
    return f"{level.name}:{summed}:rate{window}"


def rate_name(counter: str, window: str) -> str:
    """Per-GPU rate of a counter (GPU-seconds per second)."""
    return sum_name(GPU, counter, window)


def mean_name(level: Level, mean: Mean, window: str) -> str:
    return f"{level.name}:{mean.metric}:ratio_rate{window}"


def efficiency_name(level: Level, window: str) -> str:
    """SM-active GPU-seconds per busy GPU-second (GPUs with SM data only)."""
    return mean_name(level, EFFICIENCY, window)


def hollow_name(level: Level, window: str) -> str:
    """GPU-seconds per second spent busy but hollow (judged on the per-GPU window means)."""
    return sum_name(level, HOLLOW, window)


def count_name(level: Level, state: str | None, window: str) -> str:
    """GPUs of a layer in a state judged on the window means (``None``: all GPUs reporting)."""
    return f"{level.name}:gpus:count" if state is None else f"{level.name}:gpus_{state}:count{window}"


def unprofiled_name(level: Level) -> str:
    """GPUs of a layer without SM metrics (no GPM, no DCGM profiling)."""
    return f"{level.name}:{UNPROFILED_COUNT}"


def pod_memory_name() -> str:
    """Framebuffer bytes used on the GPUs each pod holds alone (a gauge, so no window)."""
    return f"{NAMESPACE_POD.name}:{n.GPU_MEMORY_USED_BYTES}:sum"


def pod_gpus_name() -> str:
    """GPUs each pod holds, alone or shared, from the kubelet (gpu_allocation_info)."""
    return f"{NAMESPACE_POD.name}:gpus_allocated:count"


def ranked_name(window: str) -> str:
    """GPUs ranked by utilization minus SM active, valued by that gap; the label ``ranking`` says
    which list: ``gap`` and ``hollow`` per cluster, ``pod`` per pod (recording.py ranks them)."""
    return f"{GPU.name}:gpu_utilization_sm_active_gap:topk_ratio_rate{window}"
