"""The alerting rules, generated from the thresholds.

They read the per-GPU recorded layer (:mod:`smlens.bundle.layers`) for the means and the raw series
(:mod:`smlens.bundle.series`) for the rest. Raw series lose instance and job: two scrape jobs on one
exporter give one alert, not two. Conditions filter before aggregating, so the aggregations see the
few matching series only.
"""

from __future__ import annotations

from collections.abc import Callable

from smlens import names as n
from smlens.bundle.dcgm_exporter import PROFILING_FIELDS
from smlens.bundle.layers import (
    COMPUTE_SOL,
    GPU,
    GPU_LEVEL_LABELS,
    INSTANCE,
    level_labels,
    mean_expr,
    mean_name,
    stalled_name,
)
from smlens.bundle.promql import by, number, quoted, total
from smlens.bundle.series import (
    DCGM_EXPORTER,
    HARDWARE_XIDS,
    INSTANCE_MEANS,
    SM_ACTIVE_MEAN,
    SM_OCCUPANCY_MEAN,
    TENSOR_ACTIVE_MEAN,
    UTILIZATION_MEAN,
    Mean,
)
from smlens.formatting import percent
from smlens.verdicts.thresholds import Thresholds

Alert = dict[str, object]

# Alert texts name the node, the GPU and the workload (when one container holds the GPU).
_GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.hostname }}"
_WORKLOAD = (
    "{{ if $labels.pod }}workload {{ $labels.namespace }}/{{ $labels.pod }}"
    "{{ with $labels.container }} (container {{ . }}){{ end }}{{ else }}no workload attributed{{ end }}"
)
_WHERE = f"{_GPU}, {_WORKLOAD}"
_INSTANCE = (
    "MIG instance {{ $labels.gpu_instance }}"
    " ({{ $labels.mig_profile }}{{ with $labels.mig_uuid }}, {{ . }}{{ end }})"
    f" of {_GPU}, {_WORKLOAD}"
)
_TARGET = "smlens at {{ $labels.instance }} (job {{ $labels.job }})"


def alert_rule(
    t: Thresholds, name: str, expr: str, hold: str, severity: str, summary: str, description: str
) -> Alert:
    return {
        "alert": name,
        "expr": expr,
        "for": hold,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{t.runbook_base_url}#{name.lower()}",
        },
    }


def _gpu_mean(t: Thresholds, mean: Mean) -> str:
    return mean_expr(GPU, mean, t.window)


def _per_gpu(t: Thresholds) -> str:
    """The per-GPU aggregation of raw series: each GPU once, with its owner's labels."""
    return by(level_labels(GPU, t.cluster_label)).strip()


def _gpu_key(t: Thresholds) -> str:
    return f"{t.cluster_label}, hostname, uuid"


def _job(t: Thresholds) -> str:
    return f"job=~{quoted(t.exporter_job)}"


def _with_workload(expr: str, owned: str, window: str, cluster: str) -> str:
    """A per-GPU expression labelled with the workload of its GPU where the GPU has exactly one.

    The owners come from ``owned``, series of the same GPUs: smlens puts the owner's labels on every
    series of a GPU one container holds. XID counters exist only on GPUs that had an XID, so reading
    them costs little, where a join on every GPU's gpu_up cost a pass over the fleet each evaluation.
    A GPU with several owners at once (pod churn between two scrapes) keeps its series without
    workload labels: a join on all owners would be many-to-many and fail the whole rule, for every GPU.
    """
    workload = ", ".join(n.OWNER_LABELS)
    gpu = f"{cluster}, hostname, uuid"
    # Where the GPU's series are gone now (the exporter restarted: an XID count starts at the
    # exporter's start), the owners they had within the window: the alert keeps its labels, where
    # taking none would resolve it and page again without a workload.
    owners = (
        f"(\n  group by ({gpu}, {workload}) ({owned})\n  or on ({gpu})\n"
        f"  group by ({gpu}, {workload}) (last_over_time({owned}[{window}]))\n)"
    )
    one_owner = f"count by ({gpu}) ({owners}) == 1"
    return (
        f"(\n{expr}\n) * on ({gpu}) group_left ({workload}) (\n"
        f"  {owners}\n  and on ({gpu}) ({one_owner})\n)\n"
        f"or\n(\n{expr}\n) unless on ({gpu}) ({one_owner})"
    )


