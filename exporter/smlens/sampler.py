"""The background sampler: reads every GPU from every backend once per tick, off the request path,
and publishes an immutable :class:`~smlens.model.Snapshot`.

One GPU or one backend failing never stops the others: failures are counted per backend and reason,
the GPU's values from that backend are left out, and counters keep their totals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from smlens.attribution.model import EMPTY_ATTRIBUTION
from smlens.attribution.refresher import AttributionRefresher
from smlens.backends.base import Backend, DeviceSource
from smlens.errors import BackendError, GpuLostError
from smlens.model import ZERO_ACTIVITY, Activity, BackendStats, GpuIdentity, GpuState, Reading, Snapshot
from smlens.names import ACTIVITIES, SM_ACTIVE

log = logging.getLogger(__name__)

Listener = Callable[[Snapshot], None]


@dataclass
class _BackendBook:
    backend: Backend
    served: set[str] = field(default_factory=set)
    up: bool = True
    last_duration: float = 0.0
    duration_total: float = 0.0
    samples: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class _GpuBook:
    identity: GpuIdentity
    profiling_source: str | None = None
    profiling_reason: str = ""
    activity: dict[str, Activity] = field(default_factory=dict)
    ratios: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (source, last ratio)
    increments: dict[str, float] = field(default_factory=dict)
    xids: Counter[int] = field(default_factory=Counter)
    lost: bool = False


class Sampler:
    """Owns the backends. ``tick()`` is the unit of work; ``start()`` runs it on a thread."""

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
        self._books = [_BackendBook(b) for b in (device, *extras)]
        self._hostname = hostname
        self._interval = interval
        self._clock = clock
        self._wall = wall
        self._gpus: list[_GpuBook] = []
        self._sequence = 0
        self._cpu_total = 0.0
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._attribution: AttributionRefresher | None = None
        self.latest: Snapshot | None = None

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def gpus(self) -> tuple[GpuIdentity, ...]:
        return tuple(gpu.identity for gpu in self._gpus)

    @property
    def backends(self) -> tuple[Backend, ...]:
        return tuple(book.backend for book in self._books)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def attach_attribution(self, refresher: AttributionRefresher) -> None:
        """Put the refresher's latest attribution in every snapshot; it starts and closes with the sampler."""
        self._attribution = refresher

    def open(self, gpus: Sequence[GpuIdentity] | None = None) -> list[GpuIdentity]:
        """Attach every backend to ``gpus`` (discovered by the device source when not given)."""
        gpus = list(self._device.discover() if gpus is None else gpus)
        self._gpus = [_GpuBook(g) for g in gpus]
        for book in self._books:
            # A later profiling backend only gets the GPUs that no earlier one serves (DCGM after GPM).
            wanted = [
                g.identity
                for g in self._gpus
                if not book.backend.provides_profiling or g.profiling_source is None
            ]
            verdicts = book.backend.attach(wanted) if wanted else {}
            book.served = {uuid for uuid, reason in verdicts.items() if reason is None}
            if not book.backend.provides_profiling:
                continue
            for gpu in self._gpus:
                reason = verdicts.get(gpu.identity.uuid, "not attached")
                if gpu.profiling_source is not None:
                    continue
                if reason is None:
                    gpu.profiling_source, gpu.profiling_reason = book.backend.name, ""
                else:
                    gpu.profiling_reason = f"{book.backend.name}: {reason}"
        for gpu in self._gpus:
            log.info(
                "GPU %d (%s): profiling from %s%s",
                gpu.identity.index,
                gpu.identity.uuid,
                gpu.profiling_source or "nowhere",
                f" ({gpu.profiling_reason})" if gpu.profiling_reason else "",
            )
        return gpus

    def tick(self) -> Snapshot:
        started, cpu_started = self._clock(), time.thread_time()
        for book in self._books:
            book.last_duration = 0.0
        states = [self._sample_gpu(gpu) for gpu in self._gpus]
        for book in self._books:
            book.samples += 1
            book.duration_total += book.last_duration
        self._sequence += 1
        self._cpu_total += time.thread_time() - cpu_started
        snapshot = Snapshot(
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=self._wall(),
            interval_seconds=self._interval,
            tick_duration_seconds=self._clock() - started,
            sampler_cpu_seconds_total=self._cpu_total,
            gpus=tuple(states),
            attribution=EMPTY_ATTRIBUTION if self._attribution is None else self._attribution.current(),
            backends=tuple(
                BackendStats(
                    name=b.backend.name,
                    up=b.up,
                    last_duration_seconds=b.last_duration,
                    duration_seconds_total=b.duration_total,
                    samples_total=b.samples,
                    errors_total=MappingProxyType(dict(b.errors)),
                )
                for b in self._books
            ),
        )
        self.latest = snapshot
        for listener in self._listeners:
            listener(snapshot)
        return snapshot

    def _read(self, book: _BackendBook, gpu: GpuIdentity, now: float) -> Reading:
        started = self._clock()
        try:
            return book.backend.read(gpu, now)
        finally:
            book.last_duration += self._clock() - started

    def _sample_gpu(self, gpu: _GpuBook) -> GpuState:
        now = self._clock()
        readings: list[Reading] = []
        missing: dict[str, str] = {}
        up = not gpu.lost
        for book in self._books:
            if gpu.identity.uuid not in book.served or gpu.lost:
                continue
            try:
                readings.append(self._read(book, gpu.identity, now))
                book.up = True
            except GpuLostError as exc:
                book.errors[exc.reason] += 1
                gpu.lost, up = True, False
                log.error("GPU %d (%s) is lost: %s", gpu.identity.index, gpu.identity.uuid, exc)
            except BackendError as exc:
                book.errors[exc.reason] += 1
                self._mark_down(book, exc)
                missing[book.backend.name] = exc.reason
                if book.backend is self._device:
                    up = False
            except Exception as exc:  # a backend bug must not stop the sampler
                book.errors["unexpected"] += 1
                self._mark_down(book, exc)
                missing[book.backend.name] = "unexpected"
                if book.backend is self._device:
                    up = False
        return self._fold(gpu, readings, missing, up)

    def _mark_down(self, book: _BackendBook, exc: Exception) -> None:
        if book.up:
            log.warning("backend %s failed: %s", book.backend.name, exc)
        book.up = False

    def _fold(self, gpu: _GpuBook, readings: list[Reading], missing: dict[str, str], up: bool) -> GpuState:
        gauges: dict[str, float] = {}
        totals: dict[str, float] = {}
        clock_events: dict[str, bool] = {}
        profiled_ok = False
        fresh_ratios: dict[str, tuple[str, float]] = {}
        for reading in readings:
            gauges.update(reading.gauges)
            totals.update(reading.totals)
            clock_events.update(reading.clock_events)
            missing.update(reading.missing)
            for xid, count in reading.xid_events.items():
                gpu.xids[xid] += count
            for key, amount in reading.increments.items():
                gpu.increments[key] = gpu.increments.get(key, 0.0) + amount
            if reading.profiling and reading.source == gpu.profiling_source:
                profiled_ok = True
            for key, activity in reading.activity.items():
                if reading.profiling and reading.source != gpu.profiling_source:
                    continue  # one profiling source per GPU, never a mix
                gpu.activity[key] = gpu.activity.get(key, ZERO_ACTIVITY) + activity
                ratio = activity.ratio
                if ratio is not None:
                    fresh_ratios[key] = (reading.source, ratio)
            # A key read without new coverage keeps its last value from the same source.
            for key, (source, ratio) in gpu.ratios.items():
                if source == reading.source and key not in fresh_ratios and key not in reading.missing:
                    fresh_ratios.setdefault(key, (source, ratio))
        gpu.ratios = fresh_ratios
        for key, (_, ratio) in fresh_ratios.items():
            gauges[key] = ratio
        for key, amount in gpu.increments.items():
            totals[key] = amount
        return GpuState(
            identity=gpu.identity,
            up=up,
            gauges=MappingProxyType(gauges),
            activity_totals=MappingProxyType({k: gpu.activity[k] for k in ACTIVITIES if k in gpu.activity}),
            totals=MappingProxyType(totals),
            clock_events=MappingProxyType(clock_events),
            xid_totals=MappingProxyType(dict(gpu.xids)),
            missing=MappingProxyType(missing),
            profiling_source=gpu.profiling_source,
            profiling_available=profiled_ok,
            profiling_reason=gpu.profiling_reason
            or ("" if profiled_ok else missing.get(gpu.profiling_source or "", missing.get(SM_ACTIVE, ""))),
            sources=tuple(r.source for r in readings),
        )

    def start(self) -> None:
        """Run ``tick()`` every interval on a daemon thread (``open()`` must have succeeded)."""
        self._thread = threading.Thread(target=self._run, name="smlens-sampler", daemon=True)
        self._thread.start()
        if self._attribution is not None:
            self._attribution.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        deadline = self._clock()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep sampling; the stale-snapshot alert tells the user
                log.exception("sampling tick failed")
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
        for book in reversed(self._books):
            try:
                book.backend.close()
            except Exception as exc:
                log.warning("closing backend %s failed: %s", book.backend.name, exc)
