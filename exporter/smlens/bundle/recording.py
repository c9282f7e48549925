"""The recording rules: layers, each summing the one below (GPU, node, namespace, cluster, fleet), the
MIG GPU instances' own layer, and the lists the dashboards rank from.

What they record, and under which names, is :mod:`smlens.bundle.layers`.
"""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.layers import (
    AGGREGATES,
    COMPUTE_SOL,
    COUNTED,
    COUNTED_FROM_GPUS,
    GPU,
    GPU_STATES,
    INSTANCE,
    NAMESPACE_POD,
    SUMMED,
    TOP_GPUS,
    TOP_POINTS,
    Level,
    count_name,
    hollow_name,
    level_labels,
    mean_expr,
    mean_name,
    ranked_name,
    rate_name,
    stalled_name,
    sum_name,
    summed,
    unprofiled_name,
    wasted_name,
)
from smlens.bundle.promql import by, number, ratio, total
from smlens.bundle.series import COUNTERS, INSTANCE_MEANS, MEMORY_SOL_MEAN, SM_ACTIVE_MEAN, UTILIZATION_MEAN
from smlens.verdicts.thresholds import Thresholds

Rule = dict[str, object]


def record(name: str, expr: str, labels: dict[str, str] | None = None) -> Rule:
    rule: Rule = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def state_conditions(t: Thresholds) -> dict[str, str]:
    """Per state, a condition on the per-GPU recorded series that holds for GPUs in that state."""
    w = t.window
    return {
        "busy": f"{mean_name(GPU, UTILIZATION_MEAN, w)} >= bool {number(t.busy_utilization)}",
        "working": f"{mean_name(GPU, SM_ACTIVE_MEAN, w)} >= bool {number(t.working_sm_active)}",
        "hollow": f"{hollow_name(GPU, w)} > bool 0",
        "stalled": f"{stalled_name(GPU, w)} > bool 0",
    }


def _gpu_layer(t: Thresholds) -> list[Rule]:
    w = t.window
    labels = by(level_labels(GPU, t.cluster_label))
    # max, not sum: two scrape jobs on one exporter give two identical series per GPU (instance/job
    # differ), which a sum would double; one GPU never has two series that differ otherwise.
    rules = [record(rate_name(c, w), f"max {labels}(rate({total(c)}[{w}]))") for c in COUNTERS]
    for mean in GPU.ratios:
        mean_ratio = ratio(rate_name(mean.numerator, w), rate_name(mean.denominator, w))
        rules.append(record(mean_name(GPU, mean, w), mean_ratio))
    rules.append(
        record(
            hollow_name(GPU, w),
            f"{rate_name(UTILIZATION_MEAN.denominator, w)}\n"
            f"* ({mean_name(GPU, UTILIZATION_MEAN, w)} >= bool {number(t.busy_utilization)})\n"
            f"* ({mean_name(GPU, SM_ACTIVE_MEAN, w)} <= bool {number(t.hollow_sm_active)})",
        )
    )
    # Busy with SMs active, but neither a compute pipe nor DRAM near its speed of light; absent for a
    # GPU without a compute SOL, whose stalls cannot be told from compute-bound work.
    rules.append(
        record(
            stalled_name(GPU, w),
            f"{rate_name(UTILIZATION_MEAN.denominator, w)}\n"
            f"* ({mean_name(GPU, UTILIZATION_MEAN, w)} >= bool {number(t.busy_utilization)})\n"
            f"* ({mean_name(GPU, SM_ACTIVE_MEAN, w)} >= bool {number(t.working_sm_active)})\n"
            f"* ({mean_expr(GPU, COMPUTE_SOL, w)} < bool {number(t.compute_bound_pipe)})\n"
            f"* ({mean_expr(GPU, MEMORY_SOL_MEAN, w)} < bool {number(t.memory_bound_dram)})",
        )
    )
    return rules


