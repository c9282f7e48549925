"""The GPU dashboard: one GPU's utilization, SM activity, occupancy, tensor and DRAM on one time axis,
then power, memory, clocks, throttling and errors."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.dashboards.panels import name_stat, series, stat
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import (
    NEEDS_SMLENS,
    RATIO_MEANINGS,
    hardware_row,
    mig_instances,
    node_variables,
    optional_group,
    rules_check,
)
from smlens.bundle.grafana import JSON, Panel, Query, Row, dashboard
from smlens.bundle.layers import EFFICIENCY, GPU, HOSTNAME
from smlens.bundle.promql import total
from smlens.bundle.series import MEANS, SM_ACTIVE_MEAN
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds


def _identity(sel: str) -> list[Panel]:
    model = name_stat(
        "Model",
        f"The GPU's model and driver version, from {n.GPU_INFO}.",
        Query(f"{n.GPU_INFO}{sel}", "{{model}} (driver {{driver_version}})", instant=True),
        width=8,
    )
    source = name_stat(
        "SM metrics source",
        "Where SM activity and occupancy come from: gpm (NVML GPM, Hopper and newer), dcgm (DCGM"
        " profiling) or sim; none means only NVML utilization is known. dcgm-exporter: the GPU is mapped"
        " from dcgm-exporter, whose SM metrics exist only with its DCGM_FI_PROF_SM_ACTIVE field on (see"
        " the SM active stat and the runbook of GPUDcgmExporterProfilingOff).",
        Query(f"{n.GPU_PROFILING_AVAILABLE}{sel}", "{{source}}{{exporter}}", instant=True),
        width=4,
    )
    return [model, source]


def _now_stats(e: Exprs, sel: str) -> list[Panel]:
    sm = stat(
        f"SM active ({e.w})",
        f"{RATIO_MEANINGS[SM_ACTIVE_MEAN][1]} Exact {e.w} mean.",
        e.layer_mean(GPU, SM_ACTIVE_MEAN, sel),
        ratio=True,
        steps=e.sm_steps(),
    )
    efficiency = stat(
        f"SM efficiency ({e.w})",
        "SM-active seconds per busy second: the share of NVML's busy time in which the SMs really had work.",
        e.layer_mean(GPU, EFFICIENCY, sel),
        ratio=True,
        steps=e.sm_steps(),
    )
    xids = stat(
        "XID errors",
        "XID errors NVML reported for this GPU since the exporter started. Any hardware XID (48, 63, 64,"
        " 74, 79, 94, 95, 119, 120) means drain and check the GPU. smlens exports an XID code's counter"
        " from its first occurrence, so no series means none reported (or the GPU is not monitored: see"
        f" the GPU and power rows).{NEEDS_SMLENS}",
        f"sum({total(n.GPU_XID_ERRORS)}{sel})",
        steps=[(None, "green"), (1, "red")],
        no_value="none reported by smlens",
    )
    return [sm, efficiency, xids]


def _activity(e: Exprs, sel: str) -> Panel:
    t = e.t
    queries = [
        Query(e.step_mean(mean, sel, "gpu") + e.or_mapped(mean, sel), RATIO_MEANINGS[mean][0])
        for mean in MEANS
    ]
    return series(
        "Utilization, SM active, occupancy, tensor, DRAM",
        "Exact means over each graph step, from the counters. Utilization far above SM active (SM active"
        f" below {percent(t.hollow_sm_active, 0)} while utilization is above"
        f" {percent(t.busy_utilization, 0)}) is a hollow GPU: kernels too small or too few to fill it."
        " High SM active with low occupancy and idle tensor pipes is a low-occupancy kernel. High DRAM is"
        " memory-bound work.",
        queries,
        width=24,
        height=10,
        ratio=True,
    )


def _traffic_and_errors(e: Exprs, sel: str) -> list[Panel]:
    links = [
        (n.GPU_PCIE_TRANSMIT_BYTES, "PCIe tx"),
        (n.GPU_PCIE_RECEIVE_BYTES, "PCIe rx"),
        (n.GPU_NVLINK_TRANSMIT_BYTES, "NVLink tx"),
        (n.GPU_NVLINK_RECEIVE_BYTES, "NVLink rx"),
    ]
    traffic = series(
        "PCIe and NVLink traffic",
        "Bytes per second over PCIe and NVLink. Heavy host-to-device traffic next to low SM activity"
        f" points at an input pipeline the GPU waits for.{optional_group('pcie', 'nvlink')}{NEEDS_SMLENS}",
        [Query(e.rate(counter, sel), legend) for counter, legend in links],
        unit="Bps",
        no_value="not exported: add pcie and nvlink to --metrics",
    )
    errors = series(
        "ECC errors and PCIe replays",
        "Volatile ECC error counts since the driver loaded, and PCIe replays. Any uncorrectable error"
        " raises GPUUncorrectableECCErrors: drain and reset the GPU. Growing replays point at a bad link"
        f" or riser.{optional_group('pcie')}{NEEDS_SMLENS}",
        [
            Query(f"{total(n.GPU_ECC_ERRORS)}{sel}", "ECC {{type}}"),
            Query(f"{total(n.GPU_PCIE_REPLAYS)}{sel}", "PCIe replays"),
        ],
    )
    return [traffic, errors]


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector('hostname="$hostname"', 'gpu="$gpu"')
    return dashboard(
        "smlens-gpu",
        "smlens / GPU",
        "One GPU: utilization, SM activity, occupancy, tensor and DRAM on one time axis, then power,"
        " memory, clocks, throttling and errors.",
        node_variables(e, one_gpu=True),
        [
            Row("Recording rules", [rules_check(e, HOSTNAME, e.selector('hostname="$hostname"'))]),
            Row("This GPU", [*_identity(sel), *_now_stats(e, sel)]),
            Row("Activity", [_activity(e, sel)]),
            Row("MIG instances", [mig_instances(e, sel)]),
            hardware_row(sel, by_gpu=False),
            Row("Traffic and errors", _traffic_and_errors(e, sel)),
        ],
    )