def _xid_within(selector: str, window: str, cluster: str) -> str:
    """XID counters that grew within ``window``, or appeared within it on a GPU already monitored then.

    Keyed on the GPU (cluster, hostname, uuid, xid), never on the instance, which changes when the
    exporter pod restarts without host networking. A new owner relabels a GPU's series: summed over
    workload labels first, so that is no new error. increase() over that sum counts across a counter
    reset (exporter restart on the same address); a series that appears on a new address counts when
    the GPU was monitored a window ago (the exporter restarted: its counts start at its start).
    """
    workload = ", ".join(n.OWNER_LABELS)
    per_target = f"sum without ({workload}) ({selector})"
    before = f"sum without ({workload}) ({selector} offset {window})"
    gpu_key = f"{cluster}, hostname, gpu, uuid, xid"
    grown = (
        f"max by ({gpu_key}) (\n"
        f"  increase(({per_target})[{window}:]) > 0\n"
        f"  or\n"
        f"  (\n    {per_target}\n    unless\n    {before}\n  )\n"
        f"  and on ({cluster}, hostname, uuid) ({n.GPU_UP} offset {window})\n"
        f")"
    )
    return _with_workload(grown, selector, window, cluster)


def _xids(hardware: bool) -> str:
    """The XID counters of the hardware XIDs, or of all others."""
    match = "=~" if hardware else "!~"
    return f'{total(n.GPU_XID_ERRORS)}{{xid{match}"{"|".join(HARDWARE_XIDS)}"}}'


def _busy_but_sm_underused(t: Thresholds) -> Alert:
    sm, util = _gpu_mean(t, SM_ACTIVE_MEAN), _gpu_mean(t, UTILIZATION_MEAN)
    return alert_rule(
        t,
        "GPUBusyButSMUnderused",
        f"{sm} <= {number(t.hollow_sm_active)}\nand\n{util} >= {number(t.busy_utilization)}",
        t.hollow_for,
        "warning",
        "GPU looks busy but its SMs are mostly idle",
        f"{_WHERE}: NVML utilization is at least {percent(t.busy_utilization, 0)} but only"
        f" {{{{ $value | humanizePercentage }}}} of its SMs had work ({t.window} means; hollow below"
        f" {percent(t.hollow_sm_active, 0)}). Kernels are too small or too few to fill the GPU: launch"
        " overhead, small batches, synchronisation or a CPU-bound input pipeline.",
    )


def _busy_but_stalled(t: Thresholds) -> Alert:
    sol = mean_expr(GPU, COMPUTE_SOL, t.window)
    return alert_rule(
        t,
        "GPUBusyButStalled",
        # GPUs with few warps resident are GPULowSMOccupancy's, whose fix is more specific.
        f"{sol}\nand\n{stalled_name(GPU, t.window)} > 0\nunless\n({_low_occupancy(t)})",
        t.stalled_for,
        "info",
        "GPU's SMs are active but neither its compute pipes nor its memory are near their peak",
        f"{_WHERE}: busy, with at least {percent(t.working_sm_active, 0)} of its SMs active, but its busiest"
        f" compute pipe worked only {{{{ $value | humanizePercentage }}}} of the time and DRAM stayed below"
        f" {percent(t.memory_bound_dram, 0)} of its bandwidth ({t.window} means): the SMs wait on memory"
        " latency, synchronisation or many small kernels. Profile a step with `smlens profile`.",
    )


def _low_occupancy(t: Thresholds) -> str:
    """SMs active with few warps resident, and no tensor-core work to explain it."""
    occupancy, sm = _gpu_mean(t, SM_OCCUPANCY_MEAN), _gpu_mean(t, SM_ACTIVE_MEAN)
    tensor = _gpu_mean(t, TENSOR_ACTIVE_MEAN)
    return (
        f"{occupancy} <= {number(t.low_occupancy)}\nand\n{sm} >= {number(t.working_sm_active)}\n"
        f"unless\n{tensor} >= {number(t.tensor_busy)}"
    )


