"""Turns a :class:`~smlens.model.Snapshot` into Prometheus metric families.

A prometheus_client custom collector over one immutable snapshot: ``collect`` yields fresh families from
what the sampler already gathered. The sampler's thread renders it once per tick
(:mod:`smlens.exposition.rendered`); no scrape calls it.
"""

from __future__ import annotations

import itertools
import platform
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from smlens import __version__
from smlens import names as n
from smlens.exposition import accounting as accounting_metrics
from smlens.exposition import instances as instance_metrics
from smlens.exposition import owners as attribution_metrics
from smlens.exposition.selection import DEFAULT_SELECTION, Selection
from smlens.model import GpuState, Snapshot

RATIO_GAUGES: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        n.GPU_UTILIZATION_RATIO,
        "NVML utilization over the last tick: share of time at least one kernel ran. It does NOT say how "
        "much of the GPU worked: one kernel on one SM reads 1.0. Compare gpu_sm_active_ratio.",
    ),
    (
        n.SM_ACTIVE,
        n.GPU_SM_ACTIVE_RATIO,
        "Share of SM cycles with at least one warp resident, averaged over all SMs and the last tick.",
    ),
    (
        n.SM_OCCUPANCY,
        n.GPU_SM_OCCUPANCY_RATIO,
        "Resident warps over the maximum warps per SM, averaged over all SMs and the last tick.",
    ),
    (n.TENSOR_ACTIVE, n.GPU_TENSOR_ACTIVE_RATIO, "Share of cycles any tensor pipe was active, last tick."),
    (
        n.HMMA_ACTIVE,
        n.GPU_HMMA_ACTIVE_RATIO,
        "Share of cycles the FP16/BF16 tensor (HMMA) pipe was active, last tick.",
    ),
    (
        n.DRAM_ACTIVE,
        n.GPU_DRAM_ACTIVE_RATIO,
        "Share of cycles the device memory interface was busy (bandwidth used over peak), last tick.",
    ),
    (n.FP64_ACTIVE, n.GPU_FP64_ACTIVE_RATIO, "Share of cycles the FP64 pipe was active, last tick."),
    (n.FP32_ACTIVE, n.GPU_FP32_ACTIVE_RATIO, "Share of cycles the FP32 pipe was active, last tick."),
    (n.FP16_ACTIVE, n.GPU_FP16_ACTIVE_RATIO, "Share of cycles the FP16 pipe was active, last tick."),
)

ACTIVITY_COUNTERS: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        n.GPU_BUSY_SECONDS,
        "Integral of NVML utilization (time any kernel ran); rate() over a window is the mean utilization.",
    ),
    (
        n.SM_ACTIVE,
        n.GPU_SM_ACTIVE_SECONDS,
        "Integral of SM activity; its rate() over that of gpu_profiled_seconds_total is the exact mean.",
    ),
    (n.SM_OCCUPANCY, n.GPU_SM_OCCUPANCY_SECONDS, "Integral of SM occupancy over time."),
    (n.TENSOR_ACTIVE, n.GPU_TENSOR_ACTIVE_SECONDS, "Integral of tensor pipe activity over time."),
    (n.DRAM_ACTIVE, n.GPU_DRAM_ACTIVE_SECONDS, "Integral of DRAM activity over time."),
    (
        n.COMPUTE_SOL,
        n.GPU_COMPUTE_SOL_SECONDS,
        "Integral of the compute speed of light, tick by tick the busiest of the tensor (any), FP64, FP32, "
        "FP16 and integer pipes; its rate() over that of gpu_profiled_seconds_total is the mean, which no "
        "ratio of the pipe counters gives.",
    ),
)
PIPE_COUNTER_HELP = (
    "Integral of each compute pipe's activity, label pipe (hmma, imma, dfma, dmma, fp64, fp32, fp16, "
    "integer; any tensor is gpu_tensor_active_seconds_total), only the pipes the GPU's source reports; its "
    "rate() over that of gpu_profiled_seconds_total is the pipe's mean activity."
)
COVERAGE_COUNTERS: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        n.GPU_UTILIZATION_SAMPLED_SECONDS,
        "Wall seconds covered by utilization samples: the denominator of gpu_busy_seconds_total.",
    ),
    (
        n.SM_ACTIVE,
        n.GPU_PROFILED_SECONDS,
        "Wall seconds covered by SM-level (profiling) samples: the denominator of the SM, tensor, DRAM, "
        "pipe and compute SOL *_seconds_total counters.",
    ),
)

