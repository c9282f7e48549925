"""What each workload uses on each GPU, from NVML's per-process lists and per-process utilization.

Processes are grouped by workload (pod container or Slurm job, through /proc/PID/cgroup), so labels
stay bounded: no PIDs or command lines. NVML reports host PIDs, so this needs the host's PID
namespace (``hostPID: true`` in Kubernetes).

NVML's per-process utilization is the share of time in which a kernel of that process ran, which
the driver averages over its samples since the timestamp smlens passes (the start of the refresh
window, as far back as the driver's sample buffer reaches). It is time-based like GPU utilization and
no measure of how many SMs the process kept busy: on an H200 a spin kernel of one warp reads 99-100 %.
A process the driver leaves out of an answer it did give ran no kernel in the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlens.attribution import cgroups
from smlens.attribution.podnames import DEFAULT_LOG_DIR, NO_NAMES, PodNames
from smlens.attribution.refresher import PROCESSES
from smlens.errors import BackendError, GpuLostError
from smlens.model import GpuIdentity, Workload, WorkloadUsage
from smlens.sources.nvml.calls import Absent, call, describe, nvml_module
from smlens.sources.nvml.session import NvmlSession


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    memory_used_bytes: float | None
    utilization: float | None


def _processes(handle: Any, gpu: GpuIdentity, since_us: int) -> list[GpuProcess] | Absent:
    nv = nvml_module()
    compute = call(nv.nvmlDeviceGetComputeRunningProcesses, handle, gpu=describe(gpu))
    if isinstance(compute, Absent):
        return compute
    mps = call(nv.nvmlDeviceGetMPSComputeRunningProcesses, handle, gpu=describe(gpu))
    found = {p.pid: p for p in (*compute, *([] if isinstance(mps, Absent) else mps))}
    samples = call(nv.nvmlDeviceGetProcessUtilization, handle, since_us, gpu=describe(gpu))
    busy: dict[int, list[float]] = {}
    if not isinstance(samples, Absent):
        for sample in samples:
            if sample.pid and sample.timeStamp > since_us:
                busy.setdefault(sample.pid, []).append(min(sample.smUtil, 100) / 100)
    known_util = not isinstance(samples, Absent) or samples.reason == "not_found"
    return [
        GpuProcess(
            pid,
            None if process.usedGpuMemory is None else float(process.usedGpuMemory),
            (sum(busy[pid]) / len(busy[pid]) if pid in busy else 0.0) if known_util else None,
        )
        for pid, process in sorted(found.items())
    ]


def aggregate(gpu_uuid: str, owned: Iterable[tuple[Workload, GpuProcess]]) -> list[WorkloadUsage]:
    """Sum per workload: memory is absent if any process's is, utilization is capped at 1."""
    groups: dict[Workload, list[GpuProcess]] = {}
    for workload, process in owned:
        groups.setdefault(workload, []).append(process)
    usages = []
    for workload, processes in sorted(groups.items()):
        memory = [p.memory_used_bytes for p in processes]
        utilization = [p.utilization for p in processes]
        usages.append(
            WorkloadUsage(
                gpu_uuid,
                workload,
                len(processes),
                None if None in memory else sum(m for m in memory if m is not None),
                None if None in utilization else min(sum(u for u in utilization if u is not None), 1.0),
            )
        )
    return usages


class ProcessSource:
    """Usage source backed by NVML; holds the shared NVML session from construction to ``close``."""

    name = PROCESSES

    def __init__(
        self,
        session: NvmlSession,
        gpus: Sequence[GpuIdentity],
        window_seconds: float,
        proc_root: Path = Path("/proc"),
        log_dir: Path = DEFAULT_LOG_DIR,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._session = session
        self._gpus = tuple(gpus)
        self._window_us = int(window_seconds * 1e6)
        self._proc_root = proc_root
        self._log_dir = log_dir
        self._wall = wall
        session.acquire(self)

    def usage(self) -> tuple[WorkloadUsage, ...]:
        since_us = int(self._wall() * 1e6) - self._window_us
        per_gpu: list[tuple[GpuIdentity, list[GpuProcess]]] = []
        failures: list[str] = []
        for gpu in self._gpus:
            try:
                handle = self._session.handle(gpu)
                found = handle if isinstance(handle, Absent) else _processes(handle, gpu, since_us)
            except GpuLostError as exc:
                found = Absent(exc.reason)
            if isinstance(found, Absent):
                failures.append(found.reason)
            else:
                per_gpu.append((gpu, found))
        if failures and not per_gpu:
            raise BackendError(
                f"NVML process lists could not be read on any GPU ({failures[0]}).", failures[0]
            )
        identities = {p.pid: cgroups.read(p.pid, self._proc_root) for _, found in per_gpu for p in found}
        names = (
            PodNames.scan(self._log_dir)
            if any(i and not i.slurm_job for i in identities.values())
            else NO_NAMES
        )
        usages: list[WorkloadUsage] = []
        for gpu, found in per_gpu:
            owned = [(names.workload(identities[p.pid] or cgroups.NONE), p) for p in found]
            usages.extend(aggregate(gpu.uuid, owned))
        return tuple(usages)

    def close(self) -> None:
        self._session.release(self)
