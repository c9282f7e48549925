"""Prometheus families of the accounting group: the ledger's GPU-seconds by verdict class and owner,
and the share of its GPU each MIG GPU instance holds (what turns its seconds into GPU-seconds).

Rendered from the snapshot's ledger once per tick, never per scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from smlens import names as n
from smlens.model import Ledger, Snapshot


def families(snapshot: Snapshot) -> Iterator[Metric]:
    """gpu_verdict_seconds_total (one series per account of the ledger) and gpu_mig_sm_share_ratio."""
    index = {gpu.identity.uuid: str(gpu.identity.index) for gpu in snapshot.gpus}
    seconds = CounterMetricFamily(
        n.GPU_VERDICT_SECONDS,
        "Seconds this GPU, or MIG GPU instance (gpu_instance), spent in each verdict class while the "
        "workload named by namespace/pod/container or slurm_job held it, judged tick by tick; split evenly "
        "between the workloads sharing it. All owner labels empty: no workload held it.",
        labels=n.VERDICT_SECONDS_LABELS,
    )
    ledger: Ledger = snapshot.ledger
    for account, entry in ledger.items():
        owner = account.owner
        instance = "" if account.gpu_instance is None else str(account.gpu_instance)
        seconds.add_metric(
            [
                index.get(account.uuid, ""),
                account.uuid,
                snapshot.hostname,
                instance,
                account.mig_profile,
                account.verdict,
                owner.namespace,
                owner.pod,
                owner.container,
                owner.slurm_job,
            ],
            entry.seconds,
        )
    if seconds.samples:
        yield seconds
    share = GaugeMetricFamily(
        n.GPU_MIG_SM_SHARE_RATIO,
        "The share of its GPU's SMs this MIG GPU instance holds: its seconds times this are GPU-seconds.",
        labels=[*n.GPU_LABELS, n.GPU_INSTANCE, n.MIG_PROFILE],
    )
    for gpu in snapshot.gpus:
        total = gpu.identity.sm_count
        for state in gpu.instances:
            sms = state.instance.sm_count
            if sms is not None and total:
                labels = [str(gpu.identity.index), gpu.identity.uuid, snapshot.hostname]
                share.add_metric(
                    [*labels, str(state.instance.gpu_instance), state.instance.profile], sms / total
                )
    if share.samples:
        yield share
