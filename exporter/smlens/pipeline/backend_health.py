"""Backend health, recomputed every tick.

A backend is up for a tick when it read every GPU it serves in that tick. A GPU that fell off the bus
is the GPU's failure, not the backend's: ``gpu_up`` reports it and the backend stays up. Health is
logged once per change of state, not once per tick.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from smlens.model import BackendStats

log = logging.getLogger(__name__)


@dataclass
class BackendHealth:
    """Up/down, errors and time spent of one backend; ``begin_tick`` and ``end_tick`` bracket a tick."""

    name: str
    up: bool = True
    errors: Counter[str] = field(default_factory=Counter)
    last_duration: float = 0.0
    duration_total: float = 0.0
    samples: int = 0
    _first_failure: str | None = field(default=None, init=False)
    # A read-only copy of ``errors``, made again only after they change: stats() runs every tick.
    _errors_view: Mapping[str, int] | None = field(default=None, init=False, repr=False, compare=False)

    def begin_tick(self) -> None:
        self._first_failure = None
        self.last_duration = 0.0

    def spent(self, seconds: float) -> None:
        self.last_duration += seconds

    def failed(self, reason: str, what: str) -> None:
        """A read failed; ``what`` (e.g. "GPU 0 (GPU-...): timeout") goes to the log if it is the first."""
        self.errors[reason] += 1
        self._errors_view = None
        if self._first_failure is None:
            self._first_failure = what

    def gpu_lost(self, reason: str) -> None:
        """A GPU fell off the bus: counted, but the backend itself is not down for it."""
        self.errors[reason] += 1
        self._errors_view = None

    def end_tick(self) -> None:
        up = self._first_failure is None
        if up != self.up:
            if up:
                log.info("backend %s is up again: it read every GPU it serves", self.name)
            else:
                log.warning("backend %s is down: %s", self.name, self._first_failure)
        self.up = up
        self.samples += 1
        self.duration_total += self.last_duration

    def stats(self) -> BackendStats:
        if self._errors_view is None:
            self._errors_view = MappingProxyType(dict(self.errors))
        return BackendStats(
            name=self.name,
            up=self.up,
            last_duration_seconds=self.last_duration,
            duration_seconds_total=self.duration_total,
            samples_total=self.samples,
            errors_total=self._errors_view,
        )
