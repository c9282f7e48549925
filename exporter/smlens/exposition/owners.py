"""Prometheus families for attribution, and the owner labels on per-GPU series.

Called by the collector when it renders a snapshot (once per tick), never per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from smlens import names as n
from smlens.attribution.refresher import PODRESOURCES, PROCESSES, SIM
from smlens.model import Attribution, GpuIdentity, Workload

_WORKLOAD_LABELS = (*n.GPU_LABELS, *n.OWNER_LABELS, n.SLURM_JOB)
# Families that carry their own workload labels and so must not get a GPU's owner on top.
_OWN_LABELS = (n.GPU_ALLOCATION_INFO, n.GPU_WORKLOAD_PREFIX, n.GPU_VERDICT_SECONDS, n.GPU_MIG_SM_SHARE_RATIO)


def with_owner_labels(families: Iterable[Metric], attribution: Attribution) -> Iterator[Metric]:
    """Add namespace, pod and container to every sample of a GPU that exactly one container holds, and
    to every sample of a MIG GPU instance (label ``gpu_instance``) whose MIG devices one container holds."""
    owners: dict[tuple[str, str], dict[str, str]] = {}  # (uuid, gpu_instance or "") -> owner labels
    for allocation in attribution.allocations:
        uuid = allocation.gpu_uuid
        if uuid is None:
            continue
        owner = attribution.sole_owner(uuid)
        if owner is not None:
            owners[(uuid, "")] = _labels(owner)
        if allocation.gpu_instance is not None:
            owner = attribution.instance_owner(uuid, allocation.gpu_instance)
            if owner is not None:
                owners[(uuid, str(allocation.gpu_instance))] = _labels(owner)
    for family in families:
        if owners and not family.name.startswith(_OWN_LABELS):
            family.samples = [_with_owner(sample, owners) for sample in family.samples]
        yield family


def _with_owner(sample: Sample, owners: Mapping[tuple[str, str], dict[str, str]]) -> Sample:
    owner = owners.get((sample.labels.get(n.UUID, ""), sample.labels.get(n.GPU_INSTANCE, "")))
    return sample if owner is None else sample._replace(labels={**sample.labels, **owner})


def _labels(owner: Workload) -> dict[str, str]:
    return dict(zip(n.OWNER_LABELS, (owner.namespace, owner.pod, owner.container), strict=True))


def families(attribution: Attribution, gpus: Sequence[GpuIdentity], hostname: str) -> Iterator[Metric]:
    """gpu_allocation_info, the gpu_workload_* families and the smlens_attribution_* self-metrics,
    each only when a source that feeds it is configured."""
    sources = {state.name for state in attribution.sources}
    if not sources:
        return
    index = {gpu.uuid: str(gpu.index) for gpu in gpus}
    if sources & {PODRESOURCES, SIM}:
        yield _allocation_info(attribution, index, hostname)
    if PROCESSES in sources:
        yield from _workload_families(attribution, index, hostname)
    up = GaugeMetricFamily(
        n.SMLENS_ATTRIBUTION_UP,
        "1 if the attribution source answered its last refresh; 0 drops the labels it gives.",
        labels=["source"],
    )
    duration = GaugeMetricFamily(
        n.SMLENS_ATTRIBUTION_REFRESH_DURATION_SECONDS,
        "Time the last refresh of the attribution source took.",
        labels=["source"],
    )
    for state in attribution.sources:
        up.add_metric([state.name], 1 if state.up else 0)
        if state.refresh_seconds is not None:
            duration.add_metric([state.name], state.refresh_seconds)
    yield from (up, duration)
    if attribution.refreshed_at is not None:
        yield GaugeMetricFamily(
            n.SMLENS_ATTRIBUTION_REFRESH_TIMESTAMP_SECONDS,
            "Unix time of the last attribution refresh.",
            value=attribution.refreshed_at,
        )


def _allocation_info(attribution: Attribution, index: Mapping[str, str], hostname: str) -> Metric:
    info = GaugeMetricFamily(
        n.GPU_ALLOCATION_INFO,
        "1 for each container holding (part of) a GPU, from the kubelet or the sim layout. A device smlens "
        'cannot place on a GPU of this node has gpu="" and its id as reported in uuid.',
        labels=[*n.GPU_LABELS, *n.OWNER_LABELS, "resource"],
    )
    rows = dict.fromkeys(
        (
            "" if a.gpu_uuid is None else index.get(a.gpu_uuid, ""),
            a.device if a.gpu_uuid is None else a.gpu_uuid,
            hostname,
            a.owner.namespace,
            a.owner.pod,
            a.owner.container,
            a.resource,
        )
        for a in attribution.allocations
    )
    for row in rows:
        info.add_metric(list(row), 1)
    return info


def _workload_families(attribution: Attribution, index: Mapping[str, str], hostname: str) -> Iterator[Metric]:
    for name, help_text, field in (
        (
            n.GPU_WORKLOAD_MEMORY_USED_BYTES,
            "GPU memory used by the processes of one workload (pod container or Slurm job) on this GPU, "
            "from NVML's process list. All labels empty: processes outside any pod, container or job.",
            "memory_used_bytes",
        ),
        (
            n.GPU_WORKLOAD_UTILIZATION_RATIO,
            "NVML per-process utilization summed over the workload's processes (capped at 1): the share "
            "of the last attribution refresh window in which a kernel of theirs ran. Time-based like "
            "gpu_utilization_ratio; NOT SM activity.",
            "utilization",
        ),
        (n.GPU_WORKLOAD_PROCESSES, "Processes of the workload that hold a context on this GPU.", "processes"),
    ):
        family = GaugeMetricFamily(name, help_text, labels=_WORKLOAD_LABELS)
        for usage in attribution.workloads:
            value = getattr(usage, field)
            if value is not None and usage.gpu_uuid in index:
                w = usage.workload
                labels = [index[usage.gpu_uuid], usage.gpu_uuid, hostname, w.namespace, w.pod, w.container]
                family.add_metric([*labels, w.slurm_job], value)
        yield family
