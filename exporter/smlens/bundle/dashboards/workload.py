"""The workload dashboard: pods on GPUs, what they hold, how busy NVML says those GPUs are and how much
SM work they do, from the namespace/pod layer of the recording rules."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.dashboards.panels import bargauge, ratio_series, series, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import GAP, RATIO_MEANINGS, rules_check
from smlens.bundle.grafana import JSON, Panel, Query, Row, Variable, dashboard
from smlens.bundle.layers import (
    CLUSTER,
    GPU,
    NAMESPACE_POD,
    TOP_GPUS,
    efficiency_name,
    pod_gpus_name,
    pod_memory_name,
)
from smlens.bundle.series import (
    DRAM_ACTIVE_MEAN,
    SM_ACTIVE_MEAN,
    SM_OCCUPANCY_MEAN,
    TENSOR_ACTIVE_MEAN,
    UTILIZATION_MEAN,
)
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds

POD = NAMESPACE_POD
POD_LEGEND = "{{namespace}}/{{pod}}"


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
        Variable("pod", "Pod", f"label_values({n.GPU_ALLOCATION_INFO}{in_namespaces}, pod)", multi=True),
    ]


def _pods(e: Exprs, sel: str) -> Panel:
    held = f"topk({TOP_GPUS * 2}, {pod_gpus_name()}{sel})"
    return table(
        "Pods on GPUs",
        f"The {TOP_GPUS * 2} selected pods holding the most GPUs (from the kubelet), with the exact means"
        " over the GPUs each holds alone. Low SM active or SM efficiency with high utilization: the pod's"
        " kernels leave the GPU mostly idle; see the runbook of GPUBusyButSMUnderused.",
        ("GPUs", held),
        [
            ("Utilization", e.mean(POD, UTILIZATION_MEAN, sel)),
            ("SM active", e.mean(POD, SM_ACTIVE_MEAN, sel)),
            ("SM occupancy", e.mean(POD, SM_OCCUPANCY_MEAN, sel)),
            ("Tensor active", e.mean(POD, TENSOR_ACTIVE_MEAN, sel)),
            ("SM efficiency", f"{efficiency_name(POD, e.w)}{sel}"),
        ],
        on=f"{e.c}, namespace, pod",
        overrides=[
            {"matcher": {"id": "byName", "options": "GPUs"}, "properties": [{"id": "unit", "value": "none"}]}
        ],
    )


def _top_pods(title: str, description: str, expr: str, pick: str = "topk") -> Panel:
    return ratio_series(
        title,
        f"{description} With many pods selected, the {TOP_GPUS} {'highest' if pick == 'topk' else 'lowest'}"
        " at each step; select pods to see them all.",
        [Query(f"{pick}({TOP_GPUS}, {expr})", POD_LEGEND)],
    )


def _pod_means(e: Exprs, sel: str) -> list[Panel]:
    utilization = _top_pods(
        "Utilization per pod",
        f"{RATIO_MEANINGS[UTILIZATION_MEAN][1]} Exact {e.w} mean over the pod's GPUs.",
        e.mean(POD, UTILIZATION_MEAN, sel),
    )
    sm = _top_pods(
        "SM active per pod",
        f"{RATIO_MEANINGS[SM_ACTIVE_MEAN][1]} Exact {e.w} mean over the pod's GPUs. Compare with"
        " utilization: the gap is time the GPU looked busy without SM work.",
        e.mean(POD, SM_ACTIVE_MEAN, sel),
        pick="bottomk",
    )
    efficiency = _top_pods(
        "SM efficiency per pod",
        "SM-active GPU-seconds per busy GPU-second over the pod's GPUs. Low: small kernels, launch"
        " overhead, synchronisation or an input pipeline the GPU waits for.",
        f"{efficiency_name(POD, e.w)}{sel}",
        pick="bottomk",
    )
    return [utilization, sm, efficiency]


def _pod_usage(e: Exprs, sel: str, attributed: str) -> list[Panel]:
    t = e.t
    memory = series(
        "GPU memory used per pod",
        "Framebuffer memory used on the GPUs each pod holds alone. Memory held while utilization stays"
        " near 0 is an idle allocation (GPUAllocatedButIdle). With many pods selected, the"
        f" {TOP_GPUS} largest at each step.",
        [Query(f"topk({TOP_GPUS}, {pod_memory_name()}{sel})", POD_LEGEND)],
        unit="bytes",
    )
    hours = e.hollow_hours(POD, attributed, f"{e.c}, namespace, pod")
    hollow = bargauge(
        "Hollow GPU-hours per pod",
        "GPU-hours each pod's GPUs spent busy but hollow during the dashboard's range (busy: utilization"
        f" of at least {percent(t.busy_utilization, 0)}; hollow: SM active at or below"
        f" {percent(t.hollow_sm_active, 0)}; {t.window} means); the {TOP_GPUS} largest.",
        f"sort_desc(topk({TOP_GPUS}, {hours}))",
        POD_LEGEND,
        unit="h",
    )
    return [memory, hollow]


def _pod_gpus(e: Exprs, attributed: str) -> Panel:
    return table(
        "GPUs of the selected pods",
        f"The {TOP_GPUS} GPUs held alone by a selected pod with the largest gap between utilization and"
        f" SM active, with their {e.w} means.",
        (GAP, e.ranked("pod", TOP_GPUS, 'namespace=~"$namespace"', 'pod=~"$pod"')),
        [
            ("Utilization", e.mean(GPU, UTILIZATION_MEAN, attributed)),
            ("SM active", e.mean(GPU, SM_ACTIVE_MEAN, attributed)),
            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY_MEAN, attributed)),
            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE_MEAN, attributed)),
            ("DRAM active", e.mean(GPU, DRAM_ACTIVE_MEAN, attributed)),
        ],
        on=e.gpu_labels,
        width=12,
    )


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector('namespace=~"$namespace"', 'pod=~"$pod"')
    attributed = e.selector('namespace=~"$namespace"', 'pod=~"$pod"', 'pod!=""')
    over_time = [*_pod_means(e, sel), *_pod_usage(e, sel, attributed), _pod_gpus(e, attributed)]
    return dashboard(
        "smlens-workload",
        "smlens / Workload",
        "Pods on GPUs: what they hold, how busy NVML says those GPUs are and how much SM work they do."
        " Reads the namespace/pod layer of the recording rules.",
        _variables(e),
        [
            Row("Recording rules", [rules_check(e, CLUSTER, e.selector())]),
            Row(f"Pods ({t.window} means)", [_pods(e, sel)]),
            Row("Over time", over_time),
        ],
    )
