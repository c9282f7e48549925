"""The standard ``process_*`` families of this process, read from /proc at each scrape.

Names, HELP texts, types and computations are those of prometheus_client 0.2x's ``ProcessCollector`` (the
names every Prometheus client library exports, which dashboards and alerts expect). Where /proc is absent
(not Linux) there are none, as with prometheus_client.
"""

from __future__ import annotations

import os
from pathlib import Path

from smlens.metricfamily import CounterMetricFamily, GaugeMetricFamily, Metric


def _boot_time(proc: Path) -> float | None:
    """Unix time the host booted (``btime`` of /proc/stat); None without /proc."""
    try:
        with open(proc / "stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class ProcessCollector:
    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._own = proc / "self"
        self._boot = _boot_time(proc)
        try:
            self._ticks = float(os.sysconf("SC_CLK_TCK"))
            self._page = os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):  # no sysconf (not POSIX), or no such name
            self._boot = None

    def collect(self) -> list[Metric]:
        if not self._boot:
            return []
        return [*self._stat(self._boot), *self._descriptors()]

    def _stat(self, boot: float) -> list[Metric]:
        try:
            # Fields after the command name, which is in parentheses and may hold spaces or ")".
            fields = (self._own / "stat").read_bytes().rsplit(b")", 1)[-1].split()
            utime, stime, start, vsize, rss = (float(fields[i]) for i in (11, 12, 19, 20, 21))
        except (OSError, ValueError, IndexError):
            return []
        ticks = self._ticks
        return [
            GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.", value=vsize),
            GaugeMetricFamily(
                "process_resident_memory_bytes", "Resident memory size in bytes.", value=rss * self._page
            ),
            GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=start / ticks + boot,
            ),
            CounterMetricFamily(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                value=utime / ticks + stime / ticks,
            ),
        ]

    def _descriptors(self) -> list[Metric]:
        try:
            with open(self._own / "limits", "rb") as limits:
                # The soft limit: "Max open files  <soft>  <hard>  files"
                soft = next(float(line.split()[3]) for line in limits if line.startswith(b"Max open file"))
            count = len(os.listdir(self._own / "fd"))  # this listing's own descriptor included
        except (OSError, ValueError, IndexError, StopIteration):
            return []
        return [
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=count),
            GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.", value=soft),
        ]
