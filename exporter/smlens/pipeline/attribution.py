"""Choose the attribution sources for a set of settings and build the refresher that runs them.

- ``--pod-resources-socket PATH`` always means the kubelet at PATH, whatever the backend.
- Without it, a backend of real GPUs uses the kubelet's default socket when its directory exists (a
  Kubernetes node); a simulated one uses its pod layout (``--sim-pods FILE`` or the default one).
- ``--process-attribution`` adds per-process usage from NVML (only with a backend that reads NVML).

What a backend is (simulated, reading NVML) comes from the registry's entry of ``--backend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from time import monotonic

from smlens.attribution import sim_layout
from smlens.attribution.devices import DeviceMap
from smlens.attribution.refresher import AllocationSource, AttributionRefresher, UsageSource
from smlens.errors import ConfigError
from smlens.model import GpuIdentity
from smlens.settings import ServeSettings
from smlens.sources.nvml.session import NvmlSession
from smlens.sources.registry import KINDS

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


def _socket(settings: ServeSettings) -> Path | None:
    if settings.pod_resources_socket is not None:
        return settings.pod_resources_socket
    if not KINDS[settings.backend].simulated and DEFAULT_SOCKET.parent.is_dir():
        return DEFAULT_SOCKET
    return None


def read_sim_pods(settings: ServeSettings) -> tuple[sim_layout.SimPod, ...]:
    """The simulated node's pod layout: the ``--sim-pods`` file, read and checked, else the default one."""
    return sim_layout.load(settings.sim_pods) if settings.sim_pods else sim_layout.DEFAULT_PODS


def build_refresher(
    settings: ServeSettings,
    gpus: Sequence[GpuIdentity],
    session: NvmlSession | None = None,
    sim_pods: Sequence[sim_layout.SimPod] | None = None,
) -> AttributionRefresher | None:
    """The refresher for these settings, or None when no source applies (not started yet). ``session`` is
    the backends' NVML session: attribution then reads the MIG layouts the sampler keeps. ``sim_pods``:
    the layout :func:`read_sim_pods` gave, if it was read already."""
    kind = KINDS[settings.backend]
    session = (session or NvmlSession()) if kind.reads_nvml else None
    socket = _socket(settings)
    allocation: AllocationSource | None = None
    if socket is not None:
        # Imported here: nodes without a kubelet never need gRPC.
        try:
            from smlens.attribution.podresources import PodResourcesClient, PodResourcesSource
        except (ImportError, RuntimeError) as exc:  # protobuf/grpcio older than the committed stubs
            raise ConfigError(
                f"pod attribution needs grpcio>=1.85.1 and protobuf>=7.35.1 ({exc}); upgrade them or "
                "pass --pod-resources-socket only where they are installed."
            ) from None

        devices = DeviceMap(gpus)
        allocation = PodResourcesSource(
            PodResourcesClient(socket, settings.attribution_timeout),
            devices,
            settings.gpu_resource_names,
            settings.gpu_dra_drivers,
            mig_devices=None
            if session is None
            else (lambda: session.mig_placements(devices.gpus, monotonic())),
        )
    elif kind.simulated:
        pods = read_sim_pods(settings) if sim_pods is None else sim_pods
        origin = str(settings.sim_pods) if settings.sim_pods else None
        allocation = sim_layout.SimLayoutSource(pods, gpus, origin)
    usage: UsageSource | None = None
    if settings.process_attribution and session is not None:
        from smlens.attribution.processes import ProcessSource  # /proc and cgroup parsing: only when asked

        usage = ProcessSource(session, gpus, settings.attribution_interval)
    if allocation is None and usage is None:
        return None
    holder = object()  # holds NVML open for the MIG lookups until the refresher closes
    if session is not None:
        session.acquire(holder)
    return AttributionRefresher(
        allocation,
        usage,
        interval=settings.attribution_interval,
        owner_labels=not settings.no_workload_labels,
        on_close=None if session is None else (lambda: session.release(holder)),
    )
