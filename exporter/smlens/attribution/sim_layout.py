"""Pods for the simulated node, so that workload panels and alerts have data without Kubernetes.

The default layout matches the sim backend's default GPU profiles (healthy, hollow, single SM, ...).
``--sim-pods FILE`` replaces it; a real ``--pod-resources-socket`` replaces it entirely. A GPU listed
by several containers is shared the way time-slicing shares it (resource ``nvidia.com/gpu.shared``,
device ids ``<uuid>::<n>``).

File format::

    pods:
      - {namespace: ml-training, pod: llm-pretrain-0, container: trainer, gpus: [0, 1]}
      - {namespace: research, pod: notebook-bob, container: jupyter, gpus: [7]}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlens.attribution.refresher import SIM
from smlens.errors import ConfigError
from smlens.files import quote, read_yaml
from smlens.model import Allocation, GpuIdentity, Workload

EXCLUSIVE_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"


@dataclass(frozen=True, slots=True)
class SimPod:
    owner: Workload
    gpus: tuple[int, ...]


DEFAULT_PODS: tuple[SimPod, ...] = (
    SimPod(Workload("ml-training", "llm-pretrain-0", "trainer"), (0,)),  # healthy
    SimPod(Workload("ml-training", "llm-finetune-0", "trainer"), (1,)),  # busy but hollow
    SimPod(Workload("research", "spin-wait-debug", "worker"), (2,)),  # one SM busy
    SimPod(Workload("ml-inference", "embedder-a", "server"), (3,)),  # low occupancy, shared
    SimPod(Workload("ml-inference", "embedder-b", "server"), (3,)),
    SimPod(Workload("ml-inference", "vllm-70b-0", "vllm"), (4,)),  # memory bound
    SimPod(Workload("ml-inference", "triton-small-batch-0", "triton"), (5,)),  # launch bound
    SimPod(Workload("research", "notebook-bob", "jupyter"), (7,)),  # allocated, idle, memory held
)


def _name(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
        raise ConfigError(f"{where}: '{key}' must be a non-empty name without spaces, got {quote(value)}.")
    return value.strip()


def load(path: Path) -> tuple[SimPod, ...]:
    """Read a sim pod layout file (see the module docstring)."""
    raw = read_yaml(path, "sim pod layout")
    if not isinstance(raw, dict) or not isinstance(raw.get("pods"), list):
        raise ConfigError(f"sim pod layout {path} needs a list under 'pods' (it may be empty).")
    pods = []
    for i, entry in enumerate(raw["pods"]):
        where = f"{path}: pods[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with namespace, pod, container and gpus.")
        unknown = sorted(set(entry) - {"namespace", "pod", "container", "gpus"})
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {quote(unknown[0])}; known: namespace, pod, container, gpus."
            )
        gpus = entry.get("gpus")
        if (
            not isinstance(gpus, list)
            or not gpus
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus)
        ):
            raise ConfigError(f"{where}: 'gpus' must be a non-empty list of GPU indices, got {quote(gpus)}.")
        owner = Workload(
            _name(entry, "namespace", where), _name(entry, "pod", where), _name(entry, "container", where)
        )
        pods.append(SimPod(owner, tuple(dict.fromkeys(gpus))))
    return tuple(pods)


class SimLayoutSource:
    """Allocation source that serves a fixed layout; it cannot fail."""

    name = SIM

    def __init__(
        self, pods: Sequence[SimPod], gpus: Sequence[GpuIdentity], origin: str | None = None
    ) -> None:
        """``origin`` names the layout file; the default layout (no origin) drops pods on absent GPUs."""
        by_index = {gpu.index: gpu.uuid for gpu in gpus}
        if origin is not None:
            for pod in pods:
                for index in pod.gpus:
                    if index not in by_index:
                        raise ConfigError(
                            f"sim pod layout {origin}: pod {pod.owner.namespace}/{pod.owner.pod} lists GPU "
                            f"{index}, but the simulated node has {len(by_index)} GPU(s)."
                        )
        placed = [(pod.owner, index) for pod in pods for index in pod.gpus if index in by_index]
        holders = Counter(index for _, index in placed)
        replica: Counter[int] = Counter()
        allocations = []
        for owner, index in placed:
            uuid = by_index[index]
            if holders[index] > 1:
                allocations.append(Allocation(owner, SHARED_RESOURCE, f"{uuid}::{replica[index]}", uuid))
                replica[index] += 1
            else:
                allocations.append(Allocation(owner, EXCLUSIVE_RESOURCE, uuid, uuid))
        self._allocations = tuple(allocations)

    def allocations(self) -> tuple[Allocation, ...]:
        return self._allocations
