"""The request path only reads: no answer of the application calls a backend, decodes a tick, folds it or
renders the exposition; the sampler's thread does all of that after every tick, also when nothing scraped
for a while."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from smlens.exposition import rendered
from smlens.exposition.collector import SnapshotCollector
from smlens.exposition.rendered import Publisher
from smlens.model import GpuIdentity, Reading
from smlens.pipeline.sampler import Sampler
from smlens.sources.base import Captured
from smlens.sources.sim import Scenario, SimBackend
from smlens.verdicts import thresholds
from smlens.web.app import create_app
from smlens.web.status.history import History


class Recorded:
    def __init__(self) -> None:
        self.threads: dict[str, list[str]] = {"capture": [], "decode": [], "render": []}
        self.lock = threading.Lock()

    def note(self, what: str) -> None:
        with self.lock:
            self.threads[what].append(threading.current_thread().name)


class RecordingSim(SimBackend):
    """The sim node, noting the thread of every capture and every decoding."""

    def __init__(self, recorded: Recorded) -> None:
        super().__init__(Scenario.steady(2), seed=3)
        self.recorded = recorded

    def capture(self, gpu: GpuIdentity, now: float) -> Captured:
        self.recorded.note("capture")
        inner = super().capture(gpu, now)

        def decode() -> Reading:
            self.recorded.note("decode")
            return inner()

        return decode


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorded]:
    notes = Recorded()
    collect = SnapshotCollector.collect

    def noting(self: SnapshotCollector) -> Iterator[object]:
        notes.note("render")
        yield from collect(self)

    monkeypatch.setattr(rendered.SnapshotCollector, "collect", noting)
    yield notes


def test_answers_after_an_idle_spell_call_nothing_but_reads(recorded: Recorded) -> None:
    limits = thresholds.load()
    sampler = Sampler(RecordingSim(recorded), [], hostname="node", interval=0.05)
    sampler.open()
    publisher, history = Publisher(), History(limits)
    sampler.subscribe(publisher.publish)
    sampler.subscribe(history.record)
    http = TestClient(create_app(publisher, limits, sampler.alive, history))
    sampler.start()
    try:
        deadline = time.monotonic() + 20
        while (publisher.current is None or publisher.current.snapshot.sequence < 10) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)  # no request meanwhile: the idle spell
        assert publisher.current is not None and publisher.current.snapshot.sequence >= 10
        for path in ("/metrics", "/api/v1/gpus", "/api/v1/history", "/-/ready"):
            assert http.get(path).status_code == 200, path
        om = http.get(
            "/metrics", headers={"Accept": "application/openmetrics-text", "Accept-Encoding": "gzip"}
        )
        assert om.status_code == 200
    finally:
        sampler.close()
    assert {what: set(names) for what, names in recorded.threads.items()} == {
        "capture": {"smlens-sampler"},
        "decode": {"smlens-sampler"},
        "render": {"smlens-sampler"},
    }


def test_metrics_serves_the_latest_tick_rendered_before_the_request(recorded: Recorded) -> None:
    """What a scrape gets is what the sampler's thread rendered last, byte for byte, whenever it comes."""
    limits = thresholds.load()
    sampler = Sampler(RecordingSim(recorded), [], hostname="node", interval=1.0)
    sampler.open()
    publisher = Publisher()
    sampler.subscribe(publisher.publish)
    for _ in range(3):
        sampler.tick()
    assert publisher.current is not None
    head = publisher.current.text.head
    renders = len(recorded.threads["render"])
    http = TestClient(create_app(publisher, limits, lambda: True))
    body = http.get("/metrics", headers={"Accept-Encoding": "identity"}).content
    assert body.startswith(head) and b"smlens_snapshot_age_seconds " in body[len(head) :]
    assert len(recorded.threads["render"]) == renders
