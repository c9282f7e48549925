"""The data sources that ``--backend`` chooses from: name -> how to open it and what it can do.

A new backend is one module under ``smlens.sources`` plus one entry here; the settings (``--backend``
choices and help, the ``--admin-token-file`` check), the runtime and the admin endpoints read this table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from smlens.errors import BackendUnavailable
from smlens.model import GpuIdentity
from smlens.sources.base import Backend, DeviceSource
from smlens.sources.nvml.session import NvmlSession

log = logging.getLogger(__name__)


class SourceSettings(Protocol):
    """What opening a backend reads; ``smlens.settings.SourceSettings`` provides it (the layer above)."""

    @property
    def interval(self) -> float: ...
    @property
    def node_name(self) -> str: ...
    @property
    def energy_interval(self) -> float: ...
    @property
    def utilization_interval(self) -> float: ...
    @property
    def sim_gpus(self) -> int: ...
    @property
    def sim_seed(self) -> int: ...
    @property
    def sim_scenario(self) -> Path | None: ...
    @property
    def dcgm_hostengine(self) -> str | None: ...
    @property
    def dcgm_embedded(self) -> bool: ...


@dataclass(frozen=True)
class Opened:
    """An opened data source: the device source, its GPUs, and the profiling backends in priority order."""

    device: DeviceSource
    gpus: list[GpuIdentity]
    extras: list[Backend]
    nvml_session: NvmlSession | None = None  # the backends' NVML session, for attribution to share

    def close(self) -> None:
        """Close each one, even when closing another failed (as Sampler.close does)."""
        for backend in (*reversed(self.extras), self.device):
            try:
                backend.close()
            except Exception as exc:
                log.warning("closing backend %s failed: %s", backend.name, exc)


@dataclass(frozen=True)
class BackendKind:
    name: str
    summary: str  # one phrase for --help
    profiling: bool  # can it deliver SM-level metrics
    pausable: bool  # can it pause profiling for another tool (the admin endpoints)
    open: Callable[[SourceSettings], Opened]

    def describe(self) -> str:
        return f"{self.name}: {self.summary}" + ("" if self.profiling else ", no SM-level metrics")


def _open_sim(settings: SourceSettings) -> Opened:
    from smlens.sources.sim import Scenario, SimBackend, load_scenario

    scenario = (
        load_scenario(settings.sim_scenario) if settings.sim_scenario else Scenario.steady(settings.sim_gpus)
    )
    sim = SimBackend(scenario, seed=settings.sim_seed, hostname_hint=settings.node_name)
    return Opened(sim, sim.discover(), [])


def _open_nvml(settings: SourceSettings, gpm: bool, dcgm: bool, dcgm_required: bool) -> Opened:
    """GPUs are discovered first, so that a node without NVML fails with that cause before DCGM is tried."""
    from smlens.sources.nvml.backend import open_nvml_backends

    nvml, gpm_backend = open_nvml_backends(
        energy_interval=settings.energy_interval, utilization_interval=settings.utilization_interval
    )
    try:
        opened = Opened(nvml, nvml.discover(), [gpm_backend] if gpm else [], nvml.session)
    except BaseException:
        nvml.close()
        raise
    if not dcgm:
        return opened
    from smlens.sources.dcgm.backend import open_dcgm_backend

    try:
        opened.extras.append(
            open_dcgm_backend(
                settings.dcgm_hostengine,
                settings.dcgm_embedded,
                settings.interval,
                settings.node_name,
                mig=nvml.session,
            )
        )
    except BackendUnavailable as exc:
        if dcgm_required:
            opened.close()
            raise
        log.info("DCGM not used (GPUs without GPM get NVML metrics only): %s", exc)
    return opened


_AUTO = partial(_open_nvml, gpm=True, dcgm=True, dcgm_required=False)
_NVML = partial(_open_nvml, gpm=False, dcgm=False, dcgm_required=False)
_DCGM = partial(_open_nvml, gpm=False, dcgm=True, dcgm_required=True)

KINDS: Mapping[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind("auto", "NVML, plus GPM where supported, else DCGM if reachable", True, True, _AUTO),
        BackendKind("nvml", "NVML only", False, False, _NVML),
        BackendKind("dcgm", "NVML and DCGM, no GPM", True, True, _DCGM),
        BackendKind("sim", "a simulated node", True, False, _open_sim),
    )
}
