"""The Grafana dashboards: fleet overview, node, single GPU and workload, generated from the thresholds.

Each dashboard reads the recorded layer that matches its selection: the fleet overview the cluster
layer (its cost does not grow with the number of nodes), the workload dashboard the namespace/pod
layer, the node and GPU dashboards one node's per-GPU series. Time series of one node or one GPU
compute exact means per graph step from the raw counters. Panels that list GPUs or pods show the
worst few (topk) rather than thousands of rows, GPUs from lists the rules rank once per evaluation.
Each dashboard opens with a panel that says whether the recording rules are loaded, so that their
absence never reads as an idle fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smlens import names as n
from smlens.bundle.grafana import JSON, Panel, Query, Row, Variable, dashboard, render
from smlens.bundle.rules import (
    CLUSTER,
    DCGM_EXPORTER,
    DRAM_ACTIVE,
    EFFICIENCY,
    GPU,
    HOSTNAME,
    INSTANCE,
    INSTANCE_MEANS,
    INSTANCE_MEASURED,
    NAMESPACE,
    NAMESPACE_POD,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    TOP_GPUS,
    TOP_POINTS,
    UTILIZATION,
    Level,
    Mean,
    count_name,
    efficiency_name,
    hollow_name,
    level_labels,
    mean_name,
    pod_gpus_name,
    pod_memory_name,
    ranked_name,
    sum_name,
    unprofiled_name,
)
from smlens.verdicts.thresholds import Thresholds

STAT_OPTIONS = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "value",
    "graphMode": "area",
    "justifyMode": "auto",
    "orientation": "auto",
    "textMode": "auto",
}
NAME_STAT_OPTIONS = {**STAT_OPTIONS, "graphMode": "none", "textMode": "name", "colorMode": "none"}
CHECK_OPTIONS = {**STAT_OPTIONS, "graphMode": "none", "textMode": "value", "colorMode": "background"}
SERIES_OPTIONS = {
    "legend": {
        "showLegend": True,
        "displayMode": "table",
        "placement": "right",
        "calcs": ["mean", "lastNotNull"],
    },
    "tooltip": {"mode": "multi", "sort": "desc"},
}
LINES = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never", "spanNulls": False}
BARGAUGE_OPTIONS = {
    "orientation": "horizontal",
    "displayMode": "gradient",
    "showUnfilled": True,
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
}
TIMELINE_OPTIONS = {
    "showValue": "never",
    "mergeValues": True,
    "alignValue": "left",
    "rowHeight": 0.9,
    "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom"},
    "tooltip": {"mode": "single", "sort": "none"},
}

GAP = "Utilization - SM active"
MIG_INSTANCES_MAX = 7  # GPU instances of one GPU at most (seven 1g slices on A100, H100, H200)
NODE_GPUS_MAX = 8  # GPUs of one node the node dashboard's MIG table makes room for (HGX: 8)
# Said by every panel that reads series only smlens exports: the dcgm-exporter mapping
# (rules/smlens-dcgm-exporter.rules.yaml) gives GPUs its per-GPU means, not these.
NEEDS_SMLENS = (
    " Needs smlens on the node: GPUs mapped from dcgm-exporter have no such series here (dcgm-exporter's"
    " own DCGM_FI_DEV_* metrics carry them)."
)
MAPPED_MEANS = (
    " GPUs mapped from dcgm-exporter have no counters: they show the mapping's recorded window means"
    " (means of scrape samples) instead."
)
RULES_FIX = (
    "load rules/smlens-recording.rules.yaml and rules/smlens-alerts.rules.yaml into Prometheus; with"
    " the Helm chart and kube-prometheus-stack, give the PrometheusRule the label your Prometheus"
    " selects (monitoring.prometheusRule.labels, e.g. release: <your kube-prometheus-stack release>)"
)

RATIO_MEANINGS = {
    UTILIZATION: (
        "Utilization (NVML)",
        "NVML utilization: the share of time at least one kernel ran. One kernel on one SM reads 100 %, so"
        " on its own it does not say how much of the GPU worked; read it next to SM active.",
    ),
    SM_ACTIVE: (
        "SM active",
        "Share of SM cycles with at least one warp resident, averaged over all SMs: how much of the GPU"
        " had work.",
    ),
    SM_OCCUPANCY: (
        "SM occupancy",
        "Resident warps over the maximum warps per SM. Low occupancy with busy tensor pipes is normal for"
        " large GEMMs; low occupancy with idle tensor pipes leaves latency unhidden.",
    ),
    TENSOR_ACTIVE: ("Tensor active", "Share of cycles any tensor pipe was active (matrix math)."),
    DRAM_ACTIVE: (
        "DRAM active",
        "Share of cycles the device memory interface was busy: near 100 % the work is memory-bound.",
    ),
}


def _pct(value: float) -> str:
    return f"{value:.0%}"


class Exprs:
    """PromQL for one set of thresholds (the rule window names the recorded series)."""

    def __init__(self, t: Thresholds) -> None:
        self.t = t
        self.w = t.window
        self.c = t.cluster_label
        self.gpu_labels = ", ".join(level_labels(GPU, t.cluster_label))

    def selector(self, *matchers: str) -> str:
        """A selector on the dashboard's cluster variable and ``matchers``."""
        return "{" + ", ".join((f'{self.c}=~"$cluster"', *matchers)) + "}"

    def cluster_variable(self) -> Variable:
        return Variable("cluster", "Cluster", f"label_values(gpu_info, {self.c})", multi=True)

    def mean(self, level: Level, mean: Mean, selector: str = "") -> str:
        return f"{mean_name(level, mean, self.w)}{selector}"

    def layer_mean(self, level: Level, mean: Mean, selector: str, by: str = "") -> str:
        """Exact window mean over the selected series of a layer: summed numerators over summed
        denominators, never a mean of ratios."""
        numerator = f"sum{by} ({sum_name(level, mean.numerator, self.w)}{selector})"
        denominator = f"sum{by} ({sum_name(level, mean.denominator, self.w)}{selector})"
        return f"{numerator}\n/\n({denominator} > 0)"

    def layer_count(self, level: Level, state: str | None, selector: str) -> str:
        return f"sum({count_name(level, state, self.w)}{selector})"

    def rules_loaded(self, level: Level, selector: str) -> str:
        """1 where the layer is recorded, 0 where smlens reports GPUs but the layer is missing (the
        recording rules are not loaded), nothing where no smlens data is selected."""
        return f"group({count_name(level, None, self.w)}{selector})\nor\n(group(gpu_up{selector}) - 1)"

    def ranked(self, ranking: str, top: int, *matchers: str) -> str:
        """The selection's top GPUs of one of the lists the rules rank (ranked_name)."""
        selector = self.selector(*matchers, f'ranking="{ranking}"')
        return f"topk({top}, max without (ranking) ({ranked_name(self.w)}{selector}))"

    def current_owner(self, selector: str) -> str:
        """Keeps the per-GPU series of a GPU's current owner: after pod churn the window-mean series
        of the previous owner lingers for a window, and a table would show the GPU twice."""
        labels = ", ".join((self.c, n.HOSTNAME, n.UUID, *n.OWNER_LABELS))
        return f"and on ({labels}) gpu_up{selector}"

    @staticmethod
    def step_mean(mean: Mean, selector: str, by: str) -> str:
        """Exact mean over each graph step, straight from the counters."""
        numerator = f"sum by ({by}) (rate({mean.numerator}_total{selector}[$__rate_interval]))"
        denominator = f"sum by ({by}) (rate({mean.denominator}_total{selector}[$__rate_interval]))"
        return f"{numerator}\n/\n({denominator} > 0)"

    def or_mapped(self, mean: Mean, selector: str) -> str:
        """``or`` the per-GPU window mean of GPUs mapped from dcgm-exporter, which have no smlens
        counters to take step means from; one series per GPU, like a step mean ``by (gpu)``."""
        mapped = f'{selector[:-1]}, exporter="{DCGM_EXPORTER}"}}'
        return f"\nor\nmax by (gpu) ({self.mean(GPU, mean, mapped)})"

    def gap(self, selector: str) -> str:
        return f"{self.mean(GPU, UTILIZATION, selector)} - {self.mean(GPU, SM_ACTIVE, selector)}"

    def hollow_hours(self, level: Level, selector: str, by: str) -> str:
        """GPU-hours spent hollow over the dashboard range, integrated at the panel's interval."""
        integral = f"sum_over_time({hollow_name(level, self.w)}{selector}[$__range:$__interval])"
        return f"sum by ({by}) ({integral}) * $__interval_ms / 3600000"

    def sm_steps(self) -> list[tuple[float | None, str]]:
        return [(None, "red"), (self.t.hollow_sm_active, "orange"), (self.t.working_sm_active, "green")]


