"""A bare PM sampling capture for profile_load's A/B: cupti-python's ``Collector`` with a chosen metric list
and trigger mode, no host work while it samples, decoded once after it stops (as the first probe did).

It separates what `smlens profile`'s ``Session`` fixes (its eight counters and five peaks, the GPU time
trigger) from the sampling itself. Needs cupti-python 13.4 (``Collector.configure``'s ``trigger_mode``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PROBE_METRICS = (  # the first probe's four (../shared/reference/pm_sampling_probe2.py)
    "sm__cycles_active.avg",
    "sm__cycles_elapsed.avg",
    "sm__warps_active.avg",
    "sm__pipe_tensor_cycles_active.avg",
)
SYSCLK_MAX_HZ = 2.0e9  # an upper bound on the SYSCLK rate, only to size the decode image


@dataclass(frozen=True)
class QuietSpec:
    metrics: tuple[str, ...]
    interval: int  # ns, or SYSCLK cycles when ``sysclk``
    sysclk: bool = False
    buffer_mib: int = 2048

    def slots(self, seconds: float) -> int:
        """Image slots for ``seconds`` of samples (with a margin)."""
        shortest_ns = self.interval / SYSCLK_MAX_HZ * 1e9 if self.sysclk else self.interval
        return math.ceil(1.2 * seconds * 1e9 / shortest_ns) + 1000


class QuietCapture:
    """``with QuietCapture(spec) as q: q.start(); <work>; result = q.finish(seconds)``."""

    def __init__(self, spec: QuietSpec, device_index: int = 0) -> None:
        self.spec = spec
        self.device_index = device_index
        self._collector: Any = None

    def __enter__(self) -> QuietCapture:
        from cupti import pm_sampling  # type: ignore[import-not-found,import-untyped,unused-ignore]

        collector = pm_sampling.Collector(device_index=self.device_index)
        collector.enable()
        self._collector = collector
        mode = pm_sampling.TriggerMode
        collector.configure(
            metrics=list(self.spec.metrics),
            hardware_buffer_size=self.spec.buffer_mib * 2**20,
            sampling_interval=self.spec.interval,
            trigger_mode=mode.GPU_SYSCLK_INTERVAL if self.spec.sysclk else mode.GPU_TIME_INTERVAL,
        )
        return self

    def __exit__(self, *_: object) -> None:
        if self._collector is not None:
            self._collector.disable()
            self._collector = None

    def start(self) -> None:
        self._collector.start()

    def finish(self, seconds: float) -> dict[str, Any]:
        """Stop, decode everything the hardware buffer holds, and say how much of the time it covered."""
        self._collector.stop()
        slots = self.spec.slots(seconds + 1)
        try:
            data = self._collector.decode(max_samples=slots)
        except MemoryError as exc:  # the hardware buffer overflowed
            return {"error": str(exc)}
        starts = [s for s in data._start_timestamps if s]  # the first sample began before sampling (start 0)
        ends = [e for e in data._end_timestamps if e]
        completed = int(data.num_completed_samples)
        result: dict[str, Any] = {"samples": completed, "image_full": completed >= slots}
        if starts and ends:
            span = max(ends) - min(starts)
            result.update(span_ms=round(span / 1e6, 2), sample_us=round(span / 1e3 / len(starts), 3))
        return result
