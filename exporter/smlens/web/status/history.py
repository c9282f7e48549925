"""The last 15 minutes of every GPU, kept in memory for the status page's timelines.

The sampler calls :meth:`History.record` once per tick (a listener). It copies four ratios and the
verdict of each GPU into preallocated flat arrays, so its memory is fixed when the first snapshot
arrives: ``capacity * (16 + gpus * 17)`` bytes, ``capacity`` = 15 minutes / interval + 1. Per GPU that
is 17 bytes a tick (four float32 ratios and a one-byte verdict), 1020 bytes a minute at the default
1 s interval (tests/test_status_page.py holds the ring to this). Reading (:meth:`History.window`) copies
the requested points under a lock that the listener holds only to store one tick.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from array import array
from typing import Any

from smlens import names as n
from smlens.model import GpuState, Snapshot
from smlens.verdicts.judge import latest
from smlens.verdicts.thresholds import Thresholds

WINDOW_SECONDS = 15 * 60
# The timeline's lines: utilization and SM active bold, occupancy and tensor lighter.
SERIES = (n.UTILIZATION, n.SM_ACTIVE, n.SM_OCCUPANCY, n.TENSOR_ACTIVE)
_INDEX = {code: i for i, code in enumerate(n.VERDICT_CODES)}
# GPU-ticks one /api/v1/history answer carries at most (the oldest first; ``more`` says the rest waits):
# 16 GPUs' full window at 1 s, so that no answer holds a request for long.
MAX_VALUES_PER_ANSWER = 16 * 900


@dataclasses.dataclass(frozen=True)
class Window:
    """Points of the ring after a given sequence, oldest first, and the latest snapshot."""

    snapshot: Snapshot
    reset: bool  # the points do not continue the caller's: it must drop what it holds
    more: bool  # newer points wait for the next call (after the last of these sequences)
    sequences: list[int]
    times: list[float]
    series: list[dict[str, list[float | None]]]  # per GPU, per SERIES key
    verdicts: list[list[str]]  # per GPU
    verdict_since: list[float]  # per GPU: when its latest verdict began, within the ring


def owners(snapshot: Snapshot, gpu: GpuState) -> list[dict[str, str]]:
    """Who holds the GPU (namespace/pod/container or Slurm job), from the snapshot's attribution."""
    return [
        {k: v for k, v in dataclasses.asdict(w).items() if v}
        for w in snapshot.attribution.owners(gpu.identity.uuid)
    ]


class History:
    """Fixed-size ring of compact per-tick records, filled by the sampler, read by the status page."""

    def __init__(self, thresholds: Thresholds, window_seconds: float = WINDOW_SECONDS) -> None:
        self._thresholds = thresholds
        self._window_seconds = window_seconds
        self._lock = threading.Lock()
        self._capacity = 0
        self._gpus = 0
        self._interval = 0.0
        self._count = 0  # ticks recorded; the newest is at (count - 1) % capacity
        self._sequences = array("q")
        self._times = array("d")
        self._values = array("f")  # [slot][gpu][series]
        self._codes = array("B")  # [slot][gpu]
        self.latest: Snapshot | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def window_seconds(self) -> float:
        return self._window_seconds

    def _allocate(self, snapshot: Snapshot) -> None:
        self._capacity = math.ceil(self._window_seconds / snapshot.interval_seconds) + 1
        self._gpus = len(snapshot.gpus)
        self._interval = snapshot.interval_seconds
        self._count = 0
        self._sequences = array("q", bytes(8 * self._capacity))
        self._times = array("d", bytes(8 * self._capacity))
        self._values = array("f", [math.nan]) * (self._capacity * self._gpus * len(SERIES))
        self._codes = array("B", bytes(self._capacity * self._gpus))

    def record(self, snapshot: Snapshot) -> None:
        """The sampler's listener: store one tick."""
        verdicts = [latest(self._thresholds, gpu) for gpu in snapshot.gpus]
        with self._lock:
            if (len(snapshot.gpus), snapshot.interval_seconds) != (self._gpus, self._interval):
                self._allocate(snapshot)
            slot = self._count % self._capacity
            self._sequences[slot] = snapshot.sequence
            self._times[slot] = snapshot.taken_at
            base = slot * self._gpus
            for i, (gpu, verdict) in enumerate(zip(snapshot.gpus, verdicts, strict=True)):
                offset = (base + i) * len(SERIES)
                for j, key in enumerate(SERIES):
                    self._values[offset + j] = gpu.gauges.get(key, math.nan)
                self._codes[base + i] = _INDEX[n.VERDICT_DOWN if verdict is None else verdict.code]
            self._count += 1
            self.latest = snapshot

    def _chronological(self, values: array[Any], width: int) -> array[Any]:
        """A copy of one ring array, oldest tick first (``width`` entries per tick)."""
        if self._count <= self._capacity:
            return values[: self._count * width]
        head = (self._count % self._capacity) * width
        return values[head:] + values[:head]

    def window(self, after: int | None = None, max_values: int | None = None) -> Window | None:
        """The points after sequence ``after`` (all of them when None), at most ``max_values`` GPU-ticks
        of them, oldest first; None before the first tick.

        Only the copies of the ring's arrays happen under the lock (C-level slices); the listener
        never waits for the conversion to lists."""
        with self._lock:
            snapshot, gpus = self.latest, self._gpus
            if snapshot is None:
                return None
            sequences = self._chronological(self._sequences, 1)
            times = self._chronological(self._times, 1)
            values = self._chronological(self._values, gpus * len(SERIES))
            codes = self._chronological(self._codes, gpus)
        first, last = sequences[0], sequences[-1]
        # Points the caller lacks; all of them when its points are gone or come from an earlier run.
        reset = after is None or not first - 1 <= after <= last
        skip = 0 if reset or after is None else after - first + 1
        end = len(sequences) if max_values is None else min(len(sequences), skip + max(1, max_values // gpus))
        stride = gpus * len(SERIES)
        series: list[dict[str, list[float | None]]] = []
        verdicts: list[list[str]] = []
        since: list[float] = []
        for gpu in range(gpus):
            series.append(
                {
                    key: [
                        None if v != v else round(v, 4)
                        for v in values[(skip * gpus + gpu) * len(SERIES) + j : end * stride : stride]
                    ]
                    for j, key in enumerate(SERIES)
                }
            )
            column = codes[gpu::gpus].tolist()
            verdicts.append([n.VERDICT_CODES[c] for c in column[skip:end]])
            since.append(times[_run_start(column)])
        return Window(
            snapshot=snapshot,
            reset=reset,
            more=end < len(sequences),
            sequences=sequences[skip:end].tolist(),
            times=times[skip:end].tolist(),
            series=series,
            verdicts=verdicts,
            verdict_since=since,
        )


def _run_start(column: list[int]) -> int:
    """Index of the first of the equal values that end ``column``."""
    start = len(column) - 1
    while start > 0 and column[start - 1] == column[-1]:
        start -= 1
    return start
