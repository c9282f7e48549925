"""What several dashboards share: the texts that explain the means, the recording-rules check, and the
node and GPU dashboards' variables, MIG table and hardware row."""

from __future__ import annotations

from collections.abc import Sequence

from smlens import names as n
from smlens.bundle.dashboards.panels import CHECK_OPTIONS, TIMELINE_OPTIONS, scatter, series, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.grafana import Panel, Query, Row, Variable
from smlens.bundle.layers import INSTANCE, Level
from smlens.bundle.series import (
    DRAM_ACTIVE_MEAN,
    INSTANCE_MEANS,
    INSTANCE_MEASURED,
    SM_ACTIVE_MEAN,
    SM_OCCUPANCY_MEAN,
    TENSOR_ACTIVE_MEAN,
    UTILIZATION_MEAN,
)
from smlens.formatting import percent

GAP = "Utilization - SM active"
MIG_INSTANCES_MAX = 7  # GPU instances of one GPU at most (seven 1g slices on A100, H100, H200)
# Said by every panel that reads series only smlens exports: the dcgm-exporter mapping
# (rules/smlens-dcgm-exporter.rules.yaml) gives GPUs its per-GPU means, not these.
NEEDS_SMLENS = (
    " Needs smlens on the node: GPUs mapped from dcgm-exporter have no such series here (dcgm-exporter's"
    " own DCGM_FI_DEV_* metrics carry them)."
)


def optional_group(*groups: str) -> str:
    """Says which metric groups outside smlens' default set a panel's extra series need."""
    added = ", ".join(groups)
    return f" The extra series are not exported by default: add {added} to --metrics (Helm value metrics)."


MAPPED_MEANS = (
    " GPUs mapped from dcgm-exporter have no counters: they show the mapping's recorded window means"
    " (means of scrape samples) instead."
)
RULES_FIX = (
    "load rules/smlens-recording.rules.yaml and rules/smlens-alerts.rules.yaml into Prometheus; with"
    " the Helm chart and kube-prometheus-stack, give the PrometheusRule the label your Prometheus"
    " selects (monitoring.prometheusRule.labels, e.g. release: <your kube-prometheus-stack release>)"
)

# Each mean's title and what it means.
RATIO_MEANINGS = {
    UTILIZATION_MEAN: (
        "Utilization (NVML)",
        "NVML utilization: the share of time at least one kernel ran. One kernel on one SM reads 100 %, so"
        " on its own it does not say how much of the GPU worked; read it next to SM active.",
    ),
    SM_ACTIVE_MEAN: (
        "SM active",
        "Share of SM cycles with at least one warp resident, averaged over all SMs: how much of the GPU"
        " had work.",
    ),
    SM_OCCUPANCY_MEAN: (
        "SM occupancy",
        "Resident warps over the maximum warps per SM. Low occupancy with busy tensor pipes is normal for"
        " large GEMMs; low occupancy with idle tensor pipes leaves latency unhidden.",
    ),
    TENSOR_ACTIVE_MEAN: ("Tensor active", "Share of cycles any tensor pipe was active (matrix math)."),
    DRAM_ACTIVE_MEAN: (
        "DRAM active",
        "Share of cycles the device memory interface was busy: near 100 % the work is memory-bound.",
    ),
}


RULES_STRIP = "Recording rules"


def rules_check(e: Exprs, level: Level, selector: str) -> Panel:
    """A full-width strip that says plainly whether the recording rules are loaded, and the fix."""
    loaded = {"text": "smlens recording rules: loaded", "color": "green", "index": 0}
    missing = {
        "text": f"smlens recording rules NOT LOADED: panels below are empty, not zero. Fix: {RULES_FIX}",
        "color": "red",
        "index": 1,
    }
    return Panel(
        "stat",
        RULES_STRIP,
        "Most panels read smlens' recording rules. This strip turns red when smlens reports GPUs but"
        f" the rules' series are missing, so that empty panels never read as idle GPUs. Fix: {RULES_FIX}.",
        [Query(e.rules_loaded(level, selector), instant=True)],
        width=24,
        height=2,
        options=CHECK_OPTIONS,
        mappings=[{"type": "value", "options": {"1": loaded, "0": missing}}],
    )


def node_variables(e: Exprs, one_gpu: bool) -> list[Variable]:
    one_node = e.selector('hostname="$hostname"')
    gpus = f"label_values({n.GPU_INFO}{one_node}, gpu)"
    return [
        e.cluster_variable(),
        Variable("hostname", "Node", f"label_values({n.GPU_INFO}{e.selector()}, hostname)"),
        Variable("gpu", "GPU", gpus, multi=not one_gpu),
    ]


def mig_instances(e: Exprs, sel: str, gpus: int = 1) -> Panel:
    """The MIG instances of the selected GPUs (``gpus`` of them at most) with their window means;
    after pod churn, the current holder's row only."""
    sm, *others = INSTANCE_MEANS
    t = e.t
    scope = "this GPU" if gpus == 1 else "the selected GPUs of this node"
    labels = ", ".join((e.c, n.HOSTNAME, n.UUID, n.GPU_INSTANCE, n.MIG_UUID, *n.OWNER_LABELS))
    top = f"topk({MIG_INSTANCES_MAX * gpus}, {e.mean(INSTANCE, sm, sel)})"
    key = f"{top}\nand on ({labels}) {n.GPU_MIG_INFO}{sel}"
    return table(
        f"MIG instances ({t.window} means)",
        f"Each MIG GPU instance of {scope} (gpu, gpu_instance, mig_profile, mig_uuid and the pod that holds"
        f" it) with its {t.window} means, relative to the instance's own SMs. NVML gives no utilization"
        " per instance: an instance held by a pod (or with memory in use) whose SM active stays at or"
        f" below {percent(t.hollow_sm_active, 0)} raises GPUMigInstanceHollow. Empty, with that said, when"
        " no GPU is in MIG mode or its instances have no SM metrics (before Hopper: no GPM, so only smlens'"
        " DCGM backend or dcgm-exporter with its DCGM_FI_PROF_SM_ACTIVE field give them).",
        ("SM active", key),
        [
            (RATIO_MEANINGS[w][0], e.mean(INSTANCE, m, sel))
            for w, m in zip(INSTANCE_MEASURED[1:], others, strict=True)
        ],
        no_value=f"no MIG instances on {scope}",
    )


