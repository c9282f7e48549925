"""The background sampler: reads every GPU from every backend once per tick, on its own thread, and
publishes an immutable :class:`~smlens.model.Snapshot` per tick.

A tick has two halves, both on the sampler's thread. ``capture`` makes the tick's calls and keeps what
they return; ``publish`` turns them into readings, folds them and hands the snapshot to the listeners
(which render it for /metrics and record it for the status page), so that whatever a request reads was
finished before it came and is never more than one interval old.

One GPU or one backend failing never stops the others: failures are counted per backend and reason,
the GPU's values from that backend are left out, and counters keep their totals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from smlens.attribution.refresher import AttributionRefresher
from smlens.errors import BackendError, GpuLostError
from smlens.model import EMPTY, EMPTY_ATTRIBUTION, Attribution, GpuIdentity, GpuState, Reading, Snapshot
from smlens.pipeline import profiling_policy
from smlens.pipeline.accounting import Accountant
from smlens.pipeline.backend_health import BackendHealth
from smlens.pipeline.fold import GpuTotals, fold
from smlens.pipeline.profiling_policy import ProfilingChoice
from smlens.sources.base import Backend, Captured, DeviceSource, finish

log = logging.getLogger(__name__)

Listener = Callable[[Snapshot], None]


@dataclass
class _Source:
    backend: Backend
    health: BackendHealth


_Entry = tuple[_Source, float, Captured | Exception]  # a backend, its capture's seconds, what it gave


class _Capture(NamedTuple):
    """One tick's calls: per GPU, an entry per backend that served it."""

    taken_at: float
    at: float  # the sampler's clock when the calls began
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
    """Owns the backends. ``start()`` runs ``tick()`` on a thread every interval; ``tick()`` is a
    capture and its publishing.

    A tick reads every GPU from every backend that serves it (``_capture``); publishing it records each
    backend's health (:mod:`~smlens.pipeline.backend_health`) and folds the readings into state
    (:mod:`~smlens.pipeline.fold`) under the profiling-source choice made at ``open()``
    (:mod:`~smlens.pipeline.profiling_policy`)."""

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
        self._thread: threading.Thread | None = None
        self._cpu_seconds = 0.0  # CPU time of the ticks published so far, whichever thread ran them
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._attribution: AttributionRefresher | None = None
        self._accountant: Accountant | None = None
        self._ticking = threading.Lock()  # tick() from another thread waits for the sampler's tick
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

    def attach_accountant(self, accountant: Accountant) -> None:
        """Put the accountant's ledger, folded tick by tick, in every snapshot."""
        self._accountant = accountant

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
        """One tick on the calling thread: its calls, then its publishing to the listeners."""
        with self._ticking:
            cpu_started = time.thread_time()
            try:
                return self._publish(self._capture(), cpu_started)
            finally:
                self._cpu_seconds += time.thread_time() - cpu_started

    def _capture(self) -> _Capture:
        """Make one tick's calls; ``_publish`` decodes them."""
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
                except Exception as exc:  # handled in _publish, in the tick's order
                    result = exc.with_traceback(None)  # a kept traceback would keep this frame too
                captured.append((source, clock() - began, result))
                if isinstance(result, GpuLostError):
                    gpu.lost_at_capture = True
                    break
        attribution = EMPTY_ATTRIBUTION if self._attribution is None else self._attribution.current()
        return _Capture(self._wall(), started, clock() - started, gpus, attribution)

    def _publish(self, captured: _Capture, cpu_started: float) -> Snapshot:
        """Decode and fold one tick, then hand its snapshot to the listeners; ``time.thread_time()`` read
        ``cpu_started`` when the tick began."""
        started = self._clock()
        for source in self._sources:
            source.health.begin_tick()
        states = [
            self._fold_gpu(gpu, entries) for gpu, entries in zip(self._gpus, captured.gpus, strict=True)
        ]
        for source in self._sources:
            source.health.end_tick()
        self._sequence += 1
        accountant = self._accountant
        ledger = EMPTY if accountant is None else accountant.tick(states, captured.attribution, captured.at)
        snapshot = Snapshot(
            hostname=self._hostname,
            sequence=self._sequence,
            taken_at=captured.taken_at,
            interval_seconds=self._interval,
            tick_duration_seconds=captured.seconds + self._clock() - started,
            sampler_cpu_seconds_total=self._cpu_seconds + time.thread_time() - cpu_started,
            gpus=tuple(states),
            attribution=captured.attribution,
            backends=tuple([source.health.stats() for source in self._sources]),
            ledger=ledger,
        )
        self.latest = snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # one listener's bug must not keep the snapshot from the others
                log.exception("a listener of the sampler failed")
        return snapshot

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
        for source in reversed(self._sources):
            try:
                source.backend.close()
            except Exception as exc:
                log.warning("closing backend %s failed: %s", source.backend.name, exc)
