"""The workload dashboard: pods on GPUs, what they hold, how busy NVML says those GPUs are and how much
SM work they do. Namespaces from the namespace layer of the recording rules; pods summed from the
per-GPU layer, for the pods of the selected namespaces in the tables and for the selected pods over
time (the pod variable has no All: a default view over every pod of a large fleet would read all of
their history)."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.dashboards.panels import bargauge, ratio_series, series, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import GAP, RATIO_MEANINGS, rules_check
from smlens.bundle.grafana import JSON, Panel, Query, Row, Variable, dashboard
from smlens.bundle.layers import CLUSTER, EFFICIENCY, GPU, NAMESPACE, TOP_GPUS, mean_name
from smlens.bundle.series import (
    DRAM_ACTIVE_MEAN,
    SM_ACTIVE_MEAN,
    SM_OCCUPANCY_MEAN,
    TENSOR_ACTIVE_MEAN,
    UTILIZATION_MEAN,
    Mean,
)
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds

POD_LEGEND = "{{namespace}}/{{pod}}"
NAMESPACE_LEGEND = "{{namespace}}"
TOP_PODS = TOP_GPUS * 2


def _variables(e: Exprs) -> list[Variable]:
    in_namespaces = e.selector('namespace=~"$namespace"')
    return [
        e.cluster_variable(),
        Variable(
            "namespace",
            "Namespace",
            f"label_values({n.GPU_ALLOCATION_INFO}{e.selector()}, namespace)",
            multi=True,
        ),
        # Pods that hold a GPU alone: only their GPUs' series carry the pod's labels.
        Variable(
            "pod",
            "Pod",
            f"label_values({mean_name(GPU, UTILIZATION_MEAN, e.w)}{in_namespaces}, pod)",
            multi=True,
            offers_all=False,
            sort=5,
        ),
    ]


def _pod_by(e: Exprs) -> str:
    return f" by ({e.c}, namespace, pod)"


def _pod_mean(e: Exprs, mean: Mean, selector: str) -> str:
    """A mean over each pod's GPUs: their summed per-GPU rates divided."""
    return e.layer_mean(GPU, mean, selector, by=_pod_by(e))


def _pods(e: Exprs, in_namespaces: str) -> Panel:
    held = f"group by ({e.c}, hostname, uuid, namespace, pod) ({n.GPU_ALLOCATION_INFO}{in_namespaces})"
    gpus = f"topk({TOP_PODS}, count{_pod_by(e)} ({held}))"
    return table(
        "Pods on GPUs",
        f"The {TOP_PODS} pods of the selected namespaces holding the most GPUs (from the kubelet), with"
        f" the exact {e.w} means over the GPUs each holds alone; select pods above to follow them over"
        " time. Low SM active or SM efficiency with high utilization: the pod's kernels leave the GPU"
        " mostly idle; see the runbook of GPUBusyButSMUnderused.",
        ("GPUs", gpus),
        [
            ("Utilization", _pod_mean(e, UTILIZATION_MEAN, in_namespaces)),
            ("SM active", _pod_mean(e, SM_ACTIVE_MEAN, in_namespaces)),
            ("SM occupancy", _pod_mean(e, SM_OCCUPANCY_MEAN, in_namespaces)),
            ("Tensor active", _pod_mean(e, TENSOR_ACTIVE_MEAN, in_namespaces)),
            ("SM efficiency", _pod_mean(e, EFFICIENCY, in_namespaces)),
        ],
        on=f"{e.c}, namespace, pod",
        overrides=[
            {"matcher": {"id": "byName", "options": "GPUs"}, "properties": [{"id": "unit", "value": "none"}]}
        ],
    )


def _namespaces(e: Exprs, in_namespaces: str) -> list[Panel]:
    t = e.t
    named = in_namespaces[:-1] + ', namespace!=""}'
    utilization = ratio_series(
        "Utilization and SM active per namespace",
        f"Exact {e.w} means over each namespace's GPUs: utilization (NVML) and SM active. The gap is time"
        " the GPUs looked busy without SM work.",
        [
            Query(e.mean(NAMESPACE, UTILIZATION_MEAN, named), "{{namespace}} utilization"),
            Query(e.mean(NAMESPACE, SM_ACTIVE_MEAN, named), "{{namespace}} SM active"),
        ],
    )
    hours = e.hollow_hours(NAMESPACE, named, f"{e.c}, namespace")
    hollow = bargauge(
        "Hollow GPU-hours per namespace",
        "GPU-hours each namespace's GPUs spent busy but hollow during the dashboard's range (busy:"
        f" utilization of at least {percent(t.busy_utilization, 0)}; hollow: SM active at or below"
        f" {percent(t.hollow_sm_active, 0)}; {t.window} means); the {TOP_GPUS} largest.",
        f"sort_desc(topk({TOP_GPUS}, {hours}))",
        NAMESPACE_LEGEND,
        unit="h",
        min_interval=e.w,
    )
    return [utilization, hollow]