def _rules_check(e: Exprs, level: Level, selector: str) -> Panel:
    """A full-width strip that says plainly whether the recording rules are loaded, and the fix."""
    return Panel(
        "stat",
        "Recording rules",
        "Most panels read smlens' recording rules. This strip turns red when smlens reports GPUs but"
        f" the rules' series are missing, so that empty panels never read as idle GPUs. Fix: {RULES_FIX}.",
        [Query(e.rules_loaded(level, selector), instant=True)],
        width=24,
        height=2,
        options=CHECK_OPTIONS,
        mappings=[
            {
                "type": "value",
                "options": {
                    "1": {"text": "smlens recording rules: loaded", "color": "green", "index": 0},
                    "0": {
                        "text": "smlens recording rules NOT LOADED: panels below are empty, not zero."
                        f" Fix: {RULES_FIX}",
                        "color": "red",
                        "index": 1,
                    },
                },
            }
        ],
    )


def _ratio_panel(title: str, description: str, queries: Sequence[Query], width: int = 12) -> Panel:
    return Panel(
        "timeseries",
        title,
        description,
        queries,
        ratio=True,
        width=width,
        options=SERIES_OPTIONS,
        custom=LINES,
    )


def _stat(
    title: str,
    description: str,
    expr: str,
    ratio: bool = False,
    steps: Sequence[tuple[float | None, str]] = (),
    no_value: str = "",
) -> Panel:
    return Panel(
        "stat",
        title,
        description,
        [Query(expr, instant=True)],
        width=4,
        height=4,
        ratio=ratio,
        steps=steps,
        options=STAT_OPTIONS,
        no_value=no_value,
    )