def _low_sm_occupancy(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPULowSMOccupancy",
        _low_occupancy(t),
        t.low_occupancy_for,
        "info",
        "GPU SMs are active but hold very few warps",
        f"{_WHERE}: SMs are active but occupancy is {{{{ $value | humanizePercentage }}}} of the maximum"
        f" warps ({t.window} means) and the tensor pipes are not busy, so memory and instruction latency"
        " is not hidden. Check registers and shared memory per block, block size and grid size.",
    )


def _allocated_but_idle(t: Thresholds) -> Alert:
    util, gpu_key = _gpu_mean(t, UTILIZATION_MEAN), _gpu_key(t)
    return alert_rule(
        t,
        "GPUAllocatedButIdle",
        f"max {_per_gpu(t)} (\n  {n.GPU_ALLOCATION_INFO}\n  * on ({gpu_key}) group_left ()\n"
        f"  max by ({gpu_key}) ({util} < {number(t.idle_utilization)})\n)",
        t.allocated_idle_for,
        "warning",
        "GPU held by a workload runs almost no kernels",
        f"{_WHERE}: the GPU is allocated but NVML utilization is {{{{ $value | humanizePercentage }}}}"
        f" ({t.window} mean) and has stayed below {percent(t.idle_utilization, 0)} for"
        f" {t.allocated_idle_for}. Release it or find out what the workload waits for.",
    )


def _profiling_unavailable(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPUProfilingMetricsUnavailable",
        f'max {_per_gpu(t)} ({n.GPU_PROFILING_AVAILABLE}{{exporter!="{DCGM_EXPORTER}"}} == 0)\n'
        f"unless on ({_gpu_key(t)})\n{n.GPU_UP} == 0",
        t.profiling_unavailable_for,
        "warning",
        "SM activity and occupancy are unavailable for a GPU",
        f"{_WHERE}: smlens reads no SM-level metrics (NVML GPM or DCGM profiling) for this GPU, so"
        " it cannot tell a busy GPU from a hollow one. `smlens check` names the reason.",
    )


def _dcgm_exporter_profiling_off(t: Thresholds) -> Alert:
    """dcgm-exporter GPUs without SM activity, one alert per cluster: which counters dcgm-exporter
    exports is one setting of its DaemonSet, so a warning per GPU would page a fleet for a choice."""
    c = t.cluster_label
    fields = " and ".join(f"`{f.legacy.name}` / `{f.current.name}`" for f in PROFILING_FIELDS)
    return alert_rule(
        t,
        "GPUDcgmExporterProfilingOff",
        f"count by ({c}) (\n  max by ({c}, hostname, uuid)"
        f' ({n.GPU_PROFILING_AVAILABLE}{{exporter="{DCGM_EXPORTER}"}} == 0)\n)',
        t.profiling_unavailable_for,
        "info",
        "dcgm-exporter exports no SM activity for some GPUs",
        f"{{{{ $value }}}} GPUs that dcgm-exporter reports{{{{ with $labels.{c} }}}} in cluster {{{{ . }}}}"
        f"{{{{ end }}}} have no SM activity, so busy and hollow GPUs look the same there. dcgm-exporter's"
        " default counters (etc/default-counters.csv) leave SM activity and occupancy commented out:"
        f" uncomment {fields} (names before / since dcgm-exporter 4.9.0) in the counters file it runs"
        " with (-f / DCGM_EXPORTER_COLLECTORS, or its ConfigMap) and restart it, or run smlens on"
        " those nodes.",
    )


def _not_readable(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPUNotReadable",
        f"max {_per_gpu(t)} ({n.GPU_UP} == 0)",
        t.exporter_down_for,
        "warning",
        "smlens cannot read a GPU",
        f"{_WHERE}: the last reads of this GPU failed or it is lost; its metrics are stale or absent.",
    )