def _pod_means(e: Exprs, pods: str) -> list[Panel]:
    utilization = ratio_series(
        "Utilization per pod",
        f"{RATIO_MEANINGS[UTILIZATION_MEAN][1]} Exact {e.w} mean over each selected pod's GPUs.",
        [Query(_pod_mean(e, UTILIZATION_MEAN, pods), POD_LEGEND)],
    )
    sm = ratio_series(
        "SM active per pod",
        f"{RATIO_MEANINGS[SM_ACTIVE_MEAN][1]} Exact {e.w} mean over each selected pod's GPUs. Compare"
        " with utilization: the gap is time the GPU looked busy without SM work.",
        [Query(_pod_mean(e, SM_ACTIVE_MEAN, pods), POD_LEGEND)],
    )
    efficiency = ratio_series(
        "SM efficiency per pod",
        "SM-active GPU-seconds per busy GPU-second over each selected pod's GPUs. Low: small kernels,"
        " launch overhead, synchronisation or an input pipeline the GPU waits for.",
        [Query(_pod_mean(e, EFFICIENCY, pods), POD_LEGEND)],
    )
    return [utilization, sm, efficiency]


def _pod_usage(e: Exprs, pods: str) -> list[Panel]:
    per_gpu = f"max by ({e.c}, hostname, uuid, namespace, pod) ({n.GPU_MEMORY_USED_BYTES}{pods})"
    memory = series(
        "GPU memory used per pod",
        "Framebuffer memory used on the GPUs each selected pod holds alone. Memory held while"
        " utilization stays near 0 is an idle allocation (GPUAllocatedButIdle).",
        [Query(f"sum{_pod_by(e)} ({per_gpu})", POD_LEGEND)],
        unit="bytes",
    )
    return [memory]


def _wasting_pods(e: Exprs, in_namespaces: str) -> Panel:
    t = e.t
    hours = e.wasted_hours(in_namespaces)
    return bargauge(
        "Stalled or hollow GPU-hours per pod",
        "GPU-hours each pod of the selected namespaces spent busy but hollow (SM active at or below"
        f" {percent(t.hollow_sm_active, 0)}) or busy and stalled (SMs active, neither a compute pipe nor"
        f" DRAM near its peak) during the dashboard's range ({t.window} means); the {TOP_GPUS} largest."
        " GPUs mapped from dcgm-exporter have no compute SOL and are left out.",
        f"sort_desc(topk({TOP_GPUS}, {hours}))",
        POD_LEGEND,
        unit="h",
        min_interval=e.w,
    )


def _pod_gpus(e: Exprs, pods: str) -> Panel:
    return table(
        "GPUs of the selected pods",
        f"The {TOP_GPUS} GPUs held alone by a selected pod with the largest gap between utilization and"
        f" SM active, with their {e.w} means.",
        (GAP, f"topk({TOP_GPUS}, {e.gap(pods)} {e.current_owner(pods)})"),
        [
            ("Utilization", e.mean(GPU, UTILIZATION_MEAN, pods)),
            ("SM active", e.mean(GPU, SM_ACTIVE_MEAN, pods)),
            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY_MEAN, pods)),
            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE_MEAN, pods)),
            ("DRAM active", e.mean(GPU, DRAM_ACTIVE_MEAN, pods)),
        ],
        on=e.gpu_labels,
        width=12,
    )


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    in_namespaces = e.selector('namespace=~"$namespace"', 'pod!=""')
    pods = e.selector('namespace=~"$namespace"', 'pod=~"$pod"', 'pod!=""')
    return dashboard(
        "smlens-workload",
        "smlens / Workload",
        "Pods on GPUs: what they hold, how busy NVML says those GPUs are and how much SM work they do."
        " Reads the per-GPU and namespace layers of the recording rules.",
        _variables(e),
        [
            Row("Recording rules", [rules_check(e, CLUSTER, e.selector())]),
            Row(
                f"Pods of the selected namespaces ({t.window} means)",
                [_pods(e, in_namespaces), _wasting_pods(e, in_namespaces)],
            ),
            Row("Namespaces over time", _namespaces(e, e.selector('namespace=~"$namespace"'))),
            Row("Selected pods over time", [*_pod_means(e, pods), *_pod_usage(e, pods), _pod_gpus(e, pods)]),
        ],
    )