def _joined(columns: Sequence[str]) -> list[dict[str, Any]]:
    """Transformations that join instant table queries into one row per label set: the metric name,
    which differs between queries, and the timestamp go first, then the value columns get names."""
    return [
        {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}},
        {"id": "merge", "options": {}},
        {
            "id": "organize",
            "options": {"renameByName": {f"Value #{chr(65 + i)}": name for i, name in enumerate(columns)}},
        },
    ]


def _gpu_table(
    title: str,
    description: str,
    key: tuple[str, str],
    columns: Sequence[tuple[str, str]],
    width: int = 24,
    sort_by: str | None = None,
    on: str | None = None,
    overrides: Sequence[dict[str, Any]] = (),
    no_value: str = "",
) -> Panel:
    """One row per series of the ``key`` column (name, expression); every other column is an expression
    restricted to those rows (matched on all labels, or ``on`` these). Sorted by ``sort_by``, the key
    column by default."""
    key_name, key_expr = key
    matching = f"and on ({on})" if on else "and"
    queries = [Query(key_expr, instant=True)]
    queries += [Query(f"{expr}\n{matching}\n{key_expr}", instant=True) for _, expr in columns]
    names = [key_name, *(name for name, _ in columns)]
    return Panel(
        "table",
        title,
        description,
        queries,
        ratio=True,
        width=width,
        height=10,
        options={
            "showHeader": True,
            "cellHeight": "sm",
            "sortBy": [{"displayName": sort_by or key_name, "desc": True}],
        },
        overrides=overrides,
        transformations=_joined(names),
        no_value=no_value,
    )


def _scatter(title: str, description: str, x: Query, y: Query) -> Panel:
    return Panel(
        "xychart",
        title,
        description,
        [x, y],
        ratio=True,
        options={
            "mapping": "auto",
            "series": [
                {
                    "x": {"matcher": {"id": "byName", "options": "Utilization"}},
                    "y": {"matcher": {"id": "byName", "options": "SM active"}},
                }
            ],
            "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "single", "sort": "none"},
        },
        custom={"show": "points", "pointSize": {"fixed": 8}, "pointShape": "circle"},
        transformations=_joined(["Utilization", "SM active"]),
    )


