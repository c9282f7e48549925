"""Seconds per verdict class and owner over a range, from the raw samples of gpu_verdict_seconds_total.

Method
------
The range is cut into chunks of an hour (the whole range if shorter, the last chunk what is left). At
each chunk boundary ``b`` a range query reads ``last_over_time(gpu_verdict_seconds_total[1h])``: the
exact last sample of every series in the chunk (b - 1h, b], never an extrapolated ``increase()``. A
series' seconds in a chunk are that value less the series' last value before the chunk, unless the
counter may have been reset between them; then, and only for those series and chunks, the raw samples
of the chunk are read (``gpu_verdict_seconds_total{cluster=..., hostname=...}[1h]`` as an instant query)
and summed pair by pair, a sample lower than the one before it counting from 0, as ``increase()`` does
without its extrapolation. A reset is suspected where

- ``resets(gpu_verdict_seconds_total[1h5m])`` is above 0: the 5 minutes of overlap reach the last sample
  before the chunk whenever the series was scraped in the last 5 minutes before it;
- the series had no sample in those 5 minutes, or none in the whole chunk before (a gap: the exporter
  drops an account 5 minutes after it stopped growing, and one that comes back starts from 0); or
- the last value is lower than the one before.

A series first seen in the range counts from 0 (the exporter starts an account at 0); one alive at the
start counts from its last sample in the hour before the start. Series that differ only in target labels
(two scrape jobs of one exporter) count once: the one with the most seconds over the range. A MIG
instance's seconds become GPU-seconds at its ``gpu_mig_sm_share_ratio``, and where prices need it a GPU's
model is ``gpu_info``'s, both read chunk by chunk too. Queries go in batches of up to 24 boundaries, fewer
where the series are many, so that one answer holds at most about 200,000 values; the raw samples read
are those of one node and one chunk at a time. What stays in memory is one small state per series seen in
the range (its labels, last value and seconds per owner), never the samples.

Owners come from :func:`smlens.bundle.accounting.top_owner` (kube-state-metrics), read with a range
query at a coarse step (the larger of 5 minutes and a thousandth of the range) on the pods that held
GPUs: a chunk's seconds go to the top owner the pod had in that chunk, else to any it had in the range,
else (kube-state-metrics never knew it, or knew it only between two steps) to the pod itself; a series
without a pod goes to its Slurm job, one without either to no workload.

Error bound
-----------
Per series, what the exporter counted in the range and what the report counts differ by less than one
scrape interval: the seconds between the last scrape at or before the start and the start count, those
between the last scrape at or before the end and the end do not, and a series ended by a reset (an
exporter restart) loses what it counted after its last scrape. A series the exporter drops loses nothing:
its final value stays scraped for 5 minutes. A reset shows as a lower value; one after which the counter
had already grown past its old value cannot be seen, and that takes an old value no larger than the time
between the two samples around the reset (one scrape interval, unless scrapes failed). The counters
themselves move in the exporter's ticks (``--interval``, 1 s by default), each tick's seconds in the class
of that tick. Owners are resolved per chunk: a pod whose owner changed inside an hour (it never does for a
pod's life) would be counted under one of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from smlens import names as n
from smlens.bundle.accounting import FALLBACKS, top_owner
from smlens.bundle.promql import quoted
from smlens.report.client import Prometheus, ReportError

COUNTER = f"{n.GPU_VERDICT_SECONDS}_total"
CHUNK_MS = 3600_000
OVERLAP_MS = 300_000  # Prometheus' staleness period: the exporter keeps a finished account this long
OWNER_STEP_MS = 300_000
OWNER_STEPS = 1000  # the owner query's step is at least a thousandth of the range
MAX_POINTS = 200_000  # series x boundaries in one answer of the chunk query
MAX_BOUNDARIES = 24  # chunks in one range query
NO_OWNER = ("", "")

# A raw series (every label, target labels included, sorted) as one string: a state per series seen in
# the range stays small. Label names and values are UTF-8 text, which holds neither separator.
Key = str
_PAIR, _NEXT = "\x01", "\x00"
Owner = tuple[str, str]  # (owner_kind, owner_name)
PodKey = tuple[str, str, str]  # (cluster, namespace, pod)
GpuKey = tuple[str, str, str]  # (cluster, hostname, uuid)
InstanceKey = tuple[str, str, str, str, str]  # (cluster, hostname, uuid, gpu_instance, mig_profile)


def _key(metric: Mapping[str, str]) -> Key:
    return _NEXT.join(k + _PAIR + v for k, v in sorted(metric.items()) if k != "__name__")


def _labels(key: Key) -> dict[str, str]:
    return dict(pair.split(_PAIR, 1) for pair in key.split(_NEXT)) if key else {}


def _series_of(entry: Any) -> tuple[dict[str, str], list[tuple[int, float]]]:
    """The labels and the (millisecond, value) points of one series of a matrix."""
    try:
        metric = entry["metric"]
        points = [(round(float(stamp) * 1000), float(value)) for stamp, value in entry["values"]]
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            raise TypeError("labels")
    except (KeyError, TypeError, ValueError, IndexError):
        raise ReportError(
            "Prometheus answered a query with a series that is not Prometheus' matrix."
        ) from None
    return metric, points


def _fallback(labels: Mapping[str, str]) -> Owner:
    """The owner of a series kube-state-metrics gives none for: its pod, else its Slurm job, else none."""
    for _matchers, kind, source in FALLBACKS:
        if labels.get(source):
            return (kind, labels[source])
    return NO_OWNER


@dataclass(slots=True)
class _Series:
    pod: PodKey | None  # a pod's series: its owner comes from kube-state-metrics
    fallback: Owner  # the owner where kube-state-metrics gives none
    value: float | None = None  # the last sample at or before the last boundary read
    present: bool = False  # a sample in the chunk that ended at that boundary
    gap: bool = False  # ... but none in the OVERLAP_MS before the boundary
    seconds: dict[Owner | None, float] = field(default_factory=dict)  # None: a pod's owner, still unknown


@dataclass(frozen=True)
class Spent:
    """A deduplicated series (cluster + VERDICT_SECONDS_LABELS) and its seconds in the range per owner."""

    labels: Mapping[str, str]
    seconds: Mapping[Owner, float]


@dataclass
class Ledger:
    """What :func:`account` read: the series' seconds, each GPU's model and each instance's share."""

    spent: list[Spent]
    models: dict[GpuKey, str]  # gpu_info's model label, as last seen in the range
    shares: dict[InstanceKey, float]  # gpu_mig_sm_share_ratio, as last seen in the range
    series: int  # raw series read, duplicates included
    raw_fetches: int  # (node, chunk) pairs whose raw samples were read