def _exporter_down(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "SmlensExporterDown",
        f"up{{{_job(t)}}} == 0",
        t.exporter_down_for,
        "warning",
        "Prometheus cannot scrape smlens",
        f"Prometheus cannot scrape {_TARGET}: the GPUs of that node are not monitored.",
    )


def _node_without_exporter_expr(cluster: str, job: str) -> str:
    """Nodes that advertise GPUs and report none, keyed on the node (with its name as hostname too,
    so that the route groups it per node). A node whose smlens target exists but is down is left
    to SmlensExporterDown: one failure, one page. (The chart's scrape adds the node label to the
    target; a scrape without it cannot be matched, and both alerts fire.)

    GPUs are counted as the device plugin advertises them: nvidia.com/gpu, and with MIG's mixed
    strategy nvidia.com/mig-<profile> per profile (nvidia.com/gpu is 0 there); max per resource, so
    two kube-state-metrics replicas count once."""
    c = cluster
    capacity = 'kube_node_status_capacity{resource=~"nvidia_com_gpu|nvidia_com_mig_.+"}'
    return (
        f"label_replace(\n  sum by ({c}, node) (max by ({c}, node, resource) ({capacity}) > 0)\n"
        f"  unless on ({c}, node)\n"
        f'  label_replace(max by ({c}, hostname) ({n.GPU_UP}), "node", "$1", "hostname", "(.*)")\n'
        f"  unless on ({c}, node)\n"
        f"  max by ({c}, node) (up{{{job}}} == 0),\n"
        f'  "hostname", "$1", "node", "(.*)"\n)'
    )


def _node_without_exporter(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPUNodeWithoutExporter",
        _node_without_exporter_expr(t.cluster_label, _job(t)),
        t.profiling_unavailable_for,
        "warning",
        "A Kubernetes node with GPUs has no smlens exporter reporting",
        "Node {{ $labels.node }} advertises {{ $value }} GPU devices (nvidia.com/gpu or nvidia.com/mig-*,"
        " kube-state-metrics) but no exporter reports a GPU from it under that name: the DaemonSet"
        " does not run there (node selector, taints, resources) or runs but reads no GPU. Its GPUs"
        " are not monitored. (An exporter that runs there but cannot be scraped raises"
        " SmlensExporterDown instead.)",
    )


def _sampling_stalled(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "SmlensSamplingStalled",
        f"{n.SMLENS_SNAPSHOT_AGE_SECONDS} > {n.STALE_INTERVALS} * {n.SMLENS_SAMPLING_INTERVAL_SECONDS}",
        t.exporter_down_for,
        "warning",
        "smlens serves an old snapshot: sampling stalled",
        f"{_TARGET} serves a snapshot {{{{ $value | humanizeDuration }}}} old, more than"
        f" {n.STALE_INTERVALS} sampling intervals: the sampler is stuck or too slow, so the GPU metrics"
        " are frozen.",
    )


def _backend_down(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "SmlensBackendDown",
        f"{n.SMLENS_BACKEND_UP} == 0",
        t.exporter_down_for,
        "warning",
        "An smlens backend fails to sample",
        f"Backend {{{{ $labels.backend }}}} of {_TARGET} failed its last ticks;"
        f" see {total(n.SMLENS_BACKEND_ERRORS)} and the exporter log.",
    )


def _xid_hardware(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPUXidErrorHardware",
        _xid_within(_xids(hardware=True), t.window, t.cluster_label),
        t.hardware_error_for,
        "critical",
        "GPU reported a hardware XID error",
        f"{_WHERE}: XID {{{{ $labels.xid }}}} within the last {t.window}, an XID that points at the GPU,"
        " its memory or its links. Drain the node and check `nvidia-smi -q` and the kernel log.",
    )


def _xid_other(t: Thresholds) -> Alert:
    return alert_rule(
        t,
        "GPUXidError",
        _xid_within(_xids(hardware=False), t.window, t.cluster_label),
        t.hardware_error_for,
        "warning",
        "GPU reported an XID error",
        f"{_WHERE}: XID {{{{ $labels.xid }}}} within the last {t.window}; most such XIDs come from the"
        " application (illegal memory access, MMU fault, killed context).",
    )