def fleet(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector()
    hollow_rule = (
        f"busy means a {t.window} mean utilization of at least {_pct(t.busy_utilization)}; hollow means busy"
        f" while SM active stays at or below {_pct(t.hollow_sm_active)}"
    )
    gpu_sel = e.selector()
    top_hollow = e.ranked("hollow", TOP_GPUS)
    in_top_gap = f"and on ({e.gpu_labels})\n{e.ranked('gap', TOP_POINTS)}"
    by_cluster = f"{{{{{t.cluster_label}}}}}"
    return dashboard(
        "smlens-fleet",
        "smlens / Fleet overview",
        "How many GPUs are busy according to NVML versus truly working according to SM activity, per"
        " cluster. Reads the cluster layer of the recording rules: its cost does not grow with the fleet.",
        [e.cluster_variable()],
        [
            Row("Recording rules", [_rules_check(e, CLUSTER, sel)]),
            Row(
                f"Busy vs truly working ({t.window} means)",
                [
                    _stat(
                        "GPUs",
                        "GPUs smlens reports in the selected clusters (each GPU once, however often it is"
                        " scraped).",
                        e.layer_count(CLUSTER, None, sel),
                    ),
                    _stat(
                        "Busy (NVML)",
                        f"GPUs whose NVML utilization ({t.window} mean) is at least"
                        f" {_pct(t.busy_utilization)}: a kernel ran most of the time. This is what most tools"
                        " call a busy GPU; it says nothing about how much of the GPU worked.",
                        e.layer_count(CLUSTER, "busy", sel),
                    ),
                    _stat(
                        "Truly working",
                        f"GPUs whose SMs were active at least {_pct(t.working_sm_active)} of the time"
                        f" ({t.window} mean): most of the chip had work.",
                        e.layer_count(CLUSTER, "working", sel),
                    ),
                    _stat(
                        "Busy but hollow",
                        f"GPUs that look busy but whose SMs are mostly idle ({hollow_rule}). Open the table"
                        " below and the runbook of GPUBusyButSMUnderused.",
                        e.layer_count(CLUSTER, "hollow", sel),
                        steps=[(None, "green"), (1, "orange")],
                    ),
                    _stat(
                        "No SM metrics",
                        "GPUs without SM-level metrics (no NVML GPM or DCGM profiling): smlens cannot tell"
                        " whether they are hollow. See the runbook of GPUProfilingMetricsUnavailable.",
                        f"sum({unprofiled_name(CLUSTER)}{sel})",
                        steps=[(None, "green"), (1, "orange")],
                    ),
                    _stat(
                        "SM efficiency",
                        "SM-active GPU-seconds per busy GPU-second over the GPUs with SM metrics: the share"
                        " of the time NVML calls busy in which the SMs really had work. Low values mean"
                        " kernels too small or too few to fill the GPUs.",
                        e.layer_mean(CLUSTER, EFFICIENCY, sel),
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                ],
            ),
            Row(
                "Utilization vs SM activity",
                [
                    _ratio_panel(
                        "Utilization vs SM active, selected clusters",
                        f"Exact {t.window} means over all selected GPUs (GPU-seconds summed, then divided)."
                        " The distance between utilization and SM active is time NVML counts as busy while"
                        " the SMs had nothing to do.",
                        [
                            Query(e.layer_mean(CLUSTER, UTILIZATION, sel), "Utilization (NVML)"),
                            Query(e.layer_mean(CLUSTER, SM_ACTIVE, sel), "SM active"),
                            Query(e.layer_mean(CLUSTER, SM_OCCUPANCY, sel), "SM occupancy"),
                            Query(e.layer_mean(CLUSTER, TENSOR_ACTIVE, sel), "Tensor active"),
                        ],
                    ),
                    Panel(
                        "timeseries",
                        "GPUs busy, working and hollow",
                        f"Counts of GPUs over time ({hollow_rule}; working means SM active of at least"
                        f" {_pct(t.working_sm_active)}). A wide band between busy and working is the hollow"
                        " share of the fleet.",
                        [
                            Query(e.layer_count(CLUSTER, "busy", sel), "busy (NVML)"),
                            Query(e.layer_count(CLUSTER, "working", sel), "truly working"),
                            Query(e.layer_count(CLUSTER, "hollow", sel), "busy but hollow"),
                        ],
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                    _ratio_panel(
                        "Utilization minus SM active, by cluster",
                        "Per cluster, the exact mean utilization minus the exact mean SM activity. Near 0:"
                        " busy time is real work. Large: GPUs run kernels that leave most SMs idle; the"
                        " nodes with the largest gap are listed below.",
                        [
                            Query(
                                f"{e.mean(CLUSTER, UTILIZATION, sel)}\n-\n{e.mean(CLUSTER, SM_ACTIVE, sel)}",
                                by_cluster,
                            )
                        ],
                    ),
                    _ratio_panel(
                        "SM efficiency by cluster",
                        "Per cluster, SM-active GPU-seconds per busy GPU-second (GPUs with SM metrics only)."
                        " 100 % means every busy moment kept the SMs working.",
                        [Query(f"{efficiency_name(CLUSTER, t.window)}{sel}", by_cluster)],
                    ),
                ],
            ),
            Row(
                "Hollow GPUs",
                [
                    _gpu_table(
                        "Top hollow GPUs",
                        f"The {TOP_GPUS} hollow GPUs with the largest gap between utilization and SM active"
                        f" ({hollow_rule}). Workload columns are filled when one container holds the GPU."
                        " Fix: see the runbook of GPUBusyButSMUnderused (batch size, CUDA graphs, input"
                        " pipeline).",
                        (GAP, top_hollow),
                        [
                            ("Utilization", e.mean(GPU, UTILIZATION, gpu_sel)),
                            ("SM active", e.mean(GPU, SM_ACTIVE, gpu_sel)),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, gpu_sel)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, gpu_sel)),
                        ],
                        on=e.gpu_labels,
                    ),
                    Panel(
                        "bargauge",
                        "Nodes with the largest gap",
                        f"The {TOP_GPUS} nodes whose exact {t.window} mean utilization exceeds their mean SM"
                        " activity the most: GPUs there look busy but leave SMs idle. Open the node"
                        " dashboard for one of them.",
                        [
                            Query(
                                f"topk({TOP_GPUS}, {e.mean(HOSTNAME, UTILIZATION, sel)}\n-\n"
                                f"{e.mean(HOSTNAME, SM_ACTIVE, sel)})",
                                "{{hostname}}",
                                instant=True,
                            )
                        ],
                        ratio=True,
                        options=BARGAUGE_OPTIONS,
                    ),
                    Panel(
                        "bargauge",
                        "Hollow GPU-hours by namespace",
                        "GPU-hours spent busy but hollow during the dashboard's time range, per namespace"
                        " ('(none)' for GPUs no workload holds). These are GPUs paid for and reported busy"
                        " that did little work.",
                        [
                            Query(
                                f"sort_desc(label_replace({e.hollow_hours(NAMESPACE, sel, 'namespace')},"
                                ' "namespace", "(none)", "namespace", ""))',
                                "{{namespace}}",
                                instant=True,
                            )
                        ],
                        unit="h",
                        options=BARGAUGE_OPTIONS,
                    ),
                    _scatter(
                        "Utilization vs SM active, GPUs with the largest gap",
                        f"One point per GPU ({t.window} means) for the {TOP_POINTS} GPUs whose utilization"
                        " exceeds their SM activity the most. Healthy GPUs sit on the diagonal; points at"
                        " the bottom right are busy but hollow.",
                        Query(f"{e.mean(GPU, UTILIZATION, gpu_sel)}\n{in_top_gap}", instant=True),
                        Query(f"{e.mean(GPU, SM_ACTIVE, gpu_sel)}\n{in_top_gap}", instant=True),
                    ),
                ],
            ),
        ],
    )


