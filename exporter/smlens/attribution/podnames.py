"""Turn the pod UID and container id of a cgroup into namespace, pod and container names.

The kubelet keeps one log directory per pod, ``/var/log/pods/<namespace>_<pod>_<uid>/``, and one
symlink per container, ``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``.
Listing both directories answers the question without any API call or credential; it needs
those two paths mounted read-only (the Helm chart does so when process attribution is on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from smlens.attribution.cgroups import CgroupIdentity
from smlens.model import UNATTRIBUTED, Workload

DEFAULT_LOG_DIR = Path("/var/log")
SHORT_ID = 12  # docker's short container id, for containers outside Kubernetes


def _entries(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


@dataclass(frozen=True)
class PodNames:
    """One listing of the kubelet's log directories."""

    containers: Mapping[str, Workload]  # container id -> workload
    pods: Mapping[str, tuple[str, str]]  # pod uid -> (namespace, pod)

    @staticmethod
    def scan(log_dir: Path = DEFAULT_LOG_DIR) -> PodNames:
        containers: dict[str, Workload] = {}
        for entry in _entries(log_dir / "containers"):
            stem = entry.removesuffix(".log")
            pod, _, rest = stem.partition("_")
            namespace, _, rest = rest.partition("_")
            container, _, container_id = rest.rpartition("-")
            if pod and namespace and container and container_id:
                containers[container_id] = Workload(namespace, pod, container)
        pods: dict[str, tuple[str, str]] = {}
        for entry in _entries(log_dir / "pods"):
            parts = entry.split("_")
            if len(parts) == 3 and all(parts):
                pods[parts[2]] = (parts[0], parts[1])
        return PodNames(MappingProxyType(containers), MappingProxyType(pods))

    def workload(self, identity: CgroupIdentity) -> Workload:
        """The workload of a cgroup identity. A pod whose names are unknown keeps its UID as ``pod``."""
        if identity.slurm_job:
            return Workload(slurm_job=identity.slurm_job)
        if identity.container_id in self.containers:
            return self.containers[identity.container_id]
        if identity.pod_uid:
            namespace, pod = self.pods.get(identity.pod_uid, ("", identity.pod_uid))
            return Workload(namespace, pod)
        if identity.container_id:
            return Workload(container=identity.container_id[:SHORT_ID])
        return UNATTRIBUTED


NO_NAMES = PodNames(MappingProxyType({}), MappingProxyType({}))
