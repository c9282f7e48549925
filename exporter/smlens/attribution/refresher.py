"""The background thread that refreshes attribution, and the one hook the sampler reads.

The sampler calls :meth:`AttributionRefresher.current` once per tick, at its capture: a reference read,
never a kubelet call or an NVML process walk. A source that fails loses its results at once (stale pod
labels mislead more than missing ones), reports ``up`` 0, and is logged once per change of state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from smlens.errors import BackendError
from smlens.model import EMPTY_ATTRIBUTION, Allocation, Attribution, SourceState, WorkloadUsage

log = logging.getLogger(__name__)
T = TypeVar("T")

# Names of attribution sources, used as the ``source`` label of smlens_attribution_up.
PODRESOURCES = "podresources"
PROCESSES = "processes"
SIM = "sim"

DEFAULT_INTERVAL = 10.0
DEFAULT_TIMEOUT = 5.0


class AllocationSource(Protocol):
    name: str

    def allocations(self) -> tuple[Allocation, ...]:
        """Every GPU device held by a container; raises BackendError when the source fails."""


class UsageSource(Protocol):
    name: str

    def usage(self) -> tuple[WorkloadUsage, ...]:
        """Per GPU and workload usage; raises BackendError when the source fails."""

    def close(self) -> None:
        """Release what the source holds."""


class AttributionRefresher:
    """Refreshes every ``interval`` seconds on a daemon thread; :meth:`current` is always cheap."""

    def __init__(
        self,
        allocation_source: AllocationSource | None,
        usage_source: UsageSource | None = None,
        interval: float = DEFAULT_INTERVAL,
        owner_labels: bool = True,
        on_close: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._allocation_source = allocation_source
        self._usage_source = usage_source
        self._interval = interval
        self._owner_labels = owner_labels
        self._on_close = on_close
        self._clock = clock
        self._wall = wall
        self._current = EMPTY_ATTRIBUTION
        self._states: dict[str, SourceState] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Attribution:
        return self._current

    def _run_source(self, name: str, work: Callable[[], tuple[T, ...]]) -> tuple[T, ...]:
        started = self._clock()
        result: tuple[T, ...] = ()
        try:
            result, state = work(), SourceState(name, True)
        except BackendError as exc:
            state = SourceState(name, False, exc.reason, str(exc))
        except Exception as exc:  # a bug or an unforeseen library error must not end the thread
            state = SourceState(name, False, "unexpected", f"{exc.__class__.__name__}: {exc}")
        state = SourceState(state.name, state.up, state.reason, state.message, self._clock() - started)
        self._log_change(state, len(result))
        self._states[name] = state
        return result

    def _log_change(self, state: SourceState, count: int) -> None:
        previous = self._states.get(state.name)
        if previous is not None and (previous.up, previous.reason) == (state.up, state.reason):
            return
        if state.up:
            log.info("attribution source %s is up (%d entries)", state.name, count)
        else:
            log.warning(
                "attribution source %s is down (%s): %s Its labels are dropped until it answers again.",
                state.name,
                state.reason,
                state.message,
            )

    def refresh(self) -> Attribution:
        """Refresh every source once, publish and return the result."""
        allocations: tuple[Allocation, ...] = ()
        workloads: tuple[WorkloadUsage, ...] = ()
        names = []
        if self._allocation_source is not None:
            source = self._allocation_source
            allocations = self._run_source(source.name, source.allocations)
            names.append(source.name)
        if self._usage_source is not None:
            usage = self._usage_source
            workloads = self._run_source(usage.name, usage.usage)
            names.append(usage.name)
        self._current = Attribution(
            allocations,
            workloads,
            tuple(self._states[n] for n in names),
            refreshed_at=self._wall(),
            owner_labels=self._owner_labels,
        )
        return self._current

    def start(self) -> None:
        """Refresh now and then every interval, on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="smlens-attribution", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval)
        if self._usage_source is not None:
            self._usage_source.close()
        if self._on_close is not None:
            self._on_close()