def _per_gpu_ratio(e: Exprs, mean: Mean, selector: str) -> Panel:
    title, meaning = RATIO_MEANINGS[mean]
    return _ratio_panel(
        f"{title} per GPU",
        f"{meaning} Exact mean over each graph step, from the counters.{MAPPED_MEANS}",
        [Query(e.step_mean(mean, selector, "gpu") + e.or_mapped(mean, selector), "GPU {{gpu}}")],
    )


def _hardware_row(selector: str, by_gpu: bool) -> Row:
    legend = "GPU {{gpu}}" if by_gpu else ""

    def series(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
        return Panel(
            "timeseries",
            title,
            description + NEEDS_SMLENS,
            queries,
            unit=unit,
            width=8,
            options=SERIES_OPTIONS,
            custom=LINES,
        )

    return Row(
        "Power, memory, clocks, temperature",
        [
            series(
                "Power",
                "Board power draw (and the enforced limit). A busy GPU far below its limit is often hollow or"
                " memory-bound.",
                [Query(f"gpu_power_watts{selector}", legend or "draw")]
                + ([] if by_gpu else [Query(f"gpu_power_limit_watts{selector}", "limit")]),
                "watt",
            ),
            series(
                "Memory used",
                "Framebuffer memory in use (and in total). Memory held with no kernels running is an idle"
                " allocation.",
                [Query(f"gpu_memory_used_bytes{selector}", legend or "used")]
                + ([] if by_gpu else [Query(f"gpu_memory_total_bytes{selector}", "total")]),
                "bytes",
            ),
            series(
                "SM clock",
                "Current SM clock (and its maximum, and the memory clock). Clocks below the maximum under"
                " load point at power or thermal limits; see the slowdown panel.",
                [Query(f"gpu_sm_clock_hertz{selector}", legend or "SM clock")]
                + (
                    []
                    if by_gpu
                    else [
                        Query(f"gpu_sm_clock_max_hertz{selector}", "SM clock max"),
                        Query(f"gpu_memory_clock_hertz{selector}", "memory clock"),
                    ]
                ),
                "hertz",
            ),
            series(
                "Temperature",
                "GPU core (and HBM) temperature. Sustained high values lead to thermal slowdown.",
                [Query(f"gpu_temperature_celsius{selector}", legend or "core")]
                + ([] if by_gpu else [Query(f"gpu_memory_temperature_celsius{selector}", "memory")]),
                "celsius",
            ),
            Panel(
                "state-timeline",
                "Clock slowdown (throttling)",
                "Clock-event reasons over time (1 = holding). Thermal and power-brake slowdowns cost speed"
                " and raise GPUClockSlowdown; sw_power_cap under heavy load is normal; gpu_idle just means"
                f" no work.{NEEDS_SMLENS}",
                [
                    Query(
                        f"gpu_clock_event_active{selector}",
                        "GPU {{gpu}} {{reason}}" if by_gpu else "{{reason}}",
                    )
                ],
                width=16,
                steps=[(None, "green"), (1, "red")],
                options=TIMELINE_OPTIONS,
            ),
        ],
    )


def _node_variables(e: Exprs, one_gpu: bool) -> list[Variable]:
    one_node = e.selector('hostname="$hostname"')
    gpus = f"label_values(gpu_info{one_node}, gpu)"
    return [
        e.cluster_variable(),
        Variable("hostname", "Node", f"label_values(gpu_info{e.selector()}, hostname)"),
        Variable("gpu", "GPU", gpus, multi=not one_gpu),
    ]


def node(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector('hostname="$hostname"', 'gpu=~"$gpu"')
    now_stats = [
        _stat(
            RATIO_MEANINGS[mean][0],
            f"{RATIO_MEANINGS[mean][1]} Exact {t.window} mean over the selected GPUs of this node.",
            e.layer_mean(GPU, mean, sel),
            ratio=True,
            steps=e.sm_steps() if mean is SM_ACTIVE else (),
        )
        for mean in (UTILIZATION, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)
    ]
    now_stats.append(
        _stat(
            "SM efficiency",
            "SM-active GPU-seconds per busy GPU-second on this node: how much of NVML's 'busy' was real"
            " SM work.",
            e.layer_mean(GPU, EFFICIENCY, sel),
            ratio=True,
            steps=e.sm_steps(),
        )
    )
    return dashboard(
        "smlens-node",
        "smlens / Node",
        "One node's GPUs: NVML utilization next to SM activity, occupancy, tensor and DRAM, plus power,"
        " memory, clocks and throttling.",
        _node_variables(e, one_gpu=False),
        [
            Row("Recording rules", [_rules_check(e, HOSTNAME, e.selector('hostname="$hostname"'))]),
            Row(f"This node now ({t.window} means)", now_stats),
            Row(
                "GPUs of this node",
                [
                    _gpu_table(
                        "GPUs by SM activity",
                        f"Every selected GPU with its {t.window} means, the largest gap between utilization"
                        " and SM active first. Utilization of at least"
                        f" {_pct(t.busy_utilization)} with SM active at or below {_pct(t.hollow_sm_active)}"
                        " is a hollow GPU; see the GPU dashboard and the runbook of GPUBusyButSMUnderused.",
                        ("Utilization", f"{e.mean(GPU, UTILIZATION, sel)}\n{e.current_owner(sel)}"),
                        [
                            ("SM active", e.mean(GPU, SM_ACTIVE, sel)),
                            (GAP, e.gap(sel)),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, sel)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, sel)),
                            ("DRAM active", e.mean(GPU, DRAM_ACTIVE, sel)),
                        ],
                        sort_by=GAP,
                    )
                ],
            ),
            Row("MIG instances", [_mig_instances(e, sel, gpus=NODE_GPUS_MAX)]),
            Row(
                "Activity per GPU",
                [
                    _per_gpu_ratio(e, mean, sel)
                    for mean in (UTILIZATION, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)
                ]
                + [
                    _ratio_panel(
                        "SM efficiency per GPU",
                        "SM-active seconds per busy second, per GPU, over the graph step. Low: NVML reports"
                        " busy while the SMs wait (small kernels, launch overhead, synchronisation)."
                        f"{MAPPED_MEANS}",
                        [
                            Query(
                                "sum by (gpu) (rate(gpu_sm_active_seconds_total"
                                f"{sel}[$__rate_interval]))\n/\n"
                                f"(sum by (gpu) (rate(gpu_busy_seconds_total{sel}[$__rate_interval])) > 0)"
                                f"{e.or_mapped(EFFICIENCY, sel)}",
                                "GPU {{gpu}}",
                            )
                        ],
                    )
                ],
            ),
            _hardware_row(sel, by_gpu=True),
        ],
    )