class _Pass:
    def __init__(
        self, prometheus: Prometheus, cluster: str, start_ms: int, end_ms: int, models: bool
    ) -> None:
        self.prometheus = prometheus
        self.cluster = cluster
        self.want_models = models
        self.start_ms, self.end_ms = start_ms, end_ms
        self.chunk_ms = min(CHUNK_MS, end_ms - start_ms)
        self.owner_step_ms = max(OWNER_STEP_MS, math.ceil((end_ms - start_ms) / OWNER_STEPS / 1000) * 1000)
        self.states: dict[Key, _Series] = {}
        self.mig = False  # a MIG instance's series seen: its share is needed
        self.models: dict[GpuKey, str] = {}
        self.shares: dict[InstanceKey, float] = {}
        self.owners: dict[PodKey, list[tuple[int, Owner]]] = {}  # this batch's observations, by time
        self.last_owner: dict[PodKey, Owner] = {}  # any owner a pod had in the range: the last one seen
        self.raw_fetches = 0
        selector = f'group by ({cluster}, {n.NAMESPACE}, {n.POD}) ({COUNTER}{{{n.POD}!=""}})'
        self.owner_expr = (
            f"(\n{top_owner(cluster, f'{self.owner_step_ms // 1000}s')}\n)\n"
            f"and on ({cluster}, {n.NAMESPACE}, {n.POD})\n{selector}"
        )

    # -- the batches of boundaries -------------------------------------------------------------------

    def run(self) -> None:
        self._batch([self.start_ms], self.chunk_ms, counted=False)  # the baseline: the hour before the start
        cursor, per_batch = self.start_ms, 1
        while cursor < self.end_ms:
            left = self.end_ms - cursor
            if left >= self.chunk_ms:
                count = max(1, min(per_batch, left // self.chunk_ms))
                points = [cursor + i * self.chunk_ms for i in range(1, count + 1)]
                self._batch(points, self.chunk_ms, counted=True)
            else:
                points = [self.end_ms]
                self._batch(points, left, counted=True)
            cursor = points[-1]
            live = sum(1 for s in self.states.values() if s.present)
            per_batch = max(1, min(MAX_BOUNDARIES, MAX_POINTS // max(live, 1)))

    def _range(
        self, expr: str, points: list[int], step_ms: int
    ) -> Iterator[tuple[dict[str, str], dict[int, float]]]:
        result = self.prometheus.query_range(expr, points[0] / 1000, points[-1] / 1000, step_ms / 1000)
        for entry in result:
            metric, found = _series_of(entry)
            yield metric, dict(found)

    def _state(self, metric: Mapping[str, str]) -> tuple[Key, _Series]:
        key = _key(metric)
        state = self.states.get(key)
        if state is None:
            pod = metric.get(n.POD, "")
            where = (metric.get(self.cluster, ""), metric.get(n.NAMESPACE, ""), pod) if pod else None
            state = self.states[key] = _Series(where, _fallback(metric))
            self.mig = self.mig or bool(metric.get(n.GPU_INSTANCE))
        return key, state

    def _batch(self, points: list[int], length_ms: int, counted: bool) -> None:
        step = self.chunk_ms if len(points) > 1 else length_ms
        window = f"{COUNTER}[{length_ms}ms]"
        by_point: dict[int, dict[Key, float]] = {p: {} for p in points}
        for metric, values in self._range(f"last_over_time({window})", points, step):
            key, _state = self._state(metric)
            for at, value in values.items():
                if at in by_point:
                    by_point[at][key] = value
        gaps: set[tuple[Key, int]] = set()
        if length_ms > OVERLAP_MS:
            expr = f"last_over_time({window}) unless last_over_time({COUNTER}[{OVERLAP_MS}ms])"
            gaps = {(_key(metric), at) for metric, values in self._range(expr, points, step) for at in values}
        resets: set[tuple[Key, int]] = set()
        if counted:
            expr = f"resets({COUNTER}[{length_ms + OVERLAP_MS}ms]) > 0"
            resets = {
                (_key(metric), at) for metric, values in self._range(expr, points, step) for at in values
            }
            self._read_owners(points[0] - length_ms, points[-1])
            self._read_facts(points, length_ms, step)
        raw: dict[tuple[str, str, int], dict[Key, float]] = {}  # (cluster, hostname, boundary): baselines
        for at in points:
            present = by_point[at]
            for key, value in present.items():
                state = self.states[key]
                if counted:
                    suspect = (key, at) in resets
                    if state.value is not None:
                        suspect = suspect or not state.present or state.gap or value < state.value
                    baseline = 0.0 if state.value is None else state.value
                    if suspect:
                        labels = _labels(key)
                        node = (labels.get(self.cluster, ""), labels.get(n.HOSTNAME, ""), at)
                        raw.setdefault(node, {})[key] = baseline
                    else:
                        self._add(state, value - baseline, at - length_ms, at)
                state.value, state.present, state.gap = value, True, (key, at) in gaps
            for key, state in self.states.items():
                if key not in present:
                    state.present = False
        for (cluster, hostname, at), baselines in raw.items():
            self._read_raw(cluster, hostname, at, length_ms, baselines, by_point[at])
        self.owners = {}

    def _read_raw(
        self,
        cluster: str,
        hostname: str,
        at: int,
        length_ms: int,
        baselines: dict[Key, float],
        last: Mapping[Key, float],
    ) -> None:
        """The chunk (at - length_ms, at] of a node's series whose counters may have been reset, summed
        sample by sample from each one's baseline (its last value before the chunk, or 0)."""
        self.raw_fetches += 1
        matchers = f"{self.cluster}={quoted(cluster)}, {n.HOSTNAME}={quoted(hostname)}"
        result = self.prometheus.query(f"{COUNTER}{{{matchers}}}[{length_ms}ms]", at / 1000)
        for entry in result:
            metric, points = _series_of(entry)
            key = _key(metric)
            if key not in baselines:
                continue
            previous, total = baselines.pop(key), 0.0
            for stamp, value in points:
                if stamp <= at - length_ms:  # Prometheus 2 takes the window's start in, 3 does not
                    continue
                total += value if value < previous else value - previous
                previous = value
            self._add(self.states[key], total, at - length_ms, at)
        for key, baseline in baselines.items():  # gone between the two queries (retention): its last value
            value = last[key]
            self._add(self.states[key], value if value < baseline else value - baseline, at - length_ms, at)

    def _read_facts(self, points: list[int], length_ms: int, step_ms: int) -> None:
        """The models of the GPUs (where prices need them) and the shares of the MIG instances, chunk by
        chunk like the counters, so that no query reads a long range at once."""
        gpu = (self.cluster, n.HOSTNAME, n.UUID)
        if self.want_models:
            expr = f"max by ({', '.join(gpu)}, model) (last_over_time({n.GPU_INFO}[{length_ms}ms]))"
            for metric, _values in self._range(expr, points, step_ms):
                model = metric.get("model", "")
                self.models[(metric.get(gpu[0], ""), metric.get(gpu[1], ""), metric.get(gpu[2], ""))] = model
        if self.mig:
            labels = (*gpu, n.GPU_INSTANCE, n.MIG_PROFILE)
            window = f"[{length_ms}ms]"
            expr = f"max by ({', '.join(labels)}) (last_over_time({n.GPU_MIG_SM_SHARE_RATIO}{window}))"
            for metric, values in self._range(expr, points, step_ms):
                c, host, uuid, instance, profile = (metric.get(label, "") for label in labels)
                self.shares[(c, host, uuid, instance, profile)] = values[max(values)]

    # -- owners --------------------------------------------------------------------------------------

    def _read_owners(self, start_ms: int, end_ms: int) -> None:
        """The top owners of the pods holding GPUs from ``start_ms`` to ``end_ms``."""
        start_ms = min(start_ms, end_ms)
        result = self.prometheus.query_range(
            self.owner_expr, start_ms / 1000, end_ms / 1000, self.owner_step_ms / 1000
        )
        for entry in result:
            labels, points = _series_of(entry)
            pod = (labels.get(self.cluster, ""), labels.get(n.NAMESPACE, ""), labels.get(n.POD, ""))
            owner = (labels.get(n.OWNER_KIND, ""), labels.get(n.OWNER_NAME, ""))
            self.owners.setdefault(pod, []).extend((stamp, owner) for stamp, _value in points)
        for pod, seen in self.owners.items():
            seen.sort()
            self.last_owner[pod] = seen[-1][1]

    def _owner(self, state: _Series, start_ms: int, end_ms: int) -> Owner | None:
        """The owner of a series' seconds in the chunk (start_ms, end_ms]; None: a pod whose owner
        kube-state-metrics did not give then."""
        if state.pod is None:
            return state.fallback
        for at, owner in reversed(self.owners.get(state.pod, [])):  # the last one in or just before the chunk
            if at <= end_ms:
                return owner if at > start_ms - self.owner_step_ms else None
        return None

    def _add(self, state: _Series, seconds: float, start_ms: int, end_ms: int) -> None:
        if seconds > 0:
            owner = self._owner(state, start_ms, end_ms)
            state.seconds[owner] = state.seconds.get(owner, 0.0) + seconds

    # -- the result ----------------------------------------------------------------------------------

    def spent(self) -> list[Spent]:
        """Per deduplicated series, its seconds per owner; a pod's unknown owner resolved now."""
        names = (self.cluster, *n.VERDICT_SECONDS_LABELS)
        best: dict[tuple[str, ...], tuple[float, _Series]] = {}
        for key, state in self.states.items():
            total = sum(state.seconds.values())
            if total <= 0:
                continue
            labels = _labels(key)
            dedup = tuple(labels.get(name, "") for name in names)
            if dedup not in best or total > best[dedup][0]:
                best[dedup] = (total, state)
        spent = []
        for dedup, (_total, state) in sorted(best.items()):
            seconds: dict[Owner, float] = {}
            for owner, value in state.seconds.items():
                if owner is None:  # any owner the pod had in the range, else the pod itself
                    assert state.pod is not None
                    owner = self.last_owner.get(state.pod) or state.fallback
                seconds[owner] = seconds.get(owner, 0.0) + value
            spent.append(Spent(dict(zip(names, dedup, strict=True)), seconds))
        return spent


def account(prometheus: Prometheus, cluster: str, start: float, end: float, models: bool) -> Ledger:
    """The seconds of every gpu_verdict_seconds_total series from ``start`` to ``end`` (unix times),
    the shares of the MIG instances among them and, with ``models``, the models of the GPUs."""
    read = _Pass(prometheus, cluster, round(start * 1000), round(end * 1000), models)
    read.run()
    return Ledger(read.spent(), read.models, read.shares, len(read.states), read.raw_fetches)
