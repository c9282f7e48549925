"""The node dashboard: one node's GPUs, NVML utilization next to SM activity, occupancy, tensor and
DRAM, plus power, memory, clocks and throttling."""

from __future__ import annotations

from smlens import names as n
from smlens.bundle.dashboards.panels import ratio_series, stat, table
from smlens.bundle.dashboards.queries import Exprs
from smlens.bundle.dashboards.sections import (
    GAP,
    MAPPED_MEANS,
    RATIO_MEANINGS,
    hardware_row,
    mig_instances,
    node_variables,
    roofline,
    rules_check,
)
from smlens.bundle.grafana import JSON, Panel, Query, Row, dashboard
from smlens.bundle.layers import EFFICIENCY, GPU, HOSTNAME
from smlens.bundle.series import (
    DRAM_ACTIVE_MEAN,
    MEANS,
    SM_ACTIVE_MEAN,
    SM_OCCUPANCY_MEAN,
    TENSOR_ACTIVE_MEAN,
    UTILIZATION_MEAN,
    Mean,
)
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds

NODE_GPUS_MAX = 8  # GPUs of one node the node dashboard's MIG table makes room for (HGX: 8)


def _now_stats(e: Exprs, sel: str) -> list[Panel]:
    stats = [
        stat(
            RATIO_MEANINGS[mean][0],
            f"{RATIO_MEANINGS[mean][1]} Exact {e.w} mean over the selected GPUs of this node.",
            e.layer_mean(GPU, mean, sel),
            ratio=True,
            steps=e.sm_steps() if mean is SM_ACTIVE_MEAN else (),
        )
        for mean in MEANS
    ]
    efficiency = stat(
        "SM efficiency",
        "SM-active GPU-seconds per busy GPU-second on this node: how much of NVML's 'busy' was real SM work.",
        e.layer_mean(GPU, EFFICIENCY, sel),
        ratio=True,
        steps=e.sm_steps(),
    )
    return [*stats, efficiency]


def _gpus(e: Exprs, sel: str) -> Panel:
    t = e.t
    return table(
        "GPUs by SM activity",
        f"Every selected GPU with its {t.window} means, the largest gap between utilization and SM active"
        f" first. Utilization of at least {percent(t.busy_utilization, 0)} with SM active at or below"
        f" {percent(t.hollow_sm_active, 0)} is a hollow GPU; see the GPU dashboard and the runbook of"
        " GPUBusyButSMUnderused.",
        ("Utilization", f"{e.mean(GPU, UTILIZATION_MEAN, sel)}\n{e.current_owner(sel)}"),
        [
            ("SM active", e.mean(GPU, SM_ACTIVE_MEAN, sel)),
            (GAP, e.gap(sel)),
            ("SM occupancy", e.mean(GPU, SM_OCCUPANCY_MEAN, sel)),
            ("Tensor active", e.mean(GPU, TENSOR_ACTIVE_MEAN, sel)),
            ("DRAM active", e.mean(GPU, DRAM_ACTIVE_MEAN, sel)),
        ],
        sort_by=GAP,
    )


def _per_gpu(e: Exprs, mean: Mean, selector: str) -> Panel:
    title, meaning = RATIO_MEANINGS[mean]
    return ratio_series(
        f"{title} per GPU",
        f"{meaning} Exact mean over each graph step, from the counters.{MAPPED_MEANS}",
        [Query(e.step_mean(mean, selector, "gpu") + e.or_mapped(mean, selector), "GPU {{gpu}}")],
    )


def _efficiency_per_gpu(e: Exprs, sel: str) -> Panel:
    # Over the busy seconds of all GPUs, not EFFICIENCY's profiled-busy ones: per GPU they are the
    # same wherever the GPU has SM data, and these are raw counters a step mean can read.
    steps = e.step_ratio(n.GPU_SM_ACTIVE_SECONDS, n.GPU_BUSY_SECONDS, sel, "gpu")
    return ratio_series(
        "SM efficiency per GPU",
        "SM-active seconds per busy second, per GPU, over the graph step. Low: NVML reports busy while"
        f" the SMs wait (small kernels, launch overhead, synchronisation).{MAPPED_MEANS}",
        [Query(steps + e.or_mapped(EFFICIENCY, sel), "GPU {{gpu}}")],
    )


def build(t: Thresholds) -> JSON:
    e = Exprs(t)
    sel = e.selector('hostname="$hostname"', 'gpu=~"$gpu"')
    activity = [_per_gpu(e, mean, sel) for mean in MEANS]
    return dashboard(
        "smlens-node",
        "smlens / Node",
        "One node's GPUs: NVML utilization next to SM activity, occupancy, tensor and DRAM, plus power,"
        " memory, clocks and throttling.",
        node_variables(e, one_gpu=False),
        [
            Row("Recording rules", [rules_check(e, HOSTNAME, e.selector('hostname="$hostname"'))]),
            Row(f"This node now ({t.window} means)", _now_stats(e, sel)),
            Row("GPUs of this node", [_gpus(e, sel)]),
            Row("MIG instances", [mig_instances(e, sel, gpus=NODE_GPUS_MAX)]),
            Row("Activity per GPU", [*activity, _efficiency_per_gpu(e, sel), roofline(e, sel, None)]),
            hardware_row(sel, by_gpu=True),
        ],
    )