def gpu(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector('hostname="$hostname"', 'gpu="$gpu"')
    activity = [
        Query(e.step_mean(mean, sel, "gpu") + e.or_mapped(mean, sel), RATIO_MEANINGS[mean][0])
        for mean in (UTILIZATION, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)
    ]
    return dashboard(
        "smlens-gpu",
        "smlens / GPU",
        "One GPU: utilization, SM activity, occupancy, tensor and DRAM on one time axis, then power,"
        " memory, clocks, throttling and errors.",
        _node_variables(e, one_gpu=True),
        [
            Row("Recording rules", [_rules_check(e, HOSTNAME, e.selector('hostname="$hostname"'))]),
            Row(
                "This GPU",
                [
                    Panel(
                        "stat",
                        "Model",
                        "The GPU's model and driver version, from gpu_info.",
                        [Query(f"gpu_info{sel}", "{{model}} (driver {{driver_version}})", instant=True)],
                        width=8,
                        height=4,
                        options=NAME_STAT_OPTIONS,
                    ),
                    Panel(
                        "stat",
                        "SM metrics source",
                        "Where SM activity and occupancy come from: gpm (NVML GPM, Hopper and newer), dcgm"
                        " (DCGM profiling) or sim; none means only NVML utilization is known. dcgm-exporter:"
                        " the GPU is mapped from dcgm-exporter, whose SM metrics exist only with its"
                        " DCGM_FI_PROF_SM_ACTIVE field on (see the SM active stat and the runbook of"
                        " GPUDcgmExporterProfilingOff).",
                        [Query(f"gpu_profiling_available{sel}", "{{source}}{{exporter}}", instant=True)],
                        width=4,
                        height=4,
                        options=NAME_STAT_OPTIONS,
                    ),
                    _stat(
                        f"SM active ({t.window})",
                        f"{RATIO_MEANINGS[SM_ACTIVE][1]} Exact {t.window} mean.",
                        e.layer_mean(GPU, SM_ACTIVE, sel),
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                    _stat(
                        f"SM efficiency ({t.window})",
                        "SM-active seconds per busy second: the share of NVML's busy time in which the SMs"
                        " really had work.",
                        e.layer_mean(GPU, EFFICIENCY, sel),
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                    _stat(
                        "XID errors",
                        "XID errors NVML reported for this GPU since the exporter started. Any hardware XID"
                        " (48, 63, 64, 74, 79, 94, 95, 119, 120) means drain and check the GPU. smlens"
                        " exports an XID code's counter from its first occurrence, so no series means"
                        " none reported (or the GPU is not monitored: see the GPU and power rows)."
                        f"{NEEDS_SMLENS}",
                        f"sum(gpu_xid_errors_total{sel})",
                        steps=[(None, "green"), (1, "red")],
                        no_value="none reported by smlens",
                    ),
                ],
            ),
            Row(
                "Activity",
                [
                    Panel(
                        "timeseries",
                        "Utilization, SM active, occupancy, tensor, DRAM",
                        "Exact means over each graph step, from the counters. Utilization far above SM"
                        f" active (SM active below {_pct(t.hollow_sm_active)} while utilization is above"
                        f" {_pct(t.busy_utilization)}) is a hollow GPU: kernels too small or too few to fill"
                        " it. High SM active with low occupancy and idle tensor pipes is a low-occupancy"
                        " kernel. High DRAM is memory-bound work.",
                        activity,
                        ratio=True,
                        width=24,
                        height=10,
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    )
                ],
            ),
            Row("MIG instances", [_mig_instances(e, sel)]),
            _hardware_row(sel, by_gpu=False),
            Row(
                "Traffic and errors",
                [
                    Panel(
                        "timeseries",
                        "PCIe and NVLink traffic",
                        "Bytes per second over PCIe and NVLink. Heavy host-to-device traffic next to low SM"
                        f" activity points at an input pipeline the GPU waits for.{NEEDS_SMLENS}",
                        [
                            Query(f"rate(gpu_pcie_transmit_bytes_total{sel}[$__rate_interval])", "PCIe tx"),
                            Query(f"rate(gpu_pcie_receive_bytes_total{sel}[$__rate_interval])", "PCIe rx"),
                            Query(
                                f"rate(gpu_nvlink_transmit_bytes_total{sel}[$__rate_interval])", "NVLink tx"
                            ),
                            Query(
                                f"rate(gpu_nvlink_receive_bytes_total{sel}[$__rate_interval])", "NVLink rx"
                            ),
                        ],
                        unit="Bps",
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                    Panel(
                        "timeseries",
                        "ECC errors and PCIe replays",
                        "Volatile ECC error counts since the driver loaded, and PCIe replays. Any"
                        " uncorrectable error raises GPUUncorrectableECCErrors: drain and reset the GPU."
                        f" Growing replays point at a bad link or riser.{NEEDS_SMLENS}",
                        [
                            Query(f"gpu_ecc_errors_total{sel}", "ECC {{type}}"),
                            Query(f"gpu_pcie_replays_total{sel}", "PCIe replays"),
                        ],
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                ],
            ),
        ],
    )


def _mig_instances(e: Exprs, sel: str, gpus: int = 1) -> Panel:
    """The MIG instances of the selected GPUs (``gpus`` of them at most) with their window means;
    after pod churn, the current holder's row only."""
    sm, *others = INSTANCE_MEANS
    t = e.t
    scope = "this GPU" if gpus == 1 else "the selected GPUs of this node"
    labels = ", ".join((e.c, n.HOSTNAME, n.UUID, n.GPU_INSTANCE, n.MIG_UUID, *n.OWNER_LABELS))
    key = (
        f"topk({MIG_INSTANCES_MAX * gpus}, {e.mean(INSTANCE, sm, sel)})\nand on ({labels}) gpu_mig_info{sel}"
    )
    return _gpu_table(
        f"MIG instances ({t.window} means)",
        f"Each MIG GPU instance of {scope} (gpu, gpu_instance, mig_profile, mig_uuid and the pod that holds"
        f" it) with its {t.window} means, relative to the instance's own SMs. NVML gives no utilization"
        " per instance: an instance held by a pod (or with memory in use) whose SM active stays at or"
        f" below {_pct(t.hollow_sm_active)} raises GPUMigInstanceHollow. Empty, with that said, when no"
        " GPU is in MIG mode or its instances have no SM metrics (before Hopper: no GPM, so only smlens'"
        " DCGM backend or dcgm-exporter with its DCGM_FI_PROF_SM_ACTIVE field give them).",
        ("SM active", key),
        [
            (RATIO_MEANINGS[w][0], e.mean(INSTANCE, m, sel))
            for w, m in zip(INSTANCE_MEASURED[1:], others, strict=True)
        ],
        no_value=f"no MIG instances on {scope}",
    )


def _top_pods(e: Exprs, title: str, description: str, expr: str, pick: str = "topk") -> Panel:
    return _ratio_panel(
        title,
        f"{description} With many pods selected, the {TOP_GPUS} {'highest' if pick == 'topk' else 'lowest'}"
        " at each step; select pods to see them all.",
        [Query(f"{pick}({TOP_GPUS}, {expr})", "{{namespace}}/{{pod}}")],
    )


def workload(t: Thresholds) -> JSON:
    e = Exprs(t)
    c = t.cluster_label
    sel = e.selector('namespace=~"$namespace"', 'pod=~"$pod"')
    pod = NAMESPACE_POD
    pods = f"{c}, namespace, pod"
    held = f"topk({TOP_GPUS * 2}, {pod_gpus_name()}{sel})"
    attributed = e.selector('namespace=~"$namespace"', 'pod=~"$pod"', 'pod!=""')
    namespaces = Variable(
        "namespace", "Namespace", f"label_values(gpu_allocation_info{e.selector()}, namespace)", multi=True
    )
    in_namespaces = e.selector('namespace=~"$namespace"')
    pod_names = Variable("pod", "Pod", f"label_values(gpu_allocation_info{in_namespaces}, pod)", multi=True)
    gpu_key = e.ranked("pod", TOP_GPUS, 'namespace=~"$namespace"', 'pod=~"$pod"')
    return dashboard(
        "smlens-workload",
        "smlens / Workload",
        "Pods on GPUs: what they hold, how busy NVML says those GPUs are and how much SM work they do."
        " Reads the namespace/pod layer of the recording rules.",
        [e.cluster_variable(), namespaces, pod_names],
        [
            Row("Recording rules", [_rules_check(e, CLUSTER, e.selector())]),
            Row(
                f"Pods ({t.window} means)",
                [
                    _gpu_table(
                        "Pods on GPUs",
                        f"The {TOP_GPUS * 2} selected pods holding the most GPUs (from the kubelet), with the"
                        " exact means over the GPUs each holds alone. Low SM active or SM efficiency with"
                        " high utilization: the pod's kernels leave the GPU mostly idle; see the runbook"
                        " of GPUBusyButSMUnderused.",
                        ("GPUs", held),
                        [
                            ("Utilization", e.mean(pod, UTILIZATION, sel)),
                            ("SM active", e.mean(pod, SM_ACTIVE, sel)),
                            ("SM occupancy", e.mean(pod, SM_OCCUPANCY, sel)),
                            ("Tensor active", e.mean(pod, TENSOR_ACTIVE, sel)),
                            ("SM efficiency", f"{efficiency_name(pod, t.window)}{sel}"),
                        ],
                        on=pods,
                        overrides=[
                            {
                                "matcher": {"id": "byName", "options": "GPUs"},
                                "properties": [{"id": "unit", "value": "none"}],
                            }
                        ],
                    ),
                ],
            ),
            Row(
                "Over time",
                [
                    _top_pods(
                        e,
                        "Utilization per pod",
                        f"{RATIO_MEANINGS[UTILIZATION][1]} Exact {t.window} mean over the pod's GPUs.",
                        e.mean(pod, UTILIZATION, sel),
                    ),
                    _top_pods(
                        e,
                        "SM active per pod",
                        f"{RATIO_MEANINGS[SM_ACTIVE][1]} Exact {t.window} mean over the pod's GPUs. Compare"
                        " with utilization: the gap is time the GPU looked busy without SM work.",
                        e.mean(pod, SM_ACTIVE, sel),
                        pick="bottomk",
                    ),
                    _top_pods(
                        e,
                        "SM efficiency per pod",
                        "SM-active GPU-seconds per busy GPU-second over the pod's GPUs. Low: small kernels,"
                        " launch overhead, synchronisation or an input pipeline the GPU waits for.",
                        f"{efficiency_name(pod, t.window)}{sel}",
                        pick="bottomk",
                    ),
                    Panel(
                        "timeseries",
                        "GPU memory used per pod",
                        "Framebuffer memory used on the GPUs each pod holds alone. Memory held while"
                        " utilization stays near 0 is an idle allocation (GPUAllocatedButIdle). With many"
                        f" pods selected, the {TOP_GPUS} largest at each step.",
                        [Query(f"topk({TOP_GPUS}, {pod_memory_name()}{sel})", "{{namespace}}/{{pod}}")],
                        unit="bytes",
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                    Panel(
                        "bargauge",
                        "Hollow GPU-hours per pod",
                        f"GPU-hours each pod's GPUs spent busy but hollow during the dashboard's range (busy:"
                        f" utilization of at least {_pct(t.busy_utilization)}; hollow: SM active at or below"
                        f" {_pct(t.hollow_sm_active)}; {t.window} means); the {TOP_GPUS} largest.",
                        [
                            Query(
                                f"sort_desc(topk({TOP_GPUS}, {e.hollow_hours(pod, attributed, pods)}))",
                                "{{namespace}}/{{pod}}",
                                instant=True,
                            )
                        ],
                        unit="h",
                        width=12,
                        options=BARGAUGE_OPTIONS,
                    ),
                    _gpu_table(
                        "GPUs of the selected pods",
                        f"The {TOP_GPUS} GPUs held alone by a selected pod with the largest gap between"
                        f" utilization and SM active, with their {t.window} means.",
                        (GAP, gpu_key),
                        [
                            ("Utilization", e.mean(GPU, UTILIZATION, attributed)),
                            ("SM active", e.mean(GPU, SM_ACTIVE, attributed)),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, attributed)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, attributed)),
                            ("DRAM active", e.mean(GPU, DRAM_ACTIVE, attributed)),
                        ],
                        on=e.gpu_labels,
                        width=12,
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = {
    "smlens-fleet.json": fleet,
    "smlens-node.json": node,
    "smlens-gpu.json": gpu,
    "smlens-workload.json": workload,
}


def dashboard_files(t: Thresholds) -> dict[str, str]:
    """File name to content: the dashboards for these thresholds."""
    return {name: render(build(t)) for name, build in DASHBOARDS.items()}
