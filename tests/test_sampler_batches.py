"""The sampler captures every tick and publishes captured ticks in batches (smlens.pipeline.sampler): through the
real nvml and gpm backends on the fake pynvml, batched publishing must give the snapshots that publishing
every tick gives, failures and a GPU lost mid-batch included, and a reader must see every captured tick."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable

import pynvml
import pytest
from starlette.testclient import TestClient

from fakes.fake_pynvml import FakeGpu, FakeNode, install
from smlens import names as n
from smlens.pipeline import sampler as sampler_module
from smlens.verdicts import thresholds
from smlens.web.app import Publisher, create_app
from smlens.sources.nvml.backend import open_nvml_backends
from smlens.sources.sim import Scenario, SimBackend
from smlens.errors import SmlensError
from smlens.model import Snapshot
from smlens.pipeline.sampler import PUBLISH_EVERY_TICKS, Sampler
from smlens.web.status.history import History

SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
GPUS = ("GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
STEPS = 14


def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    return install(
        monkeypatch,
        *(FakeGpu(uuid, gpm_rates={SM: 40.0 + 10 * i, OCCUPANCY: 20.0}) for i, uuid in enumerate(GPUS)),
    )


def script(fake: FakeNode, step: int) -> None:
    """What happens on the node before a step's tick: XIDs, failing reads, a NaN, a GPU lost where only the
    decoding sees it (one GPM metric answers GPU_IS_LOST)."""
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
    if step == 5:
        first.gpm_rates[DRAM] = math.nan
    if step == 9:  # first of a batch of three: ticks 10 and 11 are captured before the loss is decoded
        second.gpm_metric_errors[SM] = pynvml.NVML_ERROR_GPU_IS_LOST


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
    return snapshot._replace(
        tick_duration_seconds=0.0,
        sampler_cpu_seconds_total=0.0,
        backends=tuple(
            b._replace(last_duration_seconds=0.0, duration_seconds_total=0.0) for b in snapshot.backends
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
    assert last.gpus[0].missing[n.DRAM_ACTIVE] == "not_a_number"
    assert dict(last.backends[1].errors_total) == {"gpu_lost": 1}  # the gpm backend's decoding saw it
    assert [s.gpus[1].up for s in every_tick[8:11]] == [True, False, False]


def test_a_gpu_lost_at_capture_gets_no_more_calls_before_its_loss_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = node(monkeypatch)
    nvml, gpm = open_nvml_backends()
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0)
    sampler.open()
    try:
        sampler.tick()
        lost = fake.gpu(GPUS[1])
        lost.lost = True
        before = sum(lost.calls.values())
        sampler.capture()
        assert sum(lost.calls.values()) == before + 1  # its first call answered GPU_IS_LOST
        sampler.capture()
        sampler.capture()
        assert sum(lost.calls.values()) == before + 1
        snapshot = sampler.publish()
        assert snapshot is not None and snapshot.sequence == 4
        assert [g.up for g in snapshot.gpus] == [True, False]
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


def served(clock: list[float] | None = None) -> tuple[Sampler, TestClient, list[int]]:
    """A sampler on the sim node, not started, behind serve's app; and the sequences the listeners got."""
    wall = (lambda: clock[0]) if clock is not None else time.time
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=1.0, wall=wall)
    sampler.open()
    limits = thresholds.load()
    publisher, history, seen = Publisher(), History(limits), []
    for listener in (publisher.publish, history.record, lambda s: seen.append(s.sequence)):
        sampler.subscribe(listener)
    return sampler, TestClient(create_app(publisher, limits, lambda: True, history, sampler)), seen


def test_metrics_include_every_tick_captured_before_the_scrape() -> None:
    sampler, client, seen = served()
    assert client.get("/metrics").status_code == 503  # nothing captured yet
    for _ in range(3):
        sampler.capture()
    body = client.get("/metrics").text
    assert 'smlens_backend_samples_total{backend="sim"} 3.0' in body, body
    assert seen == [1, 2, 3]
    sampler.capture()
    assert client.get("/api/v1/gpus").json()["sequence"] == 4
    sampler.capture()
    assert client.get("/api/v1/history").json()["sequence"] == 5


def test_the_probes_publish_nothing_and_follow_the_captures() -> None:
    clock = [1000.0]
    sampler, client, seen = served(clock)
    sampler.capture()
    assert client.get("/-/ready").text == "no complete sample yet\n"
    sampler.capture()
    assert client.get("/-/ready").status_code == 200
    assert client.get("/-/healthy").status_code == 200
    assert seen == []  # the ticks wait for a scrape, to be decoded together
    clock[0] += 6.0  # no capture for 6 s: sampling stalled (limit max(3 intervals, 5 s))
    answer = client.get("/-/ready")
    assert answer.status_code == 503 and "sampling stalled" in answer.text
    sampler.capture()
    assert client.get("/-/ready").status_code == 200


