"""The /metrics bodies of one snapshot, rendered by the sampler's thread after each tick.

:class:`Publisher` is a sampler listener: for every snapshot it renders the text format and OpenMetrics
with prometheus_client's own ``generate_latest``, and primes a gzip stream with each, so that a scrape only
picks the latest :class:`Rendered` and appends the families it renders itself (:mod:`.live`).
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.registry import CollectorRegistry

from smlens.exposition.collector import SnapshotCollector
from smlens.model import Snapshot

# What generate_latest writes for smlens' names: the text format 0.0.4, which every Prometheus 2.x parses.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = openmetrics_format.CONTENT_TYPE_LATEST
OPENMETRICS_EOF = b"# EOF\n"
GZIP_LEVEL = 6


class Body:
    """One format's families of a snapshot, and a gzip stream already fed with them."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self._gzip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        self._gzip_head = self._gzip.compress(head)

    def plain(self, tail: bytes) -> bytes:
        return self.head + tail

    def gzipped(self, tail: bytes) -> bytes:
        """The head's compressed bytes, then ``tail`` through a copy of the primed stream: the head is
        never compressed again, and the copy leaves the primed stream as it was for the next scrape."""
        stream = self._gzip.copy()
        return self._gzip_head + stream.compress(tail) + stream.flush()


class Answer(NamedTuple):
    body: bytes
    content_type: str
    gzipped: bool


class Rendered:
    """A snapshot with its bodies in both formats; immutable once built."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(snapshot))
        self.text = Body(text_format.generate_latest(registry))
        # OpenMetrics ends with one "# EOF": the live families come after these, so it is cut here.
        self.openmetrics = Body(openmetrics_format.generate_latest(registry).removesuffix(OPENMETRICS_EOF))

    def answer(self, openmetrics: bool, gzip: bool, live: bytes) -> Answer:
        """The body of a scrape: these families, then ``live`` (the same format's per-scrape families,
        ending in OpenMetrics' ``# EOF``)."""
        body = self.openmetrics if openmetrics else self.text
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        return Answer(body.gzipped(live) if gzip else body.plain(live), content_type, gzip)


class Publisher:
    """Holds the latest :class:`Rendered`; subscribe :meth:`publish` to the sampler."""

    def __init__(self) -> None:
        self.current: Rendered | None = None

    def publish(self, snapshot: Snapshot) -> None:
        self.current = Rendered(snapshot)
