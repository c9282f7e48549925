"""The Grafana dashboards: fleet overview, node, single GPU and workload, generated from the thresholds.

Panels about "now" and about many GPUs read the recording rules (exact means over the rule window);
time series of one node or one GPU compute exact means per graph step from the raw counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smlens.bundle.grafana import JSON, Panel, Query, Row, Variable, dashboard, render
from smlens.bundle.rules import (
    DRAM_ACTIVE,
    GPU,
    HOSTNAME,
    NAMESPACE_POD,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    UTILIZATION,
    Level,
    Mean,
    efficiency_name,
    hollow_name,
    mean_name,
    number,
    rate_name,
)
from smlens.thresholds import Thresholds

STAT_OPTIONS = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "value",
    "graphMode": "area",
    "justifyMode": "auto",
    "orientation": "auto",
    "textMode": "auto",
}
NAME_STAT_OPTIONS = {**STAT_OPTIONS, "graphMode": "none", "textMode": "name", "colorMode": "none"}
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
NODE = Variable("hostname", "Node", "label_values(gpu_info, hostname)")
NODES = Variable("hostname", "Node", "label_values(gpu_info, hostname)", multi=True)
NODE_GPUS = Variable("gpu", "GPU", 'label_values(gpu_info{hostname="$hostname"}, gpu)', multi=True)
ONE_GPU = Variable("gpu", "GPU", 'label_values(gpu_info{hostname="$hostname"}, gpu)')
NAMESPACES = Variable("namespace", "Namespace", "label_values(gpu_allocation_info, namespace)", multi=True)
PODS = Variable("pod", "Pod", 'label_values(gpu_allocation_info{namespace=~"$namespace"}, pod)', multi=True)

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

    def mean(self, level: Level, mean: Mean, selector: str = "") -> str:
        return f"{mean_name(level, mean, self.w)}{selector}"

    def selected_mean(self, mean: Mean, selector: str, by: str = "") -> str:
        """Exact window mean over the selected GPUs: summed numerators over summed denominators."""
        numerator = f"sum{by} ({rate_name(mean.numerator, self.w)}{selector})"
        denominator = f"sum{by} ({rate_name(mean.denominator, self.w)}{selector})"
        return f"{numerator}\n/\n({denominator} > 0)"

    def selected_efficiency(self, selector: str) -> str:
        sm = rate_name(SM_ACTIVE.numerator, self.w)
        busy = rate_name(UTILIZATION.numerator, self.w)
        return f"sum({sm}{selector})\n/\n(sum({busy}{selector} and {sm}) > 0)"

    @staticmethod
    def step_mean(mean: Mean, selector: str, by: str) -> str:
        """Exact mean over each graph step, straight from the counters."""
        numerator = f"sum by ({by}) (rate({mean.numerator}_total{selector}[$__rate_interval]))"
        denominator = f"sum by ({by}) (rate({mean.denominator}_total{selector}[$__rate_interval]))"
        return f"{numerator}\n/\n({denominator} > 0)"

    @staticmethod
    def count_gpus(expr: str) -> str:
        return f"count(count by (hostname, uuid) ({expr})) or vector(0)"

    def busy(self, selector: str) -> str:
        return f"{self.mean(GPU, UTILIZATION, selector)} >= {number(self.t.busy_utilization)}"

    def working(self, selector: str) -> str:
        return f"{self.mean(GPU, SM_ACTIVE, selector)} >= {number(self.t.working_sm_active)}"

    def hollow(self, selector: str) -> str:
        return f"{hollow_name(GPU, self.w)}{selector} > 0"

    def hollow_hours(self, selector: str, by: str) -> str:
        """GPU-hours spent hollow over the dashboard range, integrated at the panel's interval."""
        integral = f"sum_over_time({hollow_name(GPU, self.w)}{selector}[$__range:$__interval])"
        return f"sum by ({by}) ({integral}) * $__interval_ms / 3600000"

    def sm_steps(self) -> list[tuple[float | None, str]]:
        return [(None, "red"), (self.t.hollow_sm_active, "orange"), (self.t.working_sm_active, "green")]


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
) -> Panel:
    """One row per GPU series of the ``key`` column (name, expression); every other column is a per-GPU
    expression restricted to those rows. Sorted by ``sort_by``, the key column by default."""
    key_name, key_expr = key
    queries = [Query(key_expr, instant=True)]
    queries += [Query(f"{expr}\nand\n{key_expr}", instant=True) for _, expr in columns]
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
        transformations=_joined(names),
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
    sel = '{hostname=~"$hostname"}'
    hollow_rule = (
        f"busy means a {t.window} mean utilization of at least {_pct(t.busy_utilization)}; hollow means busy"
        f" while SM active stays at or below {_pct(t.hollow_sm_active)}"
    )
    gap = f"{e.mean(GPU, UTILIZATION, sel)} - {e.mean(GPU, SM_ACTIVE, sel)}"
    top_hollow = f"topk(20, {gap}\nand\n{e.hollow(sel)})"
    return dashboard(
        "smlens-fleet",
        "smlens / Fleet overview",
        "How many GPUs are busy according to NVML versus truly working according to SM activity.",
        [NODES],
        [
            Row(
                f"Busy vs truly working ({t.window} means)",
                [
                    _stat(
                        "GPUs", "GPUs smlens reports on the selected nodes.", e.count_gpus(f"gpu_info{sel}")
                    ),
                    _stat(
                        "Busy (NVML)",
                        f"GPUs whose NVML utilization ({t.window} mean) is at least"
                        f" {_pct(t.busy_utilization)}: a kernel ran most of the time. This is what most tools"
                        " call a busy GPU; it says nothing about how much of the GPU worked.",
                        e.count_gpus(e.busy(sel)),
                    ),
                    _stat(
                        "Truly working",
                        f"GPUs whose SMs were active at least {_pct(t.working_sm_active)} of the time"
                        f" ({t.window} mean): most of the chip had work.",
                        e.count_gpus(e.working(sel)),
                    ),
                    _stat(
                        "Busy but hollow",
                        f"GPUs that look busy but whose SMs are mostly idle ({hollow_rule}). Open the table"
                        " below and the runbook of GPUBusyButSMUnderused.",
                        e.count_gpus(e.hollow(sel)),
                        steps=[(None, "green"), (1, "orange")],
                    ),
                    _stat(
                        "No SM metrics",
                        "GPUs without SM-level metrics (no NVML GPM or DCGM profiling): smlens cannot tell"
                        " whether they are hollow. See the runbook of GPUProfilingMetricsUnavailable.",
                        e.count_gpus(f"gpu_profiling_available{sel} == 0"),
                        steps=[(None, "green"), (1, "orange")],
                    ),
                    _stat(
                        "SM efficiency",
                        "SM-active GPU-seconds per busy GPU-second over the GPUs with SM metrics: the share"
                        " of the time NVML calls busy in which the SMs really had work. Low values mean"
                        " kernels too small or too few to fill the GPUs.",
                        e.selected_efficiency(sel),
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                ],
            ),
            Row(
                "Utilization vs SM activity",
                [
                    _ratio_panel(
                        "Utilization vs SM active, selected nodes",
                        f"Exact {t.window} means over all selected GPUs (GPU-seconds summed, then divided)."
                        " The distance between utilization and SM active is time NVML counts as busy while"
                        " the SMs had nothing to do.",
                        [
                            Query(e.selected_mean(UTILIZATION, sel), "Utilization (NVML)"),
                            Query(e.selected_mean(SM_ACTIVE, sel), "SM active"),
                            Query(e.selected_mean(SM_OCCUPANCY, sel), "SM occupancy"),
                            Query(e.selected_mean(TENSOR_ACTIVE, sel), "Tensor active"),
                        ],
                    ),
                    Panel(
                        "timeseries",
                        "GPUs busy, working and hollow",
                        f"Counts of GPUs over time ({hollow_rule}; working means SM active of at least"
                        f" {_pct(t.working_sm_active)}). A wide band between busy and working is the hollow"
                        " share of the fleet.",
                        [
                            Query(e.count_gpus(e.busy(sel)), "busy (NVML)"),
                            Query(e.count_gpus(e.working(sel)), "truly working"),
                            Query(e.count_gpus(e.hollow(sel)), "busy but hollow"),
                        ],
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                    _ratio_panel(
                        "Utilization minus SM active, by node",
                        "Per node, the exact mean utilization minus the exact mean SM activity. Near 0:"
                        " busy time is real work. Large: the node's GPUs run kernels that leave most SMs"
                        " idle; look at the node dashboard.",
                        [
                            Query(
                                f"{e.mean(HOSTNAME, UTILIZATION, sel)}\n-\n"
                                f"{e.mean(HOSTNAME, SM_ACTIVE, sel)}",
                                "{{hostname}}",
                            )
                        ],
                    ),
                    _ratio_panel(
                        "SM efficiency by node",
                        "Per node, SM-active GPU-seconds per busy GPU-second (GPUs with SM metrics only)."
                        " 100 % means every busy moment kept the SMs working.",
                        [Query(f"{efficiency_name(HOSTNAME, t.window)}{sel}", "{{hostname}}")],
                    ),
                ],
            ),
            Row(
                "Hollow GPUs",
                [
                    _gpu_table(
                        "Top hollow GPUs",
                        "The 20 hollow GPUs with the largest gap between utilization and SM active"
                        f" ({hollow_rule}). Workload columns are filled when one container holds the GPU."
                        " Fix: see the runbook of GPUBusyButSMUnderused (batch size, CUDA graphs, input"
                        " pipeline).",
                        (GAP, top_hollow),
                        [
                            ("Utilization", e.mean(GPU, UTILIZATION, sel)),
                            ("SM active", e.mean(GPU, SM_ACTIVE, sel)),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, sel)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, sel)),
                        ],
                    ),
                    Panel(
                        "bargauge",
                        "Hollow GPU-hours by namespace",
                        "GPU-hours spent busy but hollow during the dashboard's time range, per namespace"
                        " ('(none)' for GPUs no workload holds). These are GPUs paid for and reported busy"
                        " that did little work.",
                        [
                            Query(
                                f"sort_desc(label_replace({e.hollow_hours(sel, 'namespace')},"
                                ' "namespace", "(none)", "namespace", ""))',
                                "{{namespace}}",
                                instant=True,
                            )
                        ],
                        unit="h",
                        options=BARGAUGE_OPTIONS,
                    ),
                    _scatter(
                        "Utilization vs SM active, per GPU",
                        f"One point per GPU ({t.window} means). Healthy GPUs sit on the diagonal; points"
                        " at the bottom right are busy but hollow; points at the bottom left are idle.",
                        Query(e.mean(GPU, UTILIZATION, sel), instant=True),
                        Query(e.mean(GPU, SM_ACTIVE, sel), instant=True),
                    ),
                ],
            ),
        ],
    )


