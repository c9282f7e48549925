"""The fleet overview: busy according to NVML versus truly working according to SM activity, per
cluster, from the cluster layer of the recording rules (its cost does not grow with the fleet)."""

from __future__ import annotations

from smlens.bundle.dashboards.panels import bargauge, ratio_series, scatter, series, stat, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import GAP, roofline, rules_check
from smlens.bundle.grafana import JSON, Panel, Query, Row, dashboard
from smlens.bundle.layers import (
    CLUSTER,
    EFFICIENCY,
    GPU,
    HOSTNAME,
    NAMESPACE,
    TOP_GPUS,
    TOP_POINTS,
    efficiency_name,
    unprofiled_name,
)
from smlens.bundle.series import SM_ACTIVE_MEAN, SM_OCCUPANCY_MEAN, TENSOR_ACTIVE_MEAN, UTILIZATION_MEAN
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds

WARN_FROM_ONE = [(None, "green"), (1, "orange")]


def _hollow_rule(t: Thresholds) -> str:
    return (
        f"busy means a {t.window} mean utilization of at least {percent(t.busy_utilization, 0)}; hollow"
        f" means busy while SM active stays at or below {percent(t.hollow_sm_active, 0)}"
    )


def _state_stats(e: Exprs, sel: str) -> list[Panel]:
    t = e.t
    gpus = stat(
        "GPUs",
        "GPUs smlens reports in the selected clusters (each GPU once, however often it is scraped).",
        e.layer_count(CLUSTER, None, sel),
    )
    busy = stat(
        "Busy (NVML)",
        f"GPUs whose NVML utilization ({t.window} mean) is at least {percent(t.busy_utilization, 0)}: a"
        " kernel ran most of the time. This is what most tools call a busy GPU; it says nothing about how"
        " much of the GPU worked.",
        e.layer_count(CLUSTER, "busy", sel),
    )
    working = stat(
        "Truly working",
        f"GPUs whose SMs were active at least {percent(t.working_sm_active, 0)} of the time"
        f" ({t.window} mean): most of the chip had work.",
        e.layer_count(CLUSTER, "working", sel),
    )
    hollow = stat(
        "Busy but hollow",
        f"GPUs that look busy but whose SMs are mostly idle ({_hollow_rule(t)}). Open the table below and"
        " the runbook of GPUBusyButSMUnderused.",
        e.layer_count(CLUSTER, "hollow", sel),
        steps=WARN_FROM_ONE,
    )
    return [gpus, busy, working, hollow, *_coverage_stats(e, sel)]


def _coverage_stats(e: Exprs, sel: str) -> list[Panel]:
    unprofiled = stat(
        "No SM metrics",
        "GPUs without SM-level metrics (no NVML GPM or DCGM profiling): smlens cannot tell whether they"
        " are hollow. See the runbook of GPUProfilingMetricsUnavailable.",
        f"sum({unprofiled_name(CLUSTER)}{sel})",
        steps=WARN_FROM_ONE,
    )
    efficiency = stat(
        "SM efficiency",
        "SM-active GPU-seconds per busy GPU-second over the GPUs with SM metrics: the share of the time"
        " NVML calls busy in which the SMs really had work. Low values mean kernels too small or too few"
        " to fill the GPUs.",
        e.layer_mean(CLUSTER, EFFICIENCY, sel),
        ratio=True,
        steps=e.sm_steps(),
    )
    return [unprofiled, efficiency]


def _fleet_means(e: Exprs, sel: str) -> list[Panel]:
    t = e.t
    means = ratio_series(
        "Utilization vs SM active, selected clusters",
        f"Exact {t.window} means over all selected GPUs (GPU-seconds summed, then divided). The distance"
        " between utilization and SM active is time NVML counts as busy while the SMs had nothing to do.",
        [
            Query(e.layer_mean(CLUSTER, UTILIZATION_MEAN, sel), "Utilization (NVML)"),
            Query(e.layer_mean(CLUSTER, SM_ACTIVE_MEAN, sel), "SM active"),
            Query(e.layer_mean(CLUSTER, SM_OCCUPANCY_MEAN, sel), "SM occupancy"),
            Query(e.layer_mean(CLUSTER, TENSOR_ACTIVE_MEAN, sel), "Tensor active"),
        ],
    )
    states = series(
        "GPUs busy, working and hollow",
        f"Counts of GPUs over time ({_hollow_rule(t)}; working means SM active of at least"
        f" {percent(t.working_sm_active, 0)}). A wide band between busy and working is the hollow share"
        " of the fleet.",
        [
            Query(e.layer_count(CLUSTER, "busy", sel), "busy (NVML)"),
            Query(e.layer_count(CLUSTER, "working", sel), "truly working"),
            Query(e.layer_count(CLUSTER, "hollow", sel), "busy but hollow"),
        ],
    )
    return [means, states, *_cluster_means(e, sel)]


