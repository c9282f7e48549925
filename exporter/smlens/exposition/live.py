"""The families rendered at each scrape rather than per snapshot: the process' own (prometheus_client's
``ProcessCollector``), the web server's counters, and the age of the snapshot served, so that a stalled
sampler shows as a growing age rather than as silently frozen numbers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import cast

from prometheus_client import exposition as text_format
from prometheus_client import process_collector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.registry import Collector, CollectorRegistry

from smlens.model import Snapshot


class SnapshotAge(Collector):
    def __init__(self, latest: Callable[[], Snapshot | None], wall: Callable[[], float] = time.time) -> None:
        self._latest = latest
        self._wall = wall

    def collect(self) -> Iterator[Metric]:
        snapshot = self._latest()
        if snapshot is not None:
            yield GaugeMetricFamily(
                "smlens_snapshot_age_seconds",
                "Age of the served snapshot when this scrape was answered.",
                value=max(self._wall() - snapshot.taken_at, 0.0),
            )


def live_registry(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    process_collector.ProcessCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def render_live(registry: CollectorRegistry, openmetrics: bool) -> bytes:
    """In OpenMetrics, with the body's one closing ``# EOF``."""
    if openmetrics:
        return cast(bytes, openmetrics_format.generate_latest(registry))  # type: ignore[no-untyped-call]
    return text_format.generate_latest(registry)
