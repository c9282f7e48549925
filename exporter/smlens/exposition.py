"""Pre-rendered /metrics bodies: rendered at most once per snapshot and format, served many times.

Only ``smlens_snapshot_age_seconds`` is computed per request (a string format), so that a stalled
sampler shows as a growing age rather than as silently frozen numbers.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from smlens.collector import SnapshotCollector
from smlens.metricfamily import CollectorRegistry
from smlens.model import Snapshot
from smlens.process_metrics import ProcessCollector
from smlens.textformat import OPENMETRICS_EOF, render

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the format every Prometheus 2.x parses
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_AGE_HEADER = (
    b"# HELP smlens_snapshot_age_seconds Age of the served snapshot when this scrape was answered.\n"
    b"# TYPE smlens_snapshot_age_seconds gauge\n"
)


class _Body:
    """One format's body without its dynamic tail, plus a gzip stream primed with it."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 31)
        self._gzip_head = self._gzip.compress(head)

    def plain(self, tail: bytes) -> bytes:
        return self.head + tail

    def gzipped(self, tail: bytes) -> bytes:
        stream = self._gzip.copy()  # cheap: continues the primed stream without recompressing the head
        return self._gzip_head + stream.compress(tail) + stream.flush()


@dataclass(frozen=True)
class Response:
    body: bytes
    content_type: str
    gzipped: bool


def live_registry() -> CollectorRegistry:
    """Metrics read at each scrape rather than per snapshot: the standard process_* family (memory, CPU,
    file descriptors of this process), and whatever the server registers (its connection counters)."""
    registry = CollectorRegistry()
    registry.register(ProcessCollector())
    return registry


def render_live(registry: CollectorRegistry, openmetrics: bool) -> bytes:
    return render(registry.collect(), openmetrics)


class Exposition:
    """Answers scrapes for one snapshot; each format is rendered at most once, on its first scrape.

    Rendering lazily keeps an unscraped tick nearly free (Prometheus scrapes every 15-60 s while
    the sampler ticks every second) and Prometheus asks for one format only.
    """

    def __init__(self, snapshot: Snapshot, wall: Callable[[], float] = time.time) -> None:
        self.snapshot = snapshot
        self._wall = wall
        self._bodies: dict[bool, _Body] = {}
        self._lock = threading.Lock()

    def _render(self, openmetrics: bool) -> _Body:
        with self._lock:
            body = self._bodies.get(openmetrics)
            if body is None:
                body = _Body(render(SnapshotCollector(self.snapshot).collect(), openmetrics))
                self._bodies[openmetrics] = body
            return body

    def age(self) -> float:
        return max(self._wall() - self.snapshot.taken_at, 0.0)

    def respond(self, openmetrics: bool, gzip: bool, live: bytes = b"") -> Response:
        """``live``: metrics rendered for this scrape, in the same format, placed before the age."""
        body = self._render(openmetrics)
        tail = live + _AGE_HEADER + f"smlens_snapshot_age_seconds {self.age():.3f}\n".encode()
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        if openmetrics:
            tail += OPENMETRICS_EOF
        return Response(body.gzipped(tail) if gzip else body.plain(tail), content_type, gzip)