def _per_gpu_ratio(e: Exprs, mean: Mean, selector: str) -> Panel:
    title, meaning = RATIO_MEANINGS[mean]
    return _ratio_panel(
        f"{title} per GPU",
        f"{meaning} Exact mean over each graph step, from the counters.",
        [Query(e.step_mean(mean, selector, "gpu"), "GPU {{gpu}}")],
    )


def _hardware_row(selector: str, by_gpu: bool) -> Row:
    legend = "GPU {{gpu}}" if by_gpu else ""

    def series(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
        return Panel(
            "timeseries",
            title,
            description,
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
                " no work.",
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


def node(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = '{hostname="$hostname", gpu=~"$gpu"}'
    now_stats = [
        _stat(
            RATIO_MEANINGS[mean][0],
            f"{RATIO_MEANINGS[mean][1]} Exact {t.window} mean over the selected GPUs of this node.",
            e.selected_mean(mean, sel),
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
            e.selected_efficiency(sel),
            ratio=True,
            steps=e.sm_steps(),
        )
    )
    return dashboard(
        "smlens-node",
        "smlens / Node",
        "One node's GPUs: NVML utilization next to SM activity, occupancy, tensor and DRAM, plus power,"
        " memory, clocks and throttling.",
        [NODE, NODE_GPUS],
        [
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
                        ("Utilization", e.mean(GPU, UTILIZATION, sel)),
                        [
                            ("SM active", e.mean(GPU, SM_ACTIVE, sel)),
                            (GAP, f"{e.mean(GPU, UTILIZATION, sel)} - {e.mean(GPU, SM_ACTIVE, sel)}"),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, sel)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, sel)),
                            ("DRAM active", e.mean(GPU, DRAM_ACTIVE, sel)),
                        ],
                        sort_by=GAP,
                    )
                ],
            ),
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
                        " busy while the SMs wait (small kernels, launch overhead, synchronisation).",
                        [
                            Query(
                                "sum by (gpu) (rate(gpu_sm_active_seconds_total"
                                f"{sel}[$__rate_interval]))\n/\n"
                                f"(sum by (gpu) (rate(gpu_busy_seconds_total{sel}[$__rate_interval])) > 0)",
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
    sel = '{hostname="$hostname", gpu="$gpu"}'
    activity = [
        Query(e.step_mean(mean, sel, "gpu"), RATIO_MEANINGS[mean][0])
        for mean in (UTILIZATION, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE)
    ]
    return dashboard(
        "smlens-gpu",
        "smlens / GPU",
        "One GPU: utilization, SM activity, occupancy, tensor and DRAM on one time axis, then power,"
        " memory, clocks, throttling and errors.",
        [NODE, ONE_GPU],
        [
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
                        " (DCGM profiling) or sim; none means only NVML utilization is known.",
                        [Query(f"gpu_profiling_available{sel}", "{{source}}", instant=True)],
                        width=4,
                        height=4,
                        options=NAME_STAT_OPTIONS,
                    ),
                    _stat(
                        f"SM active ({t.window})",
                        f"{RATIO_MEANINGS[SM_ACTIVE][1]} Exact {t.window} mean.",
                        e.mean(GPU, SM_ACTIVE, sel),
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                    _stat(
                        f"SM efficiency ({t.window})",
                        "SM-active seconds per busy second: the share of NVML's busy time in which the SMs"
                        " really had work.",
                        efficiency_name(GPU, t.window) + sel,
                        ratio=True,
                        steps=e.sm_steps(),
                    ),
                    _stat(
                        "XID errors",
                        "XID errors NVML reported for this GPU since the exporter started. Any hardware XID"
                        " (48, 63, 64, 74, 79, 94, 95, 119, 120) means drain and check the GPU.",
                        f"sum(gpu_xid_errors_total{sel}) or sum(0 * gpu_up{sel})",
                        steps=[(None, "green"), (1, "red")],
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
            _hardware_row(sel, by_gpu=False),
            Row(
                "Traffic and errors",
                [
                    Panel(
                        "timeseries",
                        "PCIe and NVLink traffic",
                        "Bytes per second over PCIe and NVLink. Heavy host-to-device traffic next to low SM"
                        " activity points at an input pipeline the GPU waits for.",
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
                        " Growing replays point at a bad link or riser.",
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


def workload(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = '{namespace=~"$namespace", pod=~"$pod"}'
    pod = NAMESPACE_POD
    held = f"count by (namespace, pod) (gpu_allocation_info{sel})"
    return dashboard(
        "smlens-workload",
        "smlens / Workload",
        "Pods on GPUs: what they hold, how busy NVML says those GPUs are and how much SM work they do.",
        [NAMESPACES, PODS],
        [
            Row(
                f"Pods ({t.window} means)",
                [
                    Panel(
                        "table",
                        "Pods on GPUs",
                        "GPUs each pod holds (from the kubelet) and the exact means over the GPUs it holds"
                        " alone. Low SM active or SM efficiency with high utilization: the pod's kernels"
                        " leave the GPU mostly idle; see the runbook of GPUBusyButSMUnderused.",
                        [
                            Query(held, instant=True),
                            Query(e.mean(pod, UTILIZATION, sel), instant=True),
                            Query(e.mean(pod, SM_ACTIVE, sel), instant=True),
                            Query(e.mean(pod, SM_OCCUPANCY, sel), instant=True),
                            Query(e.mean(pod, TENSOR_ACTIVE, sel), instant=True),
                            Query(f"{efficiency_name(pod, t.window)}{sel}", instant=True),
                        ],
                        width=24,
                        height=10,
                        options={
                            "showHeader": True,
                            "cellHeight": "sm",
                            "sortBy": [{"displayName": "GPUs", "desc": True}],
                        },
                        ratio=True,
                        overrides=[
                            {
                                "matcher": {"id": "byName", "options": "GPUs"},
                                "properties": [{"id": "unit", "value": "none"}],
                            }
                        ],
                        transformations=_joined(
                            [
                                "GPUs",
                                "Utilization",
                                "SM active",
                                "SM occupancy",
                                "Tensor active",
                                "SM efficiency",
                            ]
                        ),
                    ),
                ],
            ),
            Row(
                "Over time",
                [
                    _ratio_panel(
                        "Utilization per pod",
                        f"{RATIO_MEANINGS[UTILIZATION][1]} Exact {t.window} mean over the pod's GPUs.",
                        [Query(e.mean(pod, UTILIZATION, sel), "{{namespace}}/{{pod}}")],
                    ),
                    _ratio_panel(
                        "SM active per pod",
                        f"{RATIO_MEANINGS[SM_ACTIVE][1]} Exact {t.window} mean over the pod's GPUs. Compare"
                        " with utilization: the gap is time the GPU looked busy without SM work.",
                        [Query(e.mean(pod, SM_ACTIVE, sel), "{{namespace}}/{{pod}}")],
                    ),
                    _ratio_panel(
                        "SM efficiency per pod",
                        "SM-active GPU-seconds per busy GPU-second over the pod's GPUs. Low: small kernels,"
                        " launch overhead, synchronisation or an input pipeline the GPU waits for.",
                        [Query(f"{efficiency_name(pod, t.window)}{sel}", "{{namespace}}/{{pod}}")],
                    ),
                    Panel(
                        "timeseries",
                        "GPU memory used per pod",
                        "Framebuffer memory used on the GPUs each pod holds alone. Memory held while"
                        " utilization stays near 0 is an idle allocation (GPUAllocatedButIdle).",
                        [
                            Query(
                                f"sum by (namespace, pod) (gpu_memory_used_bytes{sel})",
                                "{{namespace}}/{{pod}}",
                            )
                        ],
                        unit="bytes",
                        options=SERIES_OPTIONS,
                        custom=LINES,
                    ),
                    Panel(
                        "bargauge",
                        "Hollow GPU-hours per pod",
                        f"GPU-hours each pod's GPUs spent busy but hollow during the dashboard's range (busy:"
                        f" utilization of at least {_pct(t.busy_utilization)}; hollow: SM active at or below"
                        f" {_pct(t.hollow_sm_active)}; {t.window} means).",
                        [
                            Query(
                                f"sort_desc({e.hollow_hours(sel, 'namespace, pod')})",
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
                        f"Each GPU a selected pod holds alone, with its {t.window} means.",
                        ("Utilization", e.mean(GPU, UTILIZATION, sel)),
                        [
                            ("SM active", e.mean(GPU, SM_ACTIVE, sel)),
                            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY, sel)),
                            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE, sel)),
                            ("DRAM active", e.mean(GPU, DRAM_ACTIVE, sel)),
                        ],
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