def test_the_probes_answer_while_a_batch_is_being_published() -> None:
    sampler, client, _ = served()
    sampler.capture()
    sampler.capture()
    answers: list[int] = []

    def probe() -> None:
        answers.extend(client.get(path).status_code for path in ("/-/ready", "/-/healthy"))

    with sampler._publishing:  # the sampler's thread in the middle of a batch
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        prober.join(5)
    assert answers == [200, 200], "a probe waited for the publishing"


def test_a_failing_listener_costs_no_other_listener_a_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    sampler, client, seen = served()

    def flaky(snapshot: Snapshot) -> None:
        if snapshot.sequence == 2:
            raise RuntimeError("a listener bug")

    sampler.subscribe(flaky)
    for _ in range(3):
        sampler.capture()
    response = client.get("/metrics")
    assert response.status_code == 200
    assert 'smlens_backend_samples_total{backend="sim"} 3.0' in response.text
    assert seen == [1, 2, 3]
    assert "a listener of the sampler failed" in caplog.text


def test_failing_reads_leave_no_garbage_cycles_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept NVML errors must not keep their tracebacks: each would hold its frame and the tick's results
    (review-9 counted 45 cyclic objects per tick and GPU with one unsupported read)."""
    fake = install(monkeypatch, FakeGpu(GPUS[0], ecc_corrected=None, gpm_rates={SM: 50.0}))
    fake.gpu(GPUS[0]).errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    now = [0.0]
    nvml, gpm = open_nvml_backends()
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0, clock=lambda: now[0])
    sampler.open()
    try:
        sampler.tick()
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):
                fake.advance(1.0)
                now[0] += 1.0
                sampler.capture()
            snapshot = sampler.publish()
            cycles = gc.collect()
        finally:
            gc.enable()
    finally:
        sampler.close()
    assert snapshot is not None and snapshot.gpus[0].missing[n.ECC_CORRECTED] == "not_supported"
    assert cycles < 50, f"{cycles} objects in garbage cycles after 50 ticks"


def test_a_tick_that_cannot_be_published_fails_tick_and_spares_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sampler, _, seen = served()
    real_fold = sampler_module.fold
    monkeypatch.setattr(sampler_module, "fold", lambda *args: 1 / 0)
    with pytest.raises(SmlensError, match="could not be published"):
        sampler.tick()
    assert "publishing a sampling tick failed" in caplog.text
    monkeypatch.setattr(sampler_module, "fold", real_fold)
    assert sampler.tick().sequence == 1  # the failed tick was dropped, not retried forever
    assert seen == [1]


def test_the_served_snapshot_is_the_latest_capture_so_the_stalled_alert_stays_quiet() -> None:
    """SmlensSamplingStalled reads smlens_snapshot_age_seconds: with ticks waiting to be published, the
    scrape must still report the age of the latest capture, not of the last batch."""
    sampler, client, _ = served()
    sampler.capture()
    sampler.capture()
    assert client.get("/metrics").status_code == 200
    time.sleep(0.3)
    sampler.capture()
    body = client.get("/metrics").text
    (stamp,) = (
        float(line.split()[-1])
        for line in body.splitlines()
        if line.startswith("smlens_snapshot_timestamp_seconds ")
    )
    (age,) = (
        float(line.split()[-1])
        for line in body.splitlines()
        if line.startswith("smlens_snapshot_age_seconds ")
    )
    assert sampler.latest is not None and stamp == sampler.latest.taken_at
    assert age < 0.25, f"the served snapshot is {age:.2f} s old: an earlier batch's"


def test_a_scrape_that_publishes_makes_no_nvml_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data answers decode captured ticks; every NVML and GPM call stays on the sampler's side."""
    fake = node(monkeypatch)
    made: list[str] = []
    for name in dir(fake.module):
        function = getattr(fake.module, name)
        if name.startswith("nvml") and callable(function) and not isinstance(function, type):

            def counted(
                *args: object, _function: Callable[..., object] = function, _name: str = name
            ) -> object:
                made.append(_name)
                return _function(*args)

            monkeypatch.setattr(fake.module, name, counted)
    now = [100.0]
    nvml, gpm = open_nvml_backends()
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0, clock=lambda: now[0], wall=time.time)
    sampler.open()
    limits = thresholds.load()
    publisher, history = Publisher(), History(limits)
    sampler.subscribe(publisher.publish)
    sampler.subscribe(history.record)
    client = TestClient(create_app(publisher, limits, lambda: True, history, sampler))
    try:
        for _ in range(3):
            fake.advance(1.0)
            now[0] += 1.0
            sampler.capture()
        calls_made = len(made)
        assert calls_made > 0
        body = client.get("/metrics").text
        assert 'smlens_backend_samples_total{backend="gpm"} 3.0' in body, body
        assert "gpu_sm_active_ratio{" in body
        assert client.get("/api/v1/gpus").status_code == 200
        assert client.get("/api/v1/history").status_code == 200
        assert made[calls_made:] == []
    finally:
        sampler.close()
