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
from smlens.exposition import instances as instance_metrics
from smlens.exposition import owners as attribution_metrics
from smlens.model import GpuState, Snapshot

RATIO_GAUGES: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        "gpu_utilization_ratio",
        "NVML utilization over the last tick: share of time at least one kernel ran. It does NOT say how "
        "much of the GPU worked: one kernel on one SM reads 1.0. Compare gpu_sm_active_ratio.",
    ),
    (
        n.SM_ACTIVE,
        "gpu_sm_active_ratio",
        "Share of SM cycles with at least one warp resident, averaged over all SMs and the last tick.",
    ),
    (
        n.SM_OCCUPANCY,
        "gpu_sm_occupancy_ratio",
        "Resident warps over the maximum warps per SM, averaged over all SMs and the last tick.",
    ),
    (n.TENSOR_ACTIVE, "gpu_tensor_active_ratio", "Share of cycles any tensor pipe was active, last tick."),
    (
        n.HMMA_ACTIVE,
        "gpu_hmma_active_ratio",
        "Share of cycles the FP16/BF16 tensor (HMMA) pipe was active, last tick.",
    ),
    (
        n.DRAM_ACTIVE,
        "gpu_dram_active_ratio",
        "Share of cycles the device memory interface was busy (bandwidth used over peak), last tick.",
    ),
    (n.FP64_ACTIVE, "gpu_fp64_active_ratio", "Share of cycles the FP64 pipe was active, last tick."),
    (n.FP32_ACTIVE, "gpu_fp32_active_ratio", "Share of cycles the FP32 pipe was active, last tick."),
    (n.FP16_ACTIVE, "gpu_fp16_active_ratio", "Share of cycles the FP16 pipe was active, last tick."),
)

ACTIVITY_COUNTERS: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        "gpu_busy_seconds",
        "Integral of NVML utilization (time any kernel ran); rate() over a window is the mean utilization.",
    ),
    (
        n.SM_ACTIVE,
        "gpu_sm_active_seconds",
        "Integral of SM activity; its rate() over that of gpu_profiled_seconds_total is the exact mean.",
    ),
    (n.SM_OCCUPANCY, "gpu_sm_occupancy_seconds", "Integral of SM occupancy over time."),
    (n.TENSOR_ACTIVE, "gpu_tensor_active_seconds", "Integral of tensor pipe activity over time."),
    (n.DRAM_ACTIVE, "gpu_dram_active_seconds", "Integral of DRAM activity over time."),
)
COVERAGE_COUNTERS: Sequence[tuple[str, str, str]] = (
    (
        n.UTILIZATION,
        "gpu_utilization_sampled_seconds",
        "Wall seconds covered by utilization samples: the denominator of gpu_busy_seconds_total.",
    ),
    (
        n.SM_ACTIVE,
        "gpu_profiled_seconds",
        "Wall seconds covered by SM-level (profiling) samples: the denominator of the SM, tensor and DRAM "
        "*_seconds_total counters.",
    ),
)

PLAIN_GAUGES: Sequence[tuple[str, str, str]] = (
    (n.MEMORY_USED_BYTES, "gpu_memory_used_bytes", "Framebuffer memory in use."),
    (n.MEMORY_TOTAL_BYTES, "gpu_memory_total_bytes", "Framebuffer memory in total."),
    (n.POWER_WATTS, "gpu_power_watts", "Board power draw."),
    (n.POWER_LIMIT_WATTS, "gpu_power_limit_watts", "Enforced board power limit."),
    (n.TEMPERATURE_CELSIUS, "gpu_temperature_celsius", "GPU core temperature."),
    (n.MEMORY_TEMPERATURE_CELSIUS, "gpu_memory_temperature_celsius", "Device memory (HBM) temperature."),
    (n.SM_CLOCK_HERTZ, "gpu_sm_clock_hertz", "Current SM clock."),
    (n.MEMORY_CLOCK_HERTZ, "gpu_memory_clock_hertz", "Current memory clock."),
    (n.SM_CLOCK_MAX_HERTZ, "gpu_sm_clock_max_hertz", "Maximum SM clock."),
)

PLAIN_COUNTERS: Sequence[tuple[str, str, str]] = (
    (n.ENERGY_JOULES, "gpu_energy_joules", "Energy consumed, from the driver's counter."),
    (n.PCIE_REPLAYS, "gpu_pcie_replays", "PCIe replays (link-level retransmissions)."),
    (n.PCIE_TX_BYTES, "gpu_pcie_transmit_bytes", "Bytes the GPU sent over PCIe."),
    (n.PCIE_RX_BYTES, "gpu_pcie_receive_bytes", "Bytes the GPU received over PCIe."),
    (n.NVLINK_TX_BYTES, "gpu_nvlink_transmit_bytes", "Bytes the GPU sent over NVLink."),
    (n.NVLINK_RX_BYTES, "gpu_nvlink_receive_bytes", "Bytes the GPU received over NVLink."),
)
ECC_COUNTERS = ((n.ECC_CORRECTED, "corrected"), (n.ECC_UNCORRECTED, "uncorrected"))


def _xid_order(item: tuple[str, int]) -> tuple[int, int]:
    """Catalog codes in numeric order, then "other"."""
    code = item[0]
    return (0, int(code)) if code.isdigit() else (1, 0)