def _counts(level: Level, t: Thresholds) -> list[Rule]:
    w = t.window
    labels = by(level_labels(level, t.cluster_label))
    if level is not COUNTED_FROM_GPUS:
        names = [count_name(level, state, w) for state in (None, *GPU_STATES)] + [unprofiled_name(level)]
        sources = [count_name(COUNTED_FROM_GPUS, state, w) for state in (None, *GPU_STATES)]
        sources.append(unprofiled_name(COUNTED_FROM_GPUS))
        return [record(name, f"sum {labels}({source})") for name, source in zip(names, sources, strict=True)]
    # Each GPU once however often it is scraped (gpu_info keeps instance and job).
    gpus = f"group by ({t.cluster_label}, hostname, uuid) ({n.GPU_INFO})"
    rules = [record(count_name(level, None, w), f"count {labels}({gpus})")]
    # The per-GPU series are one per GPU except for a window after the GPU changes owner, when the
    # previous owner's series lingers: docs/monitoring.md says how that shows in these counts.
    for state, condition in state_conditions(t).items():
        rules.append(record(count_name(level, state, w), f"sum {labels}({condition})"))
    unprofiled = f"max by ({t.cluster_label}, hostname, uuid) ({n.GPU_PROFILING_AVAILABLE} == bool 0)"
    rules.append(record(unprofiled_name(level), f"sum {labels}({unprofiled})"))
    return rules


def _aggregate_layer(level: Level, t: Thresholds) -> list[Rule]:
    w = t.window
    below = level.below
    assert below is not None
    labels = by(level_labels(level, t.cluster_label))
    # Only GPUs with SM data count in the busy-profiled seconds, the denominator of SM efficiency, or a
    # node with unprofiled GPUs would exceed 1.
    rules = [record(sum_name(level, s, w), f"sum {labels}({summed(below, s, w)})") for s in SUMMED]
    for mean in level.ratios:
        numerator = sum_name(level, mean.numerator, w)
        rules.append(
            record(mean_name(level, mean, w), ratio(numerator, sum_name(level, mean.denominator, w)))
        )
    if level in COUNTED:
        rules += _counts(level, t)
    return rules


def _pod_waste(t: Thresholds) -> Rule:
    """GPUs without a compute SOL (mapped from dcgm-exporter) have no stalled seconds: left out."""
    w = t.window
    labels = by(level_labels(NAMESPACE_POD, t.cluster_label))
    wasted = f'{hollow_name(GPU, w)}{{pod!=""}} + {stalled_name(GPU, w)}{{pod!=""}}'
    return record(wasted_name(w), f"sum {labels}({wasted})")


def _ranked(t: Thresholds) -> Rule:
    """Ranked once per evaluation, so that a dashboard load reads these lists instead of ranking every
    GPU again for each column of its tables. Any selection of clusters is a union of them, so the top
    N of the selection is within the union of their lists: topk over it is exact. Only the GPUs'
    current owners: after pod churn the previous owner's window means linger for a window."""
    w = t.window
    c = t.cluster_label

    current = f"and on ({', '.join(level_labels(GPU, c))}) {n.GPU_UP}"

    # Filtered before ranking: a previous owner's lingering series ranked first and dropped after
    # would take a place of a current GPU, and the list would miss one of the worst.
    gap = f"({mean_name(GPU, UTILIZATION_MEAN, w)} - {mean_name(GPU, SM_ACTIVE_MEAN, w)} {current})"
    lists = {
        "gap": (c, TOP_POINTS, gap),
        "hollow": (c, TOP_GPUS, f"{gap} and {hollow_name(GPU, w)} > 0"),
    }
    ranked = [
        f'label_replace(topk by ({group}) ({top}, {expr}), "ranking", "{name}", "", "")'
        for name, (group, top, expr) in lists.items()
    ]
    return record(ranked_name(w), "\nor\n".join(ranked))


def _instance_layer(t: Thresholds) -> list[Rule]:
    """Per MIG GPU instance: rates of its integrals and coverage, and their window means."""
    w = t.window
    labels = by(level_labels(INSTANCE, t.cluster_label))
    counters = dict.fromkeys(c for mean in INSTANCE_MEANS for c in (mean.numerator, mean.denominator))
    rules = [record(sum_name(INSTANCE, c, w), f"max {labels}(rate({total(c)}[{w}]))") for c in counters]
    for mean in INSTANCE_MEANS:
        mean_ratio = ratio(sum_name(INSTANCE, mean.numerator, w), sum_name(INSTANCE, mean.denominator, w))
        rules.append(record(mean_name(INSTANCE, mean, w), mean_ratio))
    return rules


def recording_rules(t: Thresholds) -> list[Rule]:
    """Layers, each summing the one below: GPU, node, namespace, cluster, fleet; and the MIG GPU
    instances' own layer."""
    rules = _gpu_layer(t)
    for level in AGGREGATES:
        rules += _aggregate_layer(level, t)
    rules.append(_pod_waste(t))
    rules.append(_ranked(t))
    rules += _instance_layer(t)
    return rules