def _cluster_means(e: Exprs, sel: str) -> list[Panel]:
    by_cluster = f"{{{{{e.c}}}}}"
    gap = f"{e.mean(CLUSTER, UTILIZATION_MEAN, sel)}\n-\n{e.mean(CLUSTER, SM_ACTIVE_MEAN, sel)}"
    gaps = ratio_series(
        "Utilization minus SM active, by cluster",
        "Per cluster, the exact mean utilization minus the exact mean SM activity. Near 0: busy time is"
        " real work. Large: GPUs run kernels that leave most SMs idle; the nodes with the largest gap are"
        " listed below.",
        [Query(gap, by_cluster)],
    )
    efficiency = ratio_series(
        "SM efficiency by cluster",
        "Per cluster, SM-active GPU-seconds per busy GPU-second (GPUs with SM metrics only). 100 % means"
        " every busy moment kept the SMs working.",
        [Query(f"{efficiency_name(CLUSTER, e.w)}{sel}", by_cluster)],
    )
    return [gaps, efficiency]


def _hollow_gpus(e: Exprs) -> Panel:
    gpu_sel = e.selector()
    return table(
        "Top hollow GPUs",
        f"The {TOP_GPUS} hollow GPUs with the largest gap between utilization and SM active"
        f" ({_hollow_rule(e.t)}). Workload columns are filled when one container holds the GPU. Fix: see"
        " the runbook of GPUBusyButSMUnderused (batch size, CUDA graphs, input pipeline).",
        (GAP, e.ranked("hollow", TOP_GPUS)),
        [
            ("Utilization", e.mean(GPU, UTILIZATION_MEAN, gpu_sel)),
            ("SM active", e.mean(GPU, SM_ACTIVE_MEAN, gpu_sel)),
            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY_MEAN, gpu_sel)),
            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE_MEAN, gpu_sel)),
        ],
        on=e.gpu_labels,
    )


def _worst_places(e: Exprs, sel: str) -> list[Panel]:
    gap = f"{e.mean(HOSTNAME, UTILIZATION_MEAN, sel)}\n-\n{e.mean(HOSTNAME, SM_ACTIVE_MEAN, sel)}"
    nodes = bargauge(
        "Nodes with the largest gap",
        f"The {TOP_GPUS} nodes whose exact {e.w} mean utilization exceeds their mean SM activity the"
        " most: GPUs there look busy but leave SMs idle. Open the node dashboard for one of them.",
        f"topk({TOP_GPUS}, {gap})",
        "{{hostname}}",
        ratio=True,
    )
    hours = e.hollow_hours(NAMESPACE, sel, "namespace")
    namespaces = bargauge(
        "Hollow GPU-hours by namespace",
        "GPU-hours spent busy but hollow during the dashboard's time range, per namespace ('(none)' for"
        " GPUs no workload holds). These are GPUs paid for and reported busy that did little work.",
        f'sort_desc(label_replace({hours}, "namespace", "(none)", "namespace", ""))',
        "{{namespace}}",
        unit="h",
        min_interval=e.w,
    )
    return [nodes, namespaces]


def _gap_scatter(e: Exprs) -> Panel:
    gpu_sel = e.selector()
    in_top_gap = f"and on ({e.gpu_labels})\n{e.ranked('gap', TOP_POINTS)}"
    return scatter(
        "Utilization vs SM active, GPUs with the largest gap",
        f"One point per GPU ({e.w} means) for the {TOP_POINTS} GPUs whose utilization exceeds their SM"
        " activity the most. Healthy GPUs sit on the diagonal; points at the bottom right are busy but"
        " hollow.",
        Query(f"{e.mean(GPU, UTILIZATION_MEAN, gpu_sel)}\n{in_top_gap}", instant=True),
        Query(f"{e.mean(GPU, SM_ACTIVE_MEAN, gpu_sel)}\n{in_top_gap}", instant=True),
    )


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector()
    return dashboard(
        "smlens-fleet",
        "smlens / Fleet overview",
        "How many GPUs are busy according to NVML versus truly working according to SM activity, per"
        " cluster. Reads the cluster layer of the recording rules: its cost does not grow with the fleet.",
        [e.cluster_variable()],
        [
            Row("Recording rules", [rules_check(e, CLUSTER, sel)]),
            Row(f"Busy vs truly working ({t.window} means)", _state_stats(e, sel)),
            Row("Utilization vs SM activity", _fleet_means(e, sel)),
            Row("Hollow GPUs", [_hollow_gpus(e), *_worst_places(e, sel), _gap_scatter(e)]),
            Row("Speed of light", [roofline(e, sel, TOP_POINTS)]),
        ],
    )
