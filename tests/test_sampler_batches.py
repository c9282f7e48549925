"""The sampler captures every tick and publishes captured ticks in batches (smlens.sampler): through the
real nvml and gpm backends on the fake pynvml, batched publishing must give the snapshots that publishing
every tick gives, failures and a GPU lost mid-batch included, and a reader must see every captured tick."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pynvml
import pytest
from starlette.testclient import TestClient

from fakes.fake_pynvml import FakeGpu, FakeNode, install
from smlens import names as n
from smlens import thresholds
from smlens.app import Publisher, create_app
from smlens.backends.nvml import open_nvml_backends
from smlens.backends.sim import Scenario, SimBackend
from smlens.model import Snapshot
from smlens.sampler import PUBLISH_EVERY_TICKS, Sampler

SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
GPUS = ("GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
STEPS = 14


def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    return install(
        monkeypatch,
        *(FakeGpu(uuid, gpm_rates={SM: 40.0 + 10 * i, OCCUPANCY: 20.0}) for i, uuid in enumerate(GPUS)),
    )


def script(fake: FakeNode, step: int) -> None:
    """What happens on the node before a step's tick: XIDs, failing reads, a NaN, a GPU lost."""
    first, second = fake.gpu(GPUS[0]), fake.gpu(GPUS[1])
    fake.advance(1.0)
    first.utilization_samples = [(fake.time_us - 500_000, 30 + step)]
    if step == 3:
        fake.xid(GPUS[0], 79)
    if step == 4:
        first.errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_UNKNOWN
        first.errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    if step == 6:
        first.errors.clear()
        first.gpm_metric_errors[OCCUPANCY] = pynvml.NVML_ERROR_NOT_SUPPORTED
    if step == 7:
        first.errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_TIMEOUT
    if step == 8:
        second.lost = True  # inside the second batch of three: the ticks after it are captured first


def run(monkeypatch: pytest.MonkeyPatch, step: Callable[[Sampler], None]) -> list[Snapshot]:
    fake = node(monkeypatch)
    now = [100.0]
    nvml, gpm = open_nvml_backends(energy_interval=5.0, utilization_interval=2.0)
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0, clock=lambda: now[0], wall=lambda: now[0])
    published: list[Snapshot] = []
    sampler.subscribe(published.append)
    sampler.open()
    try:
        for i in range(STEPS):
            script(fake, i)
            now[0] += 1.0
            step(sampler)
        sampler.publish()
    finally:
        sampler.close()
    return published


def comparable(snapshot: Snapshot) -> Snapshot:
    """The snapshot without what depends on how long the host took."""
    return dataclasses.replace(
        snapshot,
        tick_duration_seconds=0.0,
        sampler_cpu_seconds_total=0.0,
        backends=tuple(
            dataclasses.replace(b, last_duration_seconds=0.0, duration_seconds_total=0.0)
            for b in snapshot.backends
        ),
    )


def test_batched_publishing_gives_the_snapshots_of_publishing_every_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every_tick = run(monkeypatch, lambda s: s.tick())
    with monkeypatch.context() as m:
        ticks = iter(range(STEPS))

        def in_threes(sampler: Sampler) -> None:
            sampler.capture()
            if next(ticks) % 3 == 2:
                sampler.publish()

        batched = run(m, in_threes)
    assert [s.sequence for s in batched] == list(range(1, STEPS + 1))
    assert [comparable(s) for s in batched] == [comparable(s) for s in every_tick]
    # The script did reach the snapshots: the comparison is not between two empty runs.
    last = every_tick[-1]
    assert [g.up for g in last.gpus] == [True, False]
    assert last.gpus[0].xid_totals == {"79": 1}
    assert every_tick[4].gpus[0].missing[n.MEMORY_USED_BYTES] == "unknown"
    assert every_tick[7].gpus[0].missing["clock_events"] == "timeout"
    assert n.SM_OCCUPANCY in last.gpus[0].missing and n.SM_ACTIVE in last.gpus[0].gauges
    assert dict(last.backends[0].errors_total) == {"gpu_lost": 1}


def test_a_gpu_lost_mid_batch_is_not_read_once_the_loss_is_published(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = node(monkeypatch)
    nvml, gpm = open_nvml_backends()
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0)
    sampler.open()
    try:
        sampler.tick()
        fake.gpu(GPUS[1]).lost = True
        sampler.capture()
        sampler.capture()  # the loss is not decoded yet: the GPU is still captured
        calls = sum(fake.gpu(GPUS[1]).calls.values())
        snapshot = sampler.publish()
        assert snapshot is not None and snapshot.sequence == 3
        assert [g.up for g in snapshot.gpus] == [True, False]
        sampler.tick()
        assert sum(fake.gpu(GPUS[1]).calls.values()) == calls
    finally:
        sampler.close()


def test_the_thread_publishes_in_batches_and_in_order() -> None:
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=0.01)
    sampler.open()
    seen: list[int] = []
    batches = threading.Event()
    sampler.subscribe(
        lambda s: (seen.append(s.sequence), s.sequence >= 2 * PUBLISH_EVERY_TICKS and batches.set())
    )
    sampler.start()
    try:
        assert batches.wait(10), "the sampler's thread published fewer than two batches in 10 s"
    finally:
        sampler.close()
    assert seen[: 2 * PUBLISH_EVERY_TICKS] == list(range(1, 2 * PUBLISH_EVERY_TICKS + 1))


def test_publish_from_many_threads_keeps_every_tick_once_and_in_order() -> None:
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=1.0)
    sampler.open()
    seen: list[int] = []
    sampler.subscribe(lambda s: seen.append(s.sequence))
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            sampler.publish()

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(300):
            sampler.capture()
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    sampler.publish()
    assert seen == list(range(1, 301))


def test_metrics_include_every_tick_captured_before_the_scrape() -> None:
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=1.0)
    sampler.open()
    publisher = Publisher()
    sampler.subscribe(publisher.publish)
    client = TestClient(create_app(publisher, thresholds.load(), lambda: True, refresh=sampler.publish))
    assert client.get("/metrics").status_code == 503  # nothing captured yet
    for _ in range(3):
        sampler.capture()
    body = client.get("/metrics").text
    assert 'smlens_backend_samples_total{backend="sim"} 3.0' in body, body


def test_a_failing_listener_costs_the_request_nothing_and_no_tick_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=1.0)
    sampler.open()
    publisher = Publisher()
    sampler.subscribe(publisher.publish)
    failing = [True]

    def flaky(snapshot: Snapshot) -> None:
        if failing[0] and snapshot.sequence == 2:
            raise RuntimeError("a listener bug")

    sampler.subscribe(flaky)
    client = TestClient(create_app(publisher, thresholds.load(), lambda: True, refresh=sampler.publish))
    for _ in range(3):
        sampler.capture()
    response = client.get("/metrics")
    assert response.status_code == 200  # tick 2 was published before its second listener failed
    assert 'smlens_backend_samples_total{backend="sim"} 2.0' in response.text
    assert "publishing the captured ticks failed" in caplog.text
    failing[0] = False
    assert 'smlens_backend_samples_total{backend="sim"} 3.0' in client.get("/metrics").text