PLAIN_GAUGES: Sequence[tuple[str, str, str]] = (
    (n.MEMORY_USED_BYTES, n.GPU_MEMORY_USED_BYTES, "Framebuffer memory in use."),
    (n.MEMORY_TOTAL_BYTES, n.GPU_MEMORY_TOTAL_BYTES, "Framebuffer memory in total."),
    (n.POWER_WATTS, n.GPU_POWER_WATTS, "Board power draw."),
    (n.POWER_LIMIT_WATTS, n.GPU_POWER_LIMIT_WATTS, "Enforced board power limit."),
    (n.TEMPERATURE_CELSIUS, n.GPU_TEMPERATURE_CELSIUS, "GPU core temperature."),
    (n.MEMORY_TEMPERATURE_CELSIUS, n.GPU_MEMORY_TEMPERATURE_CELSIUS, "Device memory (HBM) temperature."),
    (n.SM_CLOCK_HERTZ, n.GPU_SM_CLOCK_HERTZ, "Current SM clock."),
    (n.MEMORY_CLOCK_HERTZ, n.GPU_MEMORY_CLOCK_HERTZ, "Current memory clock."),
    (n.SM_CLOCK_MAX_HERTZ, n.GPU_SM_CLOCK_MAX_HERTZ, "Maximum SM clock."),
)

PLAIN_COUNTERS: Sequence[tuple[str, str, str]] = (
    (n.ENERGY_JOULES, n.GPU_ENERGY_JOULES, "Energy consumed, from the driver's counter."),
    (n.PCIE_REPLAYS, n.GPU_PCIE_REPLAYS, "PCIe replays (link-level retransmissions)."),
    (n.PCIE_TX_BYTES, n.GPU_PCIE_TRANSMIT_BYTES, "Bytes the GPU sent over PCIe."),
    (n.PCIE_RX_BYTES, n.GPU_PCIE_RECEIVE_BYTES, "Bytes the GPU received over PCIe."),
    (n.NVLINK_TX_BYTES, n.GPU_NVLINK_TRANSMIT_BYTES, "Bytes the GPU sent over NVLink."),
    (n.NVLINK_RX_BYTES, n.GPU_NVLINK_RECEIVE_BYTES, "Bytes the GPU received over NVLink."),
)
ECC_COUNTERS = ((n.ECC_CORRECTED, "corrected"), (n.ECC_UNCORRECTED, "uncorrected"))


def _xid_order(item: tuple[str, int]) -> tuple[int, int]:
    """Catalog codes in numeric order, then "other"."""
    code = item[0]
    return (0, int(code)) if code.isdigit() else (1, 0)


def gpu_labels(snapshot: Snapshot, gpu: GpuState) -> list[str]:
    return [str(gpu.identity.index), gpu.identity.uuid, snapshot.hostname]


