"""The recorded layers and the names of their series: what the recording rules write and the alerts,
the dashboards and the dcgm-exporter mapping read.

Every aggregate sums numerators and denominators separately before dividing: a node's SM activity is
the SM-active GPU-seconds of its GPUs over their profiled GPU-seconds, never a mean of per-GPU ratios.
Recorded names follow ``level:metric:operations``; the window of the means is part of the name.
"""

from __future__ import annotations

from dataclasses import dataclass

from smlens import names as n
from smlens.bundle.promql import ratio
from smlens.bundle.series import COUNTERS, INSTANCE_MEANS, MEANS, SM_ACTIVE_MEAN, UTILIZATION_MEAN, Mean

# The per-GPU level keeps a GPU's labels and its owner's (hostname first, as people read them).
GPU_LEVEL_LABELS = (n.HOSTNAME, n.GPU, n.UUID, *n.OWNER_LABELS)


@dataclass(frozen=True)
class Level:
    """A layer of recorded series: its name, the labels it keeps besides the cluster label, the layer
    it sums (None: the raw counters), the means it records as ratios (the others are a division of
    two of its recorded sums away, :func:`mean_expr`) and whether it keeps the cluster label."""

    name: str
    labels: tuple[str, ...]
    below: Level | None
    ratios: tuple[Mean, ...] = ()
    clustered: bool = True


# The layers with a series per GPU or per node record only the sums: a ratio per GPU or node would
# double their series for what a query divides in one step. The two per-GPU means that users' queries
# and the alerts read most keep their recorded names.
GPU = Level("gpu", GPU_LEVEL_LABELS, None, ratios=(UTILIZATION_MEAN, SM_ACTIVE_MEAN))
HOSTNAME = Level("hostname", (n.HOSTNAME,), GPU)
EFFICIENCY = Mean("gpu_sm_efficiency", SM_ACTIVE_MEAN.numerator, "gpu_profiled_busy_seconds")
# Over the profiled seconds of GPUs with a compute SOL only: GPUs mapped from dcgm-exporter have none, and
# counting their seconds would dilute it.
COMPUTE_SOL = Mean("gpu_compute_sol", n.GPU_COMPUTE_SOL_SECONDS, "gpu_compute_sol_profiled_seconds")
ALL_MEANS = (*MEANS, EFFICIENCY, COMPUTE_SOL)
# Its sums keep the bucket of GPUs no workload holds (namespace=""), so that the layers above cover every GPU.
# The two means its time series plot are recorded: a few series per cluster, read at every graph step.
NAMESPACE = Level("namespace", (n.NAMESPACE,), GPU, ratios=(UTILIZATION_MEAN, SM_ACTIVE_MEAN))
CLUSTER = Level("cluster", (), HOSTNAME, ALL_MEANS)
FLEET = Level("fleet", (), CLUSTER, ALL_MEANS, clustered=False)
AGGREGATES = (HOSTNAME, NAMESPACE, CLUSTER, FLEET)
# Per pod, only the GPU-seconds a pod wastes, hollow or stalled: a ranking of every pod over a dashboard's
# range reads one series per pod instead of two per GPU; the rest is a per-GPU sum away.
NAMESPACE_POD = Level("namespace_pod", (n.NAMESPACE, n.POD), GPU)
WASTED = "gpu_busy_but_hollow_or_stalled_seconds"
# Layers that count GPUs by state: the first counts per-GPU series, the others sum its counts.
COUNTED_FROM_GPUS = CLUSTER
COUNTED = (COUNTED_FROM_GPUS, FLEET)
# MIG GPU instances: their own layer, beside the GPU's. An instance's series keep the parent GPU's
# labels, the instance's and its owner's.
INSTANCE = Level(
    "gpu_instance",
    (n.HOSTNAME, n.GPU, n.UUID, n.GPU_INSTANCE, n.MIG_PROFILE, n.MIG_UUID, *n.OWNER_LABELS),
    None,
    INSTANCE_MEANS,
)


def level_labels(level: Level, cluster: str) -> tuple[str, ...]:
    """The labels a layer's series carry, the cluster label first."""
    return (cluster, *level.labels) if level.clustered else level.labels


