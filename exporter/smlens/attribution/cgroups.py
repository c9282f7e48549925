"""Read who a process belongs to from its /proc/PID/cgroup: a Kubernetes pod and container, a
standalone container, or a Slurm job.

Handles cgroup v1 (one line per hierarchy), v2 (the single ``0::`` line) and hybrid setups, the
cgroupfs and systemd layouts of the kubelet, and the containerd, CRI-O and Docker scope names:

- ``/kubepods/burstable/pod<uid>/<container id>``
- ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/
  cri-containerd-<id>.scope`` (or ``crio-<id>.scope``, ``docker-<id>.scope``)
- ``/docker/<id>``, ``/system.slice/docker-<id>.scope``, podman's ``libpod-<id>.scope``
- ``/slurm/uid_1000/job_42/step_0/task_0``, ``/system.slice/slurmstepd.scope/job_42/step_batch/...``
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Pod UIDs are UUIDs; static pods use a 32-hex-digit config hash instead. systemd writes '_' for '-'.
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$"
)
_SCOPE = re.compile(r"^(?:(cri-containerd|crio|docker|containerd|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")
_SLURM_JOB = re.compile(r"^job_(\d+)$")
_RUNTIMES = {
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
    "libpod": "podman",
}

# Which hierarchy to trust first when a v1 or hybrid host lists several.
_PREFERRED = ("", "memory", "devices", "pids", "cpu,cpuacct", "name=systemd")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says about its process. Empty strings mean "not in one"."""

    pod_uid: str = ""
    container_id: str = ""
    runtime: str = ""  # containerd, cri-o, docker, podman, or "" when unknown
    slurm_job: str = ""

    def __bool__(self) -> bool:
        return bool(self.pod_uid or self.container_id or self.slurm_job)


NONE = CgroupIdentity()


def identity_of_path(path: str) -> CgroupIdentity:
    """Identity carried by one cgroup path (as found after the second ':' of a /proc/PID/cgroup line)."""
    segments = [s for s in path.split("/") if s and s != ".."]
    if any("slurm" in s for s in segments):
        for segment in segments:
            job = _SLURM_JOB.match(segment)
            if job:
                return CgroupIdentity(slurm_job=job.group(1))
    pod_uid = container_id = runtime = ""
    for segment in segments:
        pod = _POD.search(segment)
        if pod:
            pod_uid = pod.group(1).replace("_", "-")
            continue
        scope = _SCOPE.match(segment)
        if scope:
            runtime = _RUNTIMES.get(scope.group(1) or "", "")
            container_id = scope.group(2)
    if not runtime and container_id and "docker" in segments:
        runtime = "docker"
    return CgroupIdentity(pod_uid, container_id, runtime)


def parse(text: str) -> CgroupIdentity:
    """Identity of a process from the text of its /proc/PID/cgroup (v1, v2 or hybrid)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        paths.setdefault(controllers, path)
    ordered = [c for c in _PREFERRED if c in paths] + sorted(c for c in paths if c not in _PREFERRED)
    best = NONE
    for controllers in ordered:
        found = identity_of_path(paths[controllers])
        if found.slurm_job or (found.pod_uid and found.container_id):
            return found
        if found and not best:
            best = found
    return best


def read(pid: int, proc_root: Path = Path("/proc")) -> CgroupIdentity | None:
    """Identity of a running process, None when it is gone or its cgroup file cannot be read."""
    try:
        return parse((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return None
