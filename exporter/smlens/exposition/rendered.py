"""The /metrics bodies of one snapshot, rendered by the sampler's thread after each tick.

:class:`Publisher` is a sampler listener: for every snapshot it renders, with prometheus_client's own
``generate_latest``, each format that scrapers asked for in the last ``ASKED_WITHIN`` seconds (the text
format until anyone asks for OpenMetrics), and primes a gzip stream with each, so that a scrape only picks
the latest :class:`Rendered` and appends the families it renders itself (:mod:`.live`). Rendering costs
more than the rest of a tick, and a Prometheus asks for one format only: the other is not rendered for
nobody. A scrape that asks for a format not rendered yet gets the other one, which every Prometheus
accepts, and the next tick renders the one it asked for.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection
from typing import NamedTuple, cast

from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.registry import CollectorRegistry

from smlens.exposition.collector import SnapshotCollector
from smlens.exposition.selection import DEFAULT_SELECTION, Selection
from smlens.model import Snapshot

# What generate_latest writes for smlens' names: the text format 0.0.4, which every Prometheus 2.x parses.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = openmetrics_format.CONTENT_TYPE_LATEST
OPENMETRICS_EOF = b"# EOF\n"
GZIP_LEVEL = 6
ASKED_WITHIN = 600.0  # seconds a format stays rendered after the last scrape that asked for it


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
    """A snapshot with its bodies in the formats asked for (``True`` is OpenMetrics), holding the
    families of ``selection``; immutable once built."""

    def __init__(
        self,
        snapshot: Snapshot,
        formats: Collection[bool] = (False, True),
        selection: Selection = DEFAULT_SELECTION,
    ) -> None:
        self.snapshot = snapshot
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(snapshot, selection))
        self.text = Body(text_format.generate_latest(registry)) if False in formats or not formats else None
        # OpenMetrics ends with one "# EOF": the live families come after these, so it is cut here.
        self.openmetrics = (
            # prometheus_client leaves its OpenMetrics writer unannotated.
            Body(cast(bytes, openmetrics_format.generate_latest(registry)).removesuffix(OPENMETRICS_EOF))  # type: ignore[no-untyped-call]
            if True in formats
            else None
        )

    def served(self, openmetrics: bool) -> bool:
        """The format a scrape that asks for ``openmetrics`` gets: that one if rendered, else the other."""
        return (
            openmetrics if (self.openmetrics if openmetrics else self.text) is not None else not openmetrics
        )

    def answer(self, openmetrics: bool, gzip: bool, live: bytes) -> Answer:
        """The body of a scrape in the format :meth:`served` names: these families, then ``live`` (that
        format's per-scrape families, ending in OpenMetrics' ``# EOF``)."""
        body = self.openmetrics if self.served(openmetrics) else self.text
        assert body is not None
        content_type = OPENMETRICS_CONTENT_TYPE if body is self.openmetrics else TEXT_CONTENT_TYPE
        return Answer(body.gzipped(live) if gzip else body.plain(live), content_type, gzip)


class Publisher:
    """Holds the latest :class:`Rendered`; subscribe :meth:`publish` to the sampler, and tell :meth:`asked`
    which format each scrape wanted."""

    def __init__(
        self, selection: Selection = DEFAULT_SELECTION, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.current: Rendered | None = None
        self._selection = selection
        self._clock = clock
        self._asked: dict[bool, float] = {}  # format -> when a scrape last asked for it

    def asked(self, openmetrics: bool) -> None:
        self._asked[openmetrics] = self._clock()

    def formats(self) -> frozenset[bool]:
        """The formats to render: those asked for lately, the text format when none was."""
        now = self._clock()
        recent = frozenset(f for f, at in tuple(self._asked.items()) if now - at <= ASKED_WITHIN)
        return recent or frozenset({False})

    def publish(self, snapshot: Snapshot) -> None:
        self.current = Rendered(snapshot, self.formats(), self._selection)