class SnapshotCollector(Collector):
    """A custom collector over one snapshot; ``collect`` yields fresh families each call, those of the
    metric groups in ``selection`` (:mod:`.selection`)."""

    def __init__(self, snapshot: Snapshot, selection: Selection = DEFAULT_SELECTION) -> None:
        self._snapshot = snapshot
        self._selection = selection

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        chosen = self._selection.exports
        gpu_families: Iterator[Metric] = itertools.chain(
            self._gpu_families(snap),
            instance_metrics.families(snap, RATIO_GAUGES, ACTIVITY_COUNTERS, COVERAGE_COUNTERS, chosen),
        )
        if snap.attribution.owner_labels:
            gpu_families = attribution_metrics.with_owner_labels(gpu_families, snap.attribution)
        yield from gpu_families
        if chosen(n.GPU_VERDICT_SECONDS):
            yield from accounting_metrics.families(snap)
        yield from attribution_metrics.families(
            snap.attribution, [g.identity for g in snap.gpus], snap.hostname
        )
        yield from self._self_families(snap)

    def _gpu_families(self, snap: Snapshot) -> Iterator[Metric]:
        gpus = snap.gpus
        info = GaugeMetricFamily(
            n.GPU_INFO,
            "Static facts about the GPU as labels; the value is always 1.",
            labels=[
                *n.GPU_LABELS,
                "model",
                "driver_version",
                "pci_bus_id",
                "serial",
                "sm_count",
                "compute_capability",
            ],
        )
        up = GaugeMetricFamily(
            n.GPU_UP, "1 if the last tick read this GPU, 0 if it failed or is lost.", labels=n.GPU_LABELS
        )
        profiling = GaugeMetricFamily(
            n.GPU_PROFILING_AVAILABLE,
            "1 if SM-level metrics (SM active, occupancy, tensor, DRAM) came for this GPU in the last tick; "
            "label source names where they come from (gpm, dcgm, sim) or none.",
            labels=[*n.GPU_LABELS, "source"],
        )
        mode = GaugeMetricFamily(
            n.GPU_PROFILING_MODE,
            "1 for how the profiling source counts: mode one_pass, or multiplexed when the SM-level "
            "counters need several hardware passes (DCGM shared with other clients) and are estimates.",
            labels=[*n.GPU_LABELS, "source", "mode"],
        )
        for gpu in gpus:
            labels = gpu_labels(snap, gpu)
            ident = gpu.identity
            info.add_metric(
                [
                    *labels,
                    ident.name,
                    ident.driver_version,
                    ident.pci_bus_id,
                    ident.serial,
                    "" if ident.sm_count is None else str(ident.sm_count),
                    ident.compute_capability,
                ],
                1,
            )
            up.add_metric(labels, 1 if gpu.up else 0)
            profiling.add_metric(
                [*labels, gpu.profiling_source or "none"], 1 if gpu.profiling_available else 0
            )
            if gpu.profiling_source and gpu.profiling_mode:
                mode.add_metric([*labels, gpu.profiling_source, gpu.profiling_mode], 1)
        yield from (info, up, profiling)
        if mode.samples:  # only DCGM knows its mode: no empty family elsewhere
            yield mode

        chosen = self._selection.exports
        for key, name, help_text in (*RATIO_GAUGES, *PLAIN_GAUGES):
            if not chosen(name):
                continue
            family: GaugeMetricFamily | CounterMetricFamily = GaugeMetricFamily(
                name, help_text, labels=n.GPU_LABELS
            )
            for gpu in gpus:
                value = gpu.gauges.get(key)
                if value is not None:
                    family.add_metric(gpu_labels(snap, gpu), value)
            yield family
        for key, name, help_text in ACTIVITY_COUNTERS:
            if not chosen(name):
                continue
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                activity = gpu.activity_totals.get(key)
                if activity is not None:
                    family.add_metric(gpu_labels(snap, gpu), activity.active_seconds)
            yield family
        if chosen(n.GPU_PIPE_ACTIVE_SECONDS):
            pipes = CounterMetricFamily(
                n.GPU_PIPE_ACTIVE_SECONDS, PIPE_COUNTER_HELP, labels=[*n.GPU_LABELS, n.PIPE]
            )
            for gpu in gpus:
                labels = gpu_labels(snap, gpu)
                for key, pipe in n.PIPE_LABELS:
                    activity = gpu.activity_totals.get(key)
                    if activity is not None and self._selection.exports_value(
                        n.GPU_PIPE_ACTIVE_SECONDS, pipe
                    ):
                        pipes.add_metric([*labels, pipe], activity.active_seconds)
            yield pipes
        for key, name, help_text in COVERAGE_COUNTERS:
            if not chosen(name):
                continue
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                activity = gpu.activity_totals.get(key)
                if activity is not None:
                    family.add_metric(gpu_labels(snap, gpu), activity.covered_seconds)
            yield family
        for key, name, help_text in PLAIN_COUNTERS:
            if not chosen(name):
                continue
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                value = gpu.totals.get(key)
                if value is not None:
                    family.add_metric(gpu_labels(snap, gpu), value)
            yield family

        ecc = CounterMetricFamily(
            n.GPU_ECC_ERRORS,
            "Volatile ECC errors since the last driver load.",
            labels=[*n.GPU_LABELS, "type"],
        )
        events = GaugeMetricFamily(
            n.GPU_CLOCK_EVENT_ACTIVE,
            "1 while the clock-event (throttle) reason holds, 0 when not; only reasons the GPU reports.",
            labels=[*n.GPU_LABELS, "reason"],
        )
        xid = CounterMetricFamily(
            n.GPU_XID_ERRORS,
            "XID errors reported by NVML's event API since start.",
            labels=[*n.GPU_LABELS, "xid"],
        )
        exported = self._selection.exports_value
        for gpu in gpus:
            labels = gpu_labels(snap, gpu)
            for key, kind in ECC_COUNTERS:
                value = gpu.totals.get(key)
                if value is not None:
                    ecc.add_metric([*labels, kind], value)
            for reason, active in sorted(gpu.clock_events.items()):
                if exported(n.GPU_CLOCK_EVENT_ACTIVE, reason):
                    events.add_metric([*labels, reason], 1 if active else 0)
            for code, count in sorted(gpu.xid_totals.items(), key=_xid_order):
                xid.add_metric([*labels, code], count)
        yield from (family for family in (ecc, events, xid) if chosen(family.name))

    def _self_families(self, snap: Snapshot) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            n.SMLENS_BUILD_INFO,
            "smlens version and Python runtime; value 1.",
            labels=["version", "python_version"],
        )
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        backend_up = GaugeMetricFamily(
            n.SMLENS_BACKEND_UP,
            "1 if the backend read every GPU it serves in the last tick, 0 if any of those reads failed.",
            labels=["backend"],
        )
        last = GaugeMetricFamily(
            n.SMLENS_BACKEND_LAST_SAMPLE_DURATION_SECONDS,
            "Time the backend took in the last tick, over all GPUs.",
            labels=["backend"],
        )
        total = CounterMetricFamily(
            n.SMLENS_BACKEND_SAMPLE_SECONDS,
            "Time the backend spent sampling since start.",
            labels=["backend"],
        )
        samples = CounterMetricFamily(
            n.SMLENS_BACKEND_SAMPLES, "Ticks the backend took part in.", labels=["backend"]
        )
        errors = CounterMetricFamily(
            n.SMLENS_BACKEND_ERRORS, "Failed reads, by backend and reason.", labels=["backend", "reason"]
        )
        for stats in snap.backends:
            backend_up.add_metric([stats.name], 1 if stats.up else 0)
            last.add_metric([stats.name], stats.last_duration_seconds)
            total.add_metric([stats.name], stats.duration_seconds_total)
            samples.add_metric([stats.name], stats.samples_total)
            for reason, count in sorted(stats.errors_total.items()):
                errors.add_metric([stats.name, reason], count)
        yield from (backend_up, last, total, samples, errors)
        yield GaugeMetricFamily(
            n.SMLENS_TICK_DURATION_SECONDS,
            "Duration of the last sampling tick, all backends and GPUs: its calls, decoding and folding.",
            value=snap.tick_duration_seconds,
        )
        yield CounterMetricFamily(
            n.SMLENS_SAMPLER_CPU_SECONDS,
            "CPU time of the sampler's ticks since start: their calls, decoding, folding and rendering for "
            "/metrics (a tick's rendering counts in the next snapshot).",
            value=snap.sampler_cpu_seconds_total,
        )
        yield GaugeMetricFamily(
            n.SMLENS_SAMPLING_INTERVAL_SECONDS, "Configured sampling interval.", value=snap.interval_seconds
        )
        yield GaugeMetricFamily(
            n.SMLENS_SNAPSHOT_TIMESTAMP_SECONDS,
            "Unix time the served snapshot was taken.",
            value=snap.taken_at,
        )
