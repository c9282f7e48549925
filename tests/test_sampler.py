from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from smlens import model as m
from smlens import names as n
from smlens.errors import BackendError, GpuLostError
from smlens.exposition.rendered import Rendered
from smlens.model import Activity, GpuIdentity, Reading, Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.sources.base import Backend, Captured, DeviceSource, finish
from smlens.sources.sim import Scenario, SimBackend


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Devices(DeviceSource):
    """Two GPUs; utilization 0.5 over each interval; GPU 1 can be lost or fail."""

    name = "dev"

    def __init__(self) -> None:
        self.lost: set[int] = set()
        self.failing: set[int] = set()
        self.last: dict[int, float] = {}

    def discover(self) -> list[GpuIdentity]:
        return [GpuIdentity(i, f"GPU-{i}", "Fake") for i in range(2)]

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        return {g.uuid: None for g in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        if gpu.index in self.lost:
            raise GpuLostError("fell off the bus")
        if gpu.index in self.failing:
            raise BackendError("driver said no", reason="unknown_error")
        dt = now - self.last.get(gpu.index, now)
        self.last[gpu.index] = now
        return Reading(
            source=self.name,
            gauges={n.POWER_WATTS: 100.0 + gpu.index},
            activity={n.UTILIZATION: Activity.of(0.5, dt)} if dt else {},
            missing={n.MEMORY_TEMPERATURE_CELSIUS: "not_supported"},
        )


class Profiler(Backend):
    """Serves only GPU 0 with SM active 0.25; can be made to fail or to crash."""

    name = "prof"
    provides_profiling = True

    def __init__(self, sm_active: float = 0.25) -> None:
        self.sm_active = sm_active
        self.fail = False
        self.crash = False
        self.last: float | None = None

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        return {g.uuid: None if g.index == 0 else "not supported on this GPU" for g in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        if self.crash:
            raise ZeroDivisionError("a bug")
        if self.fail:
            raise BackendError("lost contact", reason="unreachable")
        dt = 0.0 if self.last is None else now - self.last
        self.last = now
        activity = {n.SM_ACTIVE: Activity.of(self.sm_active, dt)} if dt else {}
        return Reading(source=self.name, activity=activity, profiling=True)


def make(prof: Profiler | None = None) -> tuple[Sampler, Devices, Clock]:
    clock = Clock()
    devices = Devices()
    sampler = Sampler(
        devices,
        [prof] if prof else [],
        hostname="node-a",
        interval=1.0,
        clock=clock,
        wall=lambda: 1_700_000_000.0 + clock.now,
    )
    sampler.open()
    return sampler, devices, clock


def advance(sampler: Sampler, clock: Clock, seconds: float) -> m.Snapshot:
    clock.now += seconds
    return sampler.tick()


def test_integrals_are_exact_over_uneven_ticks() -> None:
    sampler, _, clock = make(Profiler())
    sampler.tick()
    for step in (0.3, 1.7, 2.0, 0.5):
        snap = advance(sampler, clock, step)
    gpu0 = snap.gpus[0]
    assert gpu0.activity_totals[n.UTILIZATION] == Activity(pytest.approx(0.5 * 4.5), pytest.approx(4.5))
    assert gpu0.activity_totals[n.SM_ACTIVE].active_seconds == pytest.approx(0.25 * 4.5)
    assert gpu0.gauges[n.SM_ACTIVE] == pytest.approx(0.25)
    assert snap.sequence == 5 and snap.hostname == "node-a"


def test_profiling_source_is_named_per_gpu_and_absent_metrics_stay_absent() -> None:
    sampler, _, clock = make(Profiler())
    sampler.tick()
    snap = advance(sampler, clock, 1.0)
    gpu0, gpu1 = snap.gpus
    assert (gpu0.profiling_source, gpu0.profiling_available) == ("prof", True)
    assert (gpu1.profiling_source, gpu1.profiling_available) == (None, False)
    assert gpu1.profiling_reason == "prof: not supported on this GPU"
    assert n.SM_ACTIVE not in gpu1.gauges and n.SM_ACTIVE not in gpu1.activity_totals
    assert gpu1.missing[n.MEMORY_TEMPERATURE_CELSIUS] == "not_supported"


def test_lost_gpu_goes_down_alone_and_keeps_its_counters() -> None:
    sampler, devices, clock = make(Profiler())
    sampler.tick()
    before = advance(sampler, clock, 1.0).gpus[1].activity_totals[n.UTILIZATION]
    devices.lost.add(1)
    snap = advance(sampler, clock, 1.0)
    assert [g.up for g in snap.gpus] == [True, False]
    assert snap.gpus[1].activity_totals[n.UTILIZATION] == before
    assert n.POWER_WATTS not in snap.gpus[1].gauges
    devices.lost.clear()  # a lost GPU is not read again until restart
    snap = advance(sampler, clock, 1.0)
    assert snap.gpus[1].up is False
    assert snap.gpus[0].activity_totals[n.UTILIZATION].covered_seconds == pytest.approx(3.0)
    dev = next(b for b in snap.backends if b.name == "dev")
    assert dev.errors_total == {"gpu_lost": 1}


def test_failing_profiler_is_isolated_and_marked_down_then_recovers() -> None:
    prof = Profiler()
    sampler, _, clock = make(prof)
    sampler.tick()
    advance(sampler, clock, 1.0)
    prof.fail = True
    snap = advance(sampler, clock, 1.0)
    gpu0 = snap.gpus[0]
    assert gpu0.up and gpu0.gauges[n.UTILIZATION] == pytest.approx(0.5)
    assert n.SM_ACTIVE not in gpu0.gauges  # not a stale value, not zero
    assert gpu0.profiling_available is False and gpu0.missing["prof"] == "unreachable"
    stats = {b.name: b for b in snap.backends}
    assert stats["prof"].up is False and stats["prof"].errors_total == {"unreachable": 1}
    assert stats["dev"].up is True
    prof.fail = False
    prof.crash = True
    snap = advance(sampler, clock, 1.0)
    assert {b.name: b for b in snap.backends}["prof"].errors_total == {"unreachable": 1, "unexpected": 1}
    prof.crash = False
    snap = advance(sampler, clock, 1.0)
    assert snap.gpus[0].profiling_available and {b.name: b.up for b in snap.backends}["prof"]


def test_device_failure_marks_gpu_down_but_not_lost() -> None:
    sampler, devices, clock = make()
    sampler.tick()
    devices.failing.add(0)
    assert advance(sampler, clock, 1.0).gpus[0].up is False
    devices.failing.clear()
    assert advance(sampler, clock, 1.0).gpus[0].up is True


def test_ratio_without_new_coverage_keeps_last_value_from_same_source() -> None:
    prof = Profiler()
    sampler, _, clock = make(prof)
    sampler.tick()
    advance(sampler, clock, 1.0)
    snap = advance(sampler, clock, 0.0)  # a tick with no elapsed time adds no coverage
    assert snap.gpus[0].gauges[n.SM_ACTIVE] == pytest.approx(0.25)


def test_listeners_get_every_snapshot_and_thread_runs() -> None:
    sampler = Sampler(SimBackend(Scenario.steady(2)), [], hostname="n", interval=0.1)
    sampler.open()
    seen: list[int] = []
    sampler.subscribe(lambda snap: seen.append(snap.sequence))
    sampler.start()
    try:
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sampler.alive()
    finally:
        sampler.close()
    assert seen[:3] == [1, 2, 3]
    assert not sampler.alive()


def test_a_later_profiling_backend_is_offered_only_the_gpus_no_earlier_one_serves() -> None:
    offered: list[list[str]] = []

    class Fallback(Profiler):
        name = "fallback"

        def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
            offered.append([g.uuid for g in gpus])
            return {g.uuid: None for g in gpus}

    sampler = Sampler(Devices(), [Profiler(), Fallback()], hostname="n", interval=1.0)
    sampler.open()
    assert offered == [["GPU-1"]]
    snap = sampler.tick()
    assert [g.profiling_source for g in snap.gpus] == ["prof", "fallback"]


def test_a_backend_is_charged_for_its_read_not_for_logging_its_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sampler, devices, clock = make()
    sampler.tick()
    devices.lost.add(1)
    monkeypatch.setattr(
        "smlens.pipeline.sampler.log.error", lambda *args: setattr(clock, "now", clock.now + 100.0)
    )
    snap = advance(sampler, clock, 1.0)
    (dev,) = (b for b in snap.backends if b.name == "dev")
    assert dev.last_duration_seconds < 1.0


class XidSource(Devices):
    """Reports a fresh, mostly invented XID code on every read, as a broken source could."""

    def __init__(self) -> None:
        super().__init__()
        self.next_code = 0

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        reading = super().read(gpu, now)
        self.next_code += 7
        return Reading(source=reading.source, gauges=reading.gauges, xid_events={13: 1, self.next_code: 1})


def test_xid_label_values_are_bounded_by_the_catalog() -> None:

    clock = Clock()
    sampler = Sampler(XidSource(), [], hostname="node-a", interval=1.0, clock=clock)
    sampler.open()
    for _ in range(500):  # 1,000 codes from 7 to 7,000
        snapshot = advance(sampler, clock, 1.0)
    totals = snapshot.gpus[0].xid_totals
    catalog_codes = {code for code in range(7, 3501, 14) if code <= n.XID_CATALOG_LAST}
    assert set(totals) == {str(c) for c in catalog_codes} | {"13", n.XID_OTHER}
    assert totals["13"] == 500 + (13 in catalog_codes)
    assert sum(totals.values()) == 1000
    assert [n.xid_label(code) for code in (0, 1, 172, 173)] == ["other", "1", "172", "other"]
    text = Rendered(snapshot).answer(openmetrics=False, gzip=False, live=b"").body.decode()
    lines = [line for line in text.splitlines() if line.startswith("gpu_xid") and 'uuid="GPU-0"' in line]
    assert len(lines) == len(totals) <= n.XID_CATALOG_LAST + 1
    assert lines[-1].endswith(f'xid="other"}} {float(totals["other"])}')


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Burner(DeviceSource):
    """One GPU whose capture and whose decoding each spend a known CPU time."""

    name = "burner"

    def __init__(self, capture_cpu: float, decode_cpu: float) -> None:
        self.capture_cpu, self.decode_cpu = capture_cpu, decode_cpu
        self.captures = 0

    def discover(self) -> list[GpuIdentity]:
        return [GpuIdentity(0, "GPU-0", "Fake")]

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        return {g.uuid: None for g in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        return finish(self.capture(gpu, now))

    def capture(self, gpu: GpuIdentity, now: float) -> Captured:
        burn(self.capture_cpu)
        self.captures += 1
        return self._decode

    def _decode(self) -> Reading:
        burn(self.decode_cpu)
        return Reading(source=self.name, gauges={n.POWER_WATTS: 1.0})


def running(burner: Burner) -> Sampler:
    """A sampler of the burner's GPU, its thread started, ticking every 20 ms."""
    sampler = Sampler(burner, [], hostname="n", interval=0.02)
    sampler.open()
    sampler.start()
    return sampler


def wait_for_sequence(sampler: Sampler, count: int) -> Snapshot:
    deadline = time.monotonic() + 20
    while (sampler.latest is None or sampler.latest.sequence < count) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.latest is not None and sampler.latest.sequence >= count, "the sampler did not tick"
    return sampler.latest


def test_the_sampler_thread_counts_each_ticks_capture_and_decoding_once() -> None:
    burner = Burner(capture_cpu=0.01, decode_cpu=0.005)
    sampler = running(burner)
    try:
        latest = wait_for_sequence(sampler, 6)
    finally:
        sampler.close()
    # Each tick's capture and decoding are done when its snapshot is built; the loop adds little.
    assert latest.sequence * 0.015 <= latest.sampler_cpu_seconds_total <= latest.sequence * 0.015 + 0.03


def test_tick_counts_its_capture_and_its_publishing_as_sampling_cpu_on_metrics() -> None:
    """Where users read it: the counter on /metrics, as the exposition renders each snapshot."""
    sampler = Sampler(Burner(capture_cpu=0.01, decode_cpu=0.005), [], hostname="n", interval=1.0)
    sampler.open()
    totals = []
    for _ in range(3):
        body = Rendered(sampler.tick()).answer(openmetrics=False, gzip=False, live=b"").body.decode()
        (family,) = [
            f for f in text_string_to_metric_families(body) if f.name == "smlens_sampler_cpu_seconds"
        ]
        (sample,) = [s for s in family.samples if s.name == "smlens_sampler_cpu_seconds_total"]
        totals.append(sample.value)
    assert totals[0] >= 0.015 and totals[1] >= totals[0] + 0.015 and totals[2] >= totals[1] + 0.015
    assert totals[2] <= 0.045 + 0.03


def test_a_listeners_work_counts_in_the_next_snapshot() -> None:
    """Rendering for /metrics is a listener on the sampler's thread: its CPU is sampling CPU too."""
    sampler = Sampler(Burner(capture_cpu=0.0, decode_cpu=0.0), [], hostname="n", interval=1.0)
    sampler.open()
    sampler.subscribe(lambda snapshot: burn(0.02))
    first = sampler.tick()
    second = sampler.tick()
    assert first.sampler_cpu_seconds_total < 0.01
    assert 0.02 <= second.sampler_cpu_seconds_total - first.sampler_cpu_seconds_total <= 0.03


def test_sampling_cpu_never_goes_back_when_ticks_move_to_another_thread() -> None:
    sampler = running(Burner(capture_cpu=0.01, decode_cpu=0.0))
    before = wait_for_sequence(sampler, 3)
    sampler.close()
    after = sampler.tick()  # on this thread, after the sampler's has ended
    assert after.sampler_cpu_seconds_total >= before.sampler_cpu_seconds_total + 0.01