# Busy seconds of the GPUs that have SM data: the denominator of SM efficiency at every layer.
PROFILED_BUSY = EFFICIENCY.denominator
SOL_PROFILED = COMPUTE_SOL.denominator
HOLLOW = "gpu_busy_but_hollow_seconds"
STALLED = "gpu_busy_but_stalled_seconds"
# What every aggregate layer sums from the layer below. The per-GPU layer records neither denominator
# of its own: for one GPU they are its busy or profiled seconds where it has SM data or a compute SOL
# (:func:`summed`).
SUMMED = (*COUNTERS, PROFILED_BUSY, SOL_PROFILED, HOLLOW, STALLED)
GPU_STATES = ("busy", "working", "hollow", "stalled")
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
    """The name of a mean a layer records (``level.ratios``)."""
    assert mean in level.ratios, f"{level.name} records no {mean.metric} ratio"
    return f"{level.name}:{mean.metric}:ratio_rate{window}"


def summed(level: Level, name: str, window: str, selector: str = "") -> str:
    """A layer's GPU-seconds per second of ``name`` (one of SUMMED), selected: a recorded series, or
    for one GPU's busy-profiled seconds, its busy seconds where it has SM data."""
    derived = {
        PROFILED_BUSY: (UTILIZATION_MEAN.numerator, SM_ACTIVE_MEAN.numerator),
        SOL_PROFILED: (SM_ACTIVE_MEAN.denominator, COMPUTE_SOL.numerator),
    }
    if level is GPU and name in derived:
        seconds, where = (sum_name(GPU, c, window) for c in derived[name])
        return f"({seconds}{selector} and {where}{selector})"
    return f"{sum_name(level, name, window)}{selector}"


def mean_expr(level: Level, mean: Mean, window: str, selector: str = "") -> str:
    """A layer's window mean per series: its recorded ratio, or its two recorded sums divided (in
    parentheses, so that it composes as a name does)."""
    if mean in level.ratios:
        return f"{mean_name(level, mean, window)}{selector}"
    numerator = summed(level, mean.numerator, window, selector)
    if level is GPU and mean is COMPUTE_SOL:
        # One GPU's SOL covers its profiled seconds: where it has none, the division has no series.
        return f"({ratio(numerator, f'{sum_name(GPU, SM_ACTIVE_MEAN.denominator, window)}{selector}')})"
    return f"({ratio(numerator, summed(level, mean.denominator, window, selector))})"


def efficiency_name(level: Level, window: str) -> str:
    """SM-active GPU-seconds per busy GPU-second (GPUs with SM data only)."""
    return mean_name(level, EFFICIENCY, window)


def stalled_name(level: Level, window: str) -> str:
    """GPU-seconds per second spent busy and stalled: SMs active, neither a compute pipe nor DRAM near
    its speed of light (judged on the per-GPU window means)."""
    return sum_name(level, STALLED, window)


def wasted_name(window: str) -> str:
    """Per pod, GPU-seconds per second its GPUs spent busy but hollow or stalled."""
    return sum_name(NAMESPACE_POD, WASTED, window)


def hollow_name(level: Level, window: str) -> str:
    """GPU-seconds per second spent busy but hollow (judged on the per-GPU window means)."""
    return sum_name(level, HOLLOW, window)


def count_name(level: Level, state: str | None, window: str) -> str:
    """GPUs of a layer in a state judged on the window means (``None``: all GPUs reporting)."""
    return f"{level.name}:gpus:count" if state is None else f"{level.name}:gpus_{state}:count{window}"


def unprofiled_name(level: Level) -> str:
    """GPUs of a layer without SM metrics (no GPM, no DCGM profiling)."""
    return f"{level.name}:{UNPROFILED_COUNT}"


def ranked_name(window: str) -> str:
    """GPUs ranked by utilization minus SM active, valued by that gap; the label ``ranking`` says
    which list: ``gap`` and ``hollow`` per cluster (recording.py ranks them)."""
    return f"{GPU.name}:gpu_utilization_sm_active_gap:topk_ratio_rate{window}"
