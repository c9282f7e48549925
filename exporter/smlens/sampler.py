"""The background sampler: reads every GPU from every backend once per tick, on its own thread, and
publishes an immutable :class:`~smlens.model.Snapshot` per tick.

A tick has two halves. ``capture`` makes the tick's calls and keeps what they return; ``publish`` turns
the ticks captured before it starts, in order, into readings, folds them and hands each snapshot to the
listeners. The sampler's thread publishes every ``PUBLISH_EVERY_TICKS`` ticks (fewer when those would
span more than ``PUBLISH_EVERY_SECONDS``), and the data answers of ``smlens serve`` publish before they
answer, so that nothing they serve is older than the last capture. Decoding several ticks in a row runs
warm: on an H200, decoding every tick cost 1.5x-1.6x the bare calls' (means), batches of 15 (the chart's
defaults) cost 1.19x-1.23x at eacda9b (docs/performance.md, "No CPU-clock read at capture").

One GPU or one backend failing never stops the others: failures are counted per backend and reason,
the GPU's values from that backend are left out, and counters keep their totals.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from smlens import profiling_policy
from smlens.attribution.refresher import AttributionRefresher
from smlens.backend_health import BackendHealth
from smlens.backends.base import Backend, Captured, DeviceSource, finish
from smlens.errors import BackendError, GpuLostError, SmlensError
from smlens.fold import GpuTotals, fold
from smlens.model import EMPTY_ATTRIBUTION, Attribution, GpuIdentity, GpuState, Reading, Snapshot
from smlens.profiling_policy import ProfilingChoice

log = logging.getLogger(__name__)

Listener = Callable[[Snapshot], None]
# The sampler's thread keeps at most this many ticks, and ticks of this many seconds, captured and undecoded.
PUBLISH_EVERY_TICKS, PUBLISH_EVERY_SECONDS = 30, 30.0


@dataclass
class _Source:
    backend: Backend
    health: BackendHealth


_Entry = tuple[_Source, float, Captured | Exception]  # a backend, its capture's seconds, what it gave


class _Capture(NamedTuple):
    """One tick's calls: per GPU, an entry per backend that served it."""

    taken_at: float
    seconds: float
    gpus: list[list[_Entry]]
    attribution: Attribution  # who held the GPUs when the tick was taken


@dataclass
class _Gpu:
    identity: GpuIdentity
    choice: ProfilingChoice
    totals: GpuTotals
    sources: tuple[_Source, ...]  # those that serve it, in the sampler's order
    lost: bool = False  # known when its loss is published
    lost_at_capture: bool = False  # a capture already raised GpuLostError: no more calls to it


