"""Prometheus families for MIG GPU instances: ``gpu_mig_*``, one series per GPU instance.

They carry the parent GPU's labels plus ``gpu_instance``, ``mig_profile`` and ``mig_uuid``. Their names
differ from the whole-GPU families on purpose: an aggregation over ``gpu_sm_active_ratio`` must not mix a
GPU with its own slices. NVML gives no utilization per MIG instance, so there is no
``gpu_mig_utilization_ratio``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from smlens import names as n
from smlens.model import GpuIdentity, InstanceState, MigInstance, Snapshot
from smlens.names import INSTANCE_LABELS

Specs = Sequence[tuple[str, str, str]]  # (reading key, whole-GPU family name, help)
_SCOPE = " Per MIG GPU instance; docs/metrics.md says what it is relative to."
MEMORY = (
    (n.MEMORY_USED_BYTES, n.GPU_MIG_MEMORY_USED_BYTES, "Memory in use in this MIG GPU instance."),
    (n.MEMORY_TOTAL_BYTES, n.GPU_MIG_MEMORY_TOTAL_BYTES, "Memory of this MIG GPU instance in total."),
)


def _per_instance(families: Specs) -> list[tuple[str, str, str]]:
    """The instance twins of whole-GPU families (names.mig_twin), for what is read per instance
    (NVML utilization is not: NVML gives none per MIG instance)."""
    return [
        (key, n.mig_twin(name), text + _SCOPE) for key, name, text in families if key in n.INSTANCE_ACTIVITIES
    ]


def families(
    snapshot: Snapshot, ratios: Specs, integrals: Specs, coverage: Specs, exported: Callable[[str], bool]
) -> Iterator[Metric]:
    """The gpu_mig_* twins of the whole-GPU ``ratios``, ``integrals`` and ``coverage`` families, plus
    gpu_mig_info and memory, those of them ``exported`` names; nothing at all on a node without MIG
    instances."""
    rows = [(_labels(snapshot, gpu.identity, i.instance), i) for gpu in snapshot.gpus for i in gpu.instances]
    if not rows:
        return
    info = GaugeMetricFamily(
        n.GPU_MIG_INFO,
        "One series per MIG GPU instance, value 1; sm_count is the SMs of its compute instances.",
        labels=[*INSTANCE_LABELS, "sm_count"],
    )
    for labels, state in rows:
        sms = state.instance.sm_count
        info.add_metric([*labels, "" if sms is None else str(sms)], 1)
    yield info
    gauges = [spec for spec in (*_per_instance(ratios), *MEMORY) if exported(spec[1])]
    yield from _gauges(rows, gauges)
    counters = [(f, False) for f in _per_instance(integrals)] + [(f, True) for f in _per_instance(coverage)]
    for (key, name, text), covered in counters:
        if not exported(name):
            continue
        family = CounterMetricFamily(name, text, labels=INSTANCE_LABELS)
        for labels, state in rows:
            activity = state.activity_totals.get(key)
            if activity is not None:
                family.add_metric(labels, activity.covered_seconds if covered else activity.active_seconds)
        yield family


def _labels(snapshot: Snapshot, gpu: GpuIdentity, instance: MigInstance) -> list[str]:
    return [
        str(gpu.index),
        gpu.uuid,
        snapshot.hostname,
        str(instance.gpu_instance),
        instance.profile,
        instance.mig_uuid,
    ]


def _gauges(rows: Sequence[tuple[list[str], InstanceState]], specs: Specs) -> Iterator[Metric]:
    for key, name, text in specs:
        family = GaugeMetricFamily(name, text, labels=INSTANCE_LABELS)
        for labels, state in rows:
            value = state.gauges.get(key)
            if value is not None:
                family.add_metric(labels, value)
        yield family
