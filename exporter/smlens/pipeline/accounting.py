"""GPU-seconds by verdict class and owner: the ledger behind gpu_verdict_seconds_total.

Every tick judges each GPU, or each MIG GPU instance of a GPU in MIG mode, on that tick's ratios (the
verdicts the status page shows) and adds the tick's seconds to the account of its class and of the
workload that held it then, split evenly where several workloads share it. Prometheus cannot do this
from the window means: a 10-minute mean of a GPU that alternates between compute-bound and idle is
"partial", while its seconds were spent in the two classes.

Only accounts that occurred exist. One no tick has added to for ``LINGER_SECONDS`` is dropped, so that a
departed pod's series go stale as the pod's own do, after staying long enough for every scrape interval
in use to read their last value; one that comes back starts again from zero, which Prometheus reads as
a counter reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from smlens import names as n
from smlens.model import EMPTY, UNATTRIBUTED, Account, Attribution, Entry, GpuState, Ledger, Workload
from smlens.verdicts.judge import latest, latest_instance
from smlens.verdicts.thresholds import Thresholds

# Prometheus' staleness period: a scrape interval longer than this is not in use.
LINGER_SECONDS = 300.0
# Accounts one GPU keeps at most: pods that churn faster than LINGER_SECONDS (a crash loop, a storm of
# short jobs) would otherwise grow a GPU's series without bound; the least recently added go first.
MAX_ACCOUNTS_PER_GPU = 32
# A tick later than this many intervals after the one before (a stalled sampler, a suspended node) adds
# only that much: what the GPU did in the gap was not seen.
MAX_TICK_INTERVALS = 2.0


def owners(attribution: Attribution, uuid: str, gpu_instance: int | None = None) -> tuple[Workload, ...]:
    """The workloads that hold a GPU (or one of its MIG GPU instances): those the kubelet or the sim
    layout gave it; else, on a node without them (Slurm, bare metal), those whose processes use it;
    else none (the unattributed workload). Sorted, so that a split is the same every tick."""
    if not attribution.owner_labels:
        return (UNATTRIBUTED,)
    allocations = attribution.allocations_of(uuid)
    if gpu_instance is not None:
        held = {a.owner for a in allocations if a.gpu_instance == gpu_instance}
    else:
        held = {a.owner for a in allocations}
        if not held:
            held = {w.workload for w in attribution.workloads if w.gpu_uuid == uuid} - {UNATTRIBUTED}
    return tuple(sorted(held)) or (UNATTRIBUTED,)


def _judged(t: Thresholds, gpu: GpuState) -> list[tuple[int | None, str, str]]:
    """(gpu_instance, mig_profile, verdict code) of what a tick accounts for one GPU: its instances in
    MIG mode (the GPU's own seconds would count them twice), else the GPU."""
    if gpu.up and gpu.instances:
        return [
            (i.instance.gpu_instance, i.instance.profile, latest_instance(t, i).code) for i in gpu.instances
        ]
    verdict = latest(t, gpu)
    return [(None, "", n.VERDICT_DOWN if verdict is None else verdict.code)]


def account(
    t: Thresholds,
    ledger: Ledger,
    gpus: Sequence[GpuState],
    attribution: Attribution,
    seconds: float,
    now: float,
) -> Ledger:
    """The ledger after a tick of ``seconds`` that ended at ``now`` (the sampler's clock)."""
    entries = dict(ledger)
    if seconds > 0:
        for gpu in gpus:
            uuid = gpu.identity.uuid
            for gpu_instance, profile, verdict in _judged(t, gpu):
                held_by = owners(attribution, uuid, gpu_instance)
                share = seconds / len(held_by)
                for owner in held_by:
                    key = Account(uuid, gpu_instance, profile, verdict, owner)
                    before = entries.get(key)
                    entries[key] = Entry(share + (0.0 if before is None else before.seconds), now)
    kept = {key: entry for key, entry in entries.items() if now - entry.added_at < LINGER_SECONDS}
    per_gpu: dict[str, list[Account]] = {}
    for key in kept:
        per_gpu.setdefault(key.uuid, []).append(key)
    for keys in per_gpu.values():
        if len(keys) > MAX_ACCOUNTS_PER_GPU:
            keys.sort(key=lambda k: kept[k].added_at)
            for key in keys[: len(keys) - MAX_ACCOUNTS_PER_GPU]:
                del kept[key]
    return MappingProxyType(kept) if kept else EMPTY


class Accountant:
    """The ledger across ticks: ``tick`` folds one tick into it, timed by the sampler's clock."""

    def __init__(self, thresholds: Thresholds, interval: float) -> None:
        self._thresholds = thresholds
        self._longest = MAX_TICK_INTERVALS * interval
        self._previous: float | None = None
        self.ledger: Ledger = EMPTY

    def tick(self, gpus: Sequence[GpuState], attribution: Attribution, at: float) -> Ledger:
        """Account a tick captured at ``at``: the seconds since the capture before it (none for the
        first, whose GPUs' state before it was not seen)."""
        seconds = 0.0 if self._previous is None else min(max(at - self._previous, 0.0), self._longest)
        self._previous = at
        self.ledger = account(self._thresholds, self.ledger, gpus, attribution, seconds, at)
        return self.ledger