def _gauges(
    selector: str, by_gpu: bool, own: tuple[str, str], more: Sequence[tuple[str, str]] = ()
) -> list[Query]:
    """One query per GPU of a gauge (``own``: name and its legend for the whole node), or, for one
    GPU, that gauge and the ``more`` that go with it."""
    name, legend = own
    queries = [Query(f"{name}{selector}", "GPU {{gpu}}" if by_gpu else legend)]
    return queries if by_gpu else queries + [Query(f"{m}{selector}", lg) for m, lg in more]


def _hardware(title: str, description: str, queries: Sequence[Query], unit: str) -> Panel:
    return series(title, description + NEEDS_SMLENS, queries, unit=unit, width=8)


def _slowdown(selector: str, by_gpu: bool) -> Panel:
    return Panel(
        "state-timeline",
        "Clock slowdown (throttling)",
        "Clock-event reasons over time (1 = holding). Thermal and power-brake slowdowns cost speed"
        " and raise GPUClockSlowdown. The other reasons (sw_power_cap, normal under heavy load, gpu_idle,"
        f" sync_boost...) come with the clock_events metric group.{NEEDS_SMLENS}",
        [
            Query(
                f"{n.GPU_CLOCK_EVENT_ACTIVE}{selector}",
                "GPU {{gpu}} {{reason}}" if by_gpu else "{{reason}}",
            )
        ],
        width=16,
        steps=[(None, "green"), (1, "red")],
        options=TIMELINE_OPTIONS,
    )


def hardware_row(selector: str, by_gpu: bool) -> Row:
    """Power, memory, clocks and temperature: per GPU (``by_gpu``), or of one GPU with its limits."""
    power = _gauges(selector, by_gpu, (n.GPU_POWER_WATTS, "draw"), [(n.GPU_POWER_LIMIT_WATTS, "limit")])
    memory = _gauges(
        selector, by_gpu, (n.GPU_MEMORY_USED_BYTES, "used"), [(n.GPU_MEMORY_TOTAL_BYTES, "total")]
    )
    clocks = [(n.GPU_SM_CLOCK_MAX_HERTZ, "SM clock max"), (n.GPU_MEMORY_CLOCK_HERTZ, "memory clock")]
    clock = _gauges(selector, by_gpu, (n.GPU_SM_CLOCK_HERTZ, "SM clock"), clocks)
    temperature = _gauges(
        selector,
        by_gpu,
        (n.GPU_TEMPERATURE_CELSIUS, "core"),
        [(n.GPU_MEMORY_TEMPERATURE_CELSIUS, "memory")],
    )
    return Row(
        "Power, memory, clocks, temperature",
        [
            _hardware(
                "Power",
                "Board power draw (and the enforced limit). A busy GPU far below its limit is often hollow"
                " or memory-bound." + ("" if by_gpu else optional_group("limits")),
                power,
                "watt",
            ),
            _hardware(
                "Memory used",
                "Framebuffer memory in use (and in total). Memory held with no kernels running is an idle"
                " allocation.",
                memory,
                "bytes",
            ),
            _hardware(
                "SM clock",
                "Current SM clock (and its maximum, and the memory clock). Clocks below the maximum under"
                " load point at power or thermal limits; see the slowdown panel."
                + ("" if by_gpu else optional_group("limits", "device_memory")),
                clock,
                "hertz",
            ),
            _hardware(
                "Temperature",
                "GPU core (and HBM) temperature. Sustained high values lead to thermal slowdown."
                + ("" if by_gpu else optional_group("device_memory")),
                temperature,
                "celsius",
            ),
            _slowdown(selector, by_gpu),
        ],
    )


ROOFLINE_AXES = ("Memory SOL", "Compute SOL")


def roofline(e: Exprs, selector: str, worst: int | None) -> Panel:
    """Compute against memory speed of light, a point per GPU (the ``worst`` busy ones, or all)."""
    t = e.t
    x, y = e.roofline(selector, worst)
    which = (
        f"the {worst} busy and stalled GPUs farthest from the compute roof (GPUBusyButStalled's)"
        if worst is not None
        else "each GPU"
    )
    return scatter(
        "Compute against memory speed of light",
        f"One point for {which}, {t.window} means: the busiest compute pipe, tick by tick (y), against DRAM"
        f" bandwidth used (x). At the top (at least {percent(t.compute_bound_pipe, 0)}): compute-bound; at"
        f" the right (at least {percent(t.memory_bound_dram, 0)}): memory-bound; near the origin with its SMs"
        " active: stalled, waiting on latency, synchronisation or small kernels (GPUBusyButStalled)."
        + NEEDS_SMLENS,
        Query(x, instant=True),
        Query(y, instant=True),
        axes=ROOFLINE_AXES,
    )
