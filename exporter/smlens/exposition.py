"""Pre-rendered /metrics bodies: rendered once per snapshot, served many times.

Only ``smlens_snapshot_age_seconds`` is computed per request (a string format), so that a stalled
sampler shows as a growing age rather than as silently frozen numbers.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics_format

from smlens.collector import SnapshotCollector
from smlens.model import Snapshot

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the format every Prometheus 2.x parses
OPENMETRICS_CONTENT_TYPE = openmetrics_format.CONTENT_TYPE_LATEST
_AGE_HEADER = (
    b"# HELP smlens_snapshot_age_seconds Age of the served snapshot when this scrape was answered.\n"
    b"# TYPE smlens_snapshot_age_seconds gauge\n"
)
_EOF = b"# EOF\n"


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


class Exposition:
    """Renders a snapshot once in both formats and answers scrapes from the result."""

    def __init__(self, snapshot: Snapshot, wall: Callable[[], float] = time.time) -> None:
        self.snapshot = snapshot
        self._wall = wall
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(snapshot))
        self._text = _Body(text_format.generate_latest(registry))
        openmetrics: bytes = openmetrics_format.generate_latest(registry)  # type: ignore[no-untyped-call]
        self._openmetrics = _Body(openmetrics.removesuffix(_EOF))

    def age(self) -> float:
        return max(self._wall() - self.snapshot.taken_at, 0.0)

    def respond(self, openmetrics: bool, gzip: bool) -> Response:
        tail = _AGE_HEADER + f"smlens_snapshot_age_seconds {self.age():.3f}\n".encode()
        body, content_type = self._text, TEXT_CONTENT_TYPE
        if openmetrics:
            body, content_type, tail = self._openmetrics, OPENMETRICS_CONTENT_TYPE, tail + _EOF
        return Response(body.gzipped(tail) if gzip else body.plain(tail), content_type, gzip)