def gpu_labels(snapshot: Snapshot, gpu: GpuState) -> list[str]:
    return [str(gpu.identity.index), gpu.identity.uuid, snapshot.hostname]


class SnapshotCollector(Collector):
    """A custom collector over one snapshot; ``collect`` yields fresh families each call."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        gpu_families: Iterator[Metric] = itertools.chain(
            self._gpu_families(snap),
            instance_metrics.families(snap, RATIO_GAUGES, ACTIVITY_COUNTERS, COVERAGE_COUNTERS),
        )
        if snap.attribution.owner_labels:
            gpu_families = attribution_metrics.with_owner_labels(gpu_families, snap.attribution)
        yield from gpu_families
        yield from attribution_metrics.families(
            snap.attribution, [g.identity for g in snap.gpus], snap.hostname
        )
        yield from self._self_families(snap)

    def _gpu_families(self, snap: Snapshot) -> Iterator[Metric]:
        gpus = snap.gpus
        info = GaugeMetricFamily(
            "gpu_info",
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
            "gpu_up", "1 if the last tick read this GPU, 0 if it failed or is lost.", labels=n.GPU_LABELS
        )
        profiling = GaugeMetricFamily(
            "gpu_profiling_available",
            "1 if SM-level metrics (SM active, occupancy, tensor, DRAM) came for this GPU in the last tick; "
            "label source names where they come from (gpm, dcgm, sim) or none.",
            labels=[*n.GPU_LABELS, "source"],
        )
        mode = GaugeMetricFamily(
            "gpu_profiling_mode",
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

        for key, name, help_text in (*RATIO_GAUGES, *PLAIN_GAUGES):
            family: GaugeMetricFamily | CounterMetricFamily = GaugeMetricFamily(
                name, help_text, labels=n.GPU_LABELS
            )
            for gpu in gpus:
                value = gpu.gauges.get(key)
                if value is not None:
                    family.add_metric(gpu_labels(snap, gpu), value)
            yield family
        for key, name, help_text in ACTIVITY_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                activity = gpu.activity_totals.get(key)
                if activity is not None:
                    family.add_metric(gpu_labels(snap, gpu), activity.active_seconds)
            yield family
        for key, name, help_text in COVERAGE_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                activity = gpu.activity_totals.get(key)
                if activity is not None:
                    family.add_metric(gpu_labels(snap, gpu), activity.covered_seconds)
            yield family
        for key, name, help_text in PLAIN_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=n.GPU_LABELS)
            for gpu in gpus:
                value = gpu.totals.get(key)
                if value is not None:
                    family.add_metric(gpu_labels(snap, gpu), value)
            yield family

        ecc = CounterMetricFamily(
            "gpu_ecc_errors",
            "Volatile ECC errors since the last driver load.",
            labels=[*n.GPU_LABELS, "type"],
        )
        events = GaugeMetricFamily(
            "gpu_clock_event_active",
            "1 while the clock-event (throttle) reason holds, 0 when not; only reasons the GPU reports.",
            labels=[*n.GPU_LABELS, "reason"],
        )
        xid = CounterMetricFamily(
            "gpu_xid_errors",
            "XID errors reported by NVML's event API since start.",
            labels=[*n.GPU_LABELS, "xid"],
        )
        for gpu in gpus:
            labels = gpu_labels(snap, gpu)
            for key, kind in ECC_COUNTERS:
                value = gpu.totals.get(key)
                if value is not None:
                    ecc.add_metric([*labels, kind], value)
            for reason, active in sorted(gpu.clock_events.items()):
                events.add_metric([*labels, reason], 1 if active else 0)
            for code, count in sorted(gpu.xid_totals.items(), key=_xid_order):
                xid.add_metric([*labels, code], count)
        yield from (ecc, events, xid)

    def _self_families(self, snap: Snapshot) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "smlens_build_info",
            "smlens version and Python runtime; value 1.",
            labels=["version", "python_version"],
        )
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        backend_up = GaugeMetricFamily(
            "smlens_backend_up",
            "1 if the backend read every GPU it serves in the last tick, 0 if any of those reads failed.",
            labels=["backend"],
        )
        last = GaugeMetricFamily(
            "smlens_backend_last_sample_duration_seconds",
            "Time the backend took in the last tick, over all GPUs.",
            labels=["backend"],
        )
        total = CounterMetricFamily(
            "smlens_backend_sample_seconds",
            "Time the backend spent sampling since start.",
            labels=["backend"],
        )
        samples = CounterMetricFamily(
            "smlens_backend_samples", "Ticks the backend took part in.", labels=["backend"]
        )
        errors = CounterMetricFamily(
            "smlens_backend_errors", "Failed reads, by backend and reason.", labels=["backend", "reason"]
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
            "smlens_tick_duration_seconds",
            "Duration of the last sampling tick, all backends and GPUs: its calls, decoding and folding.",
            value=snap.tick_duration_seconds,
        )
        yield CounterMetricFamily(
            "smlens_sampler_cpu_seconds",
            "CPU time spent sampling since start: the sampler thread's, waits included, and publishing "
            "elsewhere.",
            value=snap.sampler_cpu_seconds_total,
        )
        yield GaugeMetricFamily(
            "smlens_sampling_interval_seconds", "Configured sampling interval.", value=snap.interval_seconds
        )
        yield GaugeMetricFamily(
            "smlens_snapshot_timestamp_seconds",
            "Unix time the served snapshot was taken.",
            value=snap.taken_at,
        )