def _uncorrectable_ecc(t: Thresholds) -> Alert:
    # Volatile counts come from the driver, not the exporter: keyed on the GPU they survive exporter
    # restarts as one alert, and end when a driver reload or GPU reset clears them. The counter
    # carries the GPU's owner (smlens labels every series of a GPU one container holds), so no join
    # on gpu_up: one read of the counters, filtered to the GPUs with errors before aggregating.
    ecc = f'{total(n.GPU_ECC_ERRORS)}{{type="uncorrected"}} > 0'
    return alert_rule(
        t,
        "GPUUncorrectableECCErrors",
        f"max {_per_gpu(t)} ({ecc})",
        t.hardware_error_for,
        "critical",
        "GPU memory had uncorrectable ECC errors",
        f"{_WHERE}: {{{{ $value }}}} uncorrectable ECC errors since the last driver load. Results of"
        " jobs on this GPU may be wrong; drain it and reset the GPU.",
    )


def _clock_slowdown(t: Thresholds) -> Alert:
    slowdown = f"{n.GPU_CLOCK_EVENT_ACTIVE}{{reason=~{quoted('|'.join(n.SLOWDOWN_REASONS))}}}"
    return alert_rule(
        t,
        "GPUClockSlowdown",
        f"max by ({t.cluster_label}, {', '.join(GPU_LEVEL_LABELS)}, reason) ({slowdown} == 1)",
        t.thermal_slowdown_for,
        "warning",
        "GPU clocks are slowed down by heat or power",
        f"{_WHERE}: clock-event reason {{{{ $labels.reason }}}} has held for {t.thermal_slowdown_for};"
        " the GPU runs below its clocks. Check cooling, inlet temperature and power delivery.",
    )


def _mig_instance_hollow(t: Thresholds) -> Alert:
    """A MIG instance held by a workload (attributed to a pod, or with memory in use) whose SMs are
    mostly idle. gpu_allocation_info names no MIG device, so it cannot tell which instance is held."""
    c = t.cluster_label
    sm = mean_name(INSTANCE, INSTANCE_MEANS[0], t.window)
    key = f"{c}, hostname, uuid, gpu_instance, mig_uuid"
    held = (
        f"group by ({key}) ({n.GPU_MIG_MEMORY_USED_BYTES} > {number(n.MIG_HELD_MEMORY_BYTES)})\n"
        f'  or\n  group by ({key}) ({n.GPU_MIG_INFO}{{pod!=""}})'
    )
    return alert_rule(
        t,
        "GPUMigInstanceHollow",
        f"{sm} <= {number(t.hollow_sm_active)}\nand on ({key})\n(\n  {held}\n)",
        t.hollow_for,
        "warning",
        "MIG instance held by a workload has mostly idle SMs",
        f"{_INSTANCE}: the instance is held (a pod or memory in use) but only"
        f" {{{{ $value | humanizePercentage }}}} of its SMs had work ({t.window} mean;"
        f" hollow below {percent(t.hollow_sm_active, 0)})."
        " NVML gives no utilization per MIG instance, so GPUBusyButSMUnderused cannot see this:"
        " the workload idles or launches kernels too small for even this slice.",
    )


# In the order of the rule file.
ALERTS: tuple[Callable[[Thresholds], Alert], ...] = (
    _busy_but_sm_underused,
    _busy_but_stalled,
    _low_sm_occupancy,
    _allocated_but_idle,
    _profiling_unavailable,
    _dcgm_exporter_profiling_off,
    _not_readable,
    _exporter_down,
    _node_without_exporter,
    _sampling_stalled,
    _backend_down,
    _xid_hardware,
    _xid_other,
    _uncorrectable_ecc,
    _clock_slowdown,
    _mig_instance_hollow,
)


def alerting_rules(t: Thresholds) -> list[Alert]:
    return [alert(t) for alert in ALERTS]