class Sampler:
    """Owns the backends. ``start()`` runs ``background_tick()`` on a thread every interval; ``tick()``
    is a capture and its publishing at once.

    A tick reads every GPU from every backend that serves it (``capture``); publishing it records each
    backend's health (:mod:`smlens.backend_health`) and folds the readings into state (:mod:`smlens.fold`)
    under the profiling-source choice made at ``open()`` (:mod:`smlens.profiling_policy`)."""

    def __init__(
        self,
        device: DeviceSource,
        extras: Sequence[Backend],
        hostname: str,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._device = device
        self._sources = [_Source(b, BackendHealth(b.name)) for b in (device, *extras)]
        self._hostname = hostname
        self._interval = interval
        self._clock = clock
        self._wall = wall
        self._gpus: list[_Gpu] = []
        self._sequence = 0
        # The CPU of sampling is the sampler's thread's own CPU clock, read when publishing, plus the
        # sampling done on other threads: a capture reads no CPU clock, since the first read after the
        # thread's sleep is a slow system call (bench/wake_clock_cost.py).
        self._thread: threading.Thread | None = None
        self._cpu_clock: int | None = None  # the sampler's thread's CPU clock, while it runs
        self._thread_cpu = 0.0  # its last reading
        self._cpu_elsewhere = 0.0  # publishing on request threads, and tick()'s captures
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._attribution: AttributionRefresher | None = None
        self._pending: collections.deque[_Capture] = collections.deque()
        self._captured, self._captured_at = 0, -math.inf  # ticks captured, and the wall time of the latest
        self._publishing = threading.Lock()
        self._batch = (
            max(1, min(PUBLISH_EVERY_TICKS, int(PUBLISH_EVERY_SECONDS / interval))) if interval > 0 else 1
        )
        self.latest: Snapshot | None = None

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return tuple(gpu.identity for gpu in self._gpus)

    @property
    def backends(self) -> tuple[Backend, ...]:
        return tuple(source.backend for source in self._sources)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def attach_attribution(self, refresher: AttributionRefresher) -> None:
        """Put the refresher's latest attribution in every snapshot; it starts and closes with the sampler."""
        self._attribution = refresher

    def open(self, gpus: Sequence[GpuIdentity] | None = None) -> list[GpuIdentity]:
        """Attach every backend to ``gpus`` (discovered by the device source when not given)."""
        gpus = list(self._device.discover() if gpus is None else gpus)
        served, choices = profiling_policy.attach(self.backends, gpus)
        self._gpus = [
            _Gpu(
                g,
                choices[g.uuid],
                GpuTotals(),
                tuple(source for source, uuids in zip(self._sources, served, strict=True) if g.uuid in uuids),
            )
            for g in gpus
        ]
        return gpus

    def tick(self) -> Snapshot:
        """Capture one tick and publish it (with any captured before it)."""
        published = self._sequence
        cpu_started = time.thread_time()
        self.capture()
        with self._publishing:
            self._cpu_elsewhere += time.thread_time() - cpu_started
        snapshot = self.publish()
        if snapshot is None or snapshot.sequence == published:
            raise SmlensError("the sampling tick could not be published; the log says why.")
        return snapshot

    def background_tick(self) -> None:
        """What the sampler's thread does each interval: capture, and publish once the batch is full."""
        self.capture()
        if len(self._pending) >= self._batch:
            self.publish()

    def capture(self) -> None:
        """Make one tick's calls; ``publish`` decodes them."""
        clock = self._clock
        started = clock()
        gpus = []
        for gpu in self._gpus:
            captured: list[_Entry] = []
            gpus.append(captured)
            if gpu.lost or gpu.lost_at_capture:
                continue
            now, ident = clock(), gpu.identity
            for source in gpu.sources:
                began = clock()
                try:
                    result: Captured | Exception = source.backend.capture(ident, now)
                except Exception as exc:  # handled in publish, in the tick's order
                    result = exc.with_traceback(None)  # a kept traceback would keep this frame too
                captured.append((source, clock() - began, result))
                if isinstance(result, GpuLostError):
                    gpu.lost_at_capture = True
                    break
        self._captured, self._captured_at = self._captured + 1, self._wall()
        attribution = EMPTY_ATTRIBUTION if self._attribution is None else self._attribution.current()
        self._pending.append(_Capture(self._captured_at, clock() - started, gpus, attribution))

    def publish(self) -> Snapshot | None:
        """Decode and fold the ticks captured so far, oldest first, each snapshot going to the listeners.
        Returns the latest snapshot (None before the first tick). Safe to call from any thread."""
        with self._publishing:
            if self._pending:
                self._publish_pending()
        return self.latest

    def _publish_pending(self) -> None:
        on_thread = threading.current_thread() is self._thread
        count = len(self._pending)  # before the clock's reading: a tick captured after it waits
        if self._cpu_clock is not None:
            self._thread_cpu = time.clock_gettime(self._cpu_clock)
        before, cpu_started = self._thread_cpu + self._cpu_elsewhere, time.thread_time()
        for _ in range(count):
            try:
                self._publish_one(self._pending.popleft(), before, cpu_started)
            except Exception:  # a bug in decoding or folding costs its tick, not the ones after it
                log.exception("publishing a sampling tick failed")
        if not on_thread:  # the sampler's thread counts its own publishing in its CPU clock
            self._cpu_elsewhere += time.thread_time() - cpu_started

    def progress(self) -> tuple[int, float]:
        """Ticks captured so far, and the seconds since the latest (inf before the first)."""
        return self._captured, self._wall() - self._captured_at

    def _publish_one(self, captured: _Capture, cpu_before: float, cpu_started: float) -> None:
        """Publish one tick; the sampling CPU was ``cpu_before`` when ``time.thread_time()`` read
        ``cpu_started`` on this thread."""
        started = self._clock()
        for source in self._sources:
            source.health.begin_tick()
        states = [
            self._fold_gpu(gpu, entries) for gpu, entries in zip(self._gpus, captured.gpus, strict=True)
        ]
        for source in self._sources:
            source.health.end_tick()
        self._sequence += 1
        snapshot = Snapshot(
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=captured.taken_at,
            interval_seconds=self._interval,
            tick_duration_seconds=captured.seconds + self._clock() - started,
            sampler_cpu_seconds_total=cpu_before + time.thread_time() - cpu_started,
            gpus=tuple(states),
            attribution=captured.attribution,
            backends=tuple([source.health.stats() for source in self._sources]),
        )
        self.latest = snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # one listener's bug must not keep the snapshot from the others
                log.exception("a listener of the sampler failed")

    def _fold_gpu(self, gpu: _Gpu, entries: list[_Entry]) -> GpuState:
        readings, missing, up = self._readings(gpu, entries)
        gpu.totals, state = fold(gpu.identity, gpu.totals, readings, missing, up, gpu.choice)
        return state

    def _readings(self, gpu: _Gpu, entries: list[_Entry]) -> tuple[list[Reading], dict[str, str], bool]:
        """One tick's readings of a GPU, the backends that failed it (name -> reason), and its up."""
        ident = gpu.identity
        readings: list[Reading] = []
        missing: dict[str, str] = {}
        if gpu.lost:  # captured before its loss was decoded, or not at all
            return readings, missing, False
        up = True
        for source, seconds, result in entries:
            health, name = source.health, source.backend.name
            error: Exception | None = None
            if isinstance(result, Exception):
                error = result
            else:
                started = self._clock()
                try:
                    readings.append(finish(result))
                except Exception as exc:
                    error = exc.with_traceback(None)
                seconds += self._clock() - started  # the capture and its decoding
            health.spent(seconds)
            if isinstance(error, GpuLostError):
                health.gpu_lost(error.reason)
                gpu.lost, up = True, False
                log.error("GPU %d (%s) is lost: %s", ident.index, ident.uuid, error)
                break
            if error is not None:  # a backend bug must not stop the sampler
                reason = error.reason if isinstance(error, BackendError) else "unexpected"
                health.failed(reason, f"GPU {ident.index} ({ident.uuid}): {error}")
                missing[name] = reason
                if source.backend is self._device:
                    up = False
        return readings, missing, up

    def start(self) -> None:
        """Run ``background_tick()`` every interval on a daemon thread (``open()`` must have succeeded)."""
        self._thread = threading.Thread(target=self._run, name="smlens-sampler", daemon=True)
        self._thread.start()
        if self._attribution is not None:
            self._attribution.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        clock_of = getattr(time, "pthread_getcpuclockid", None)  # not on every Unix (macOS)
        if clock_of is not None:
            self._cpu_clock = clock_of(threading.get_ident())
        try:
            self._loop(note_cpu=clock_of is None)
        finally:  # a thread's CPU clock cannot be read once it has ended: its time joins the others'
            with self._publishing:
                self._cpu_elsewhere += time.thread_time()
                self._thread_cpu, self._cpu_clock = 0.0, None

    def _loop(self, note_cpu: bool) -> None:
        """``note_cpu``: no other thread can read this one's CPU clock, so it notes it after each tick."""
        deadline = self._clock()
        while not self._stop.is_set():
            try:
                self.background_tick()
            except Exception:  # keep sampling; the stale-snapshot alert tells the user
                log.exception("sampling tick failed")
            if note_cpu:
                self._thread_cpu = time.thread_time()
            deadline += self._interval
            delay = deadline - self._clock()
            if delay < 0:  # overran: skip the missed ticks rather than bursting
                deadline = self._clock()
                delay = 0.0
            self._stop.wait(delay)

    def close(self) -> None:
        self._stop.set()
        if self._attribution is not None:
            self._attribution.close()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self._interval))
        for source in reversed(self._sources):
            try:
                source.backend.close()
            except Exception as exc:
                log.warning("closing backend %s failed: %s", source.backend.name, exc)
