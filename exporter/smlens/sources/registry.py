"""The data sources that ``--backend`` chooses from: name -> how to open it and what it can do.

A new backend is one module under ``smlens.sources`` plus one entry here. Nothing else asks a backend's
name what it is: the settings (``--backend`` choices and help, which options apply to which backend, the
``--admin-token-file`` check), attribution (the kubelet's default socket or the simulated pod layout, a
shared NVML session), the runtime and the admin endpoints read the facts of this table.
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


# Used when --sim-gpus / --sim-seed are not given; unset rather than defaulted in the settings, so that
# the other backends can refuse them when given.
SIM_GPUS = 8
SIM_SEED = 0


class SourceOptions(Protocol):
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
    def sim_gpus(self) -> int | None: ...
    @property
    def sim_seed(self) -> int | None: ...
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


@dataclass(frozen=True, kw_only=True)
class BackendKind:
    name: str
    summary: str  # one phrase for --help
    profiling: bool  # can it deliver SM-level metrics
    pausable: bool  # can it pause profiling for another tool (the admin endpoints)
    # No hardware behind it: attribution uses the simulated pod layout, never the kubelet's default socket.
    simulated: bool
    # It opens NVML: attribution shares its session (MIG layouts) and can read NVML's process lists.
    reads_nvml: bool
    # The settings (field names) that only some kinds accept and this one does: any other kind refuses
    # them when given, rather than dropping them silently.
    options: frozenset[str]
    open: Callable[[SourceOptions], Opened]

    def describe(self) -> str:
        return f"{self.name}: {self.summary}" + ("" if self.profiling else ", no SM-level metrics")


def _open_sim(settings: SourceOptions) -> Opened:
    from smlens.sources.sim import Scenario, SimBackend, load_scenario

    if settings.sim_scenario is not None:
        scenario = load_scenario(settings.sim_scenario)
    else:
        scenario = Scenario.steady(SIM_GPUS if settings.sim_gpus is None else settings.sim_gpus)
    seed = SIM_SEED if settings.sim_seed is None else settings.sim_seed
    sim = SimBackend(scenario, seed=seed, hostname_hint=settings.node_name)
    return Opened(sim, sim.discover(), [])


def _open_nvml(settings: SourceOptions, gpm: bool, dcgm: bool, dcgm_required: bool) -> Opened:
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

_DCGM_OPTIONS = frozenset({"dcgm_hostengine", "dcgm_embedded"})

KINDS: Mapping[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind(
            name="auto",
            summary="NVML, plus GPM where supported, else DCGM if reachable",
            profiling=True,
            pausable=True,
            simulated=False,
            reads_nvml=True,
            options=_DCGM_OPTIONS,
            open=_AUTO,
        ),
        BackendKind(
            name="nvml",
            summary="NVML only",
            profiling=False,
            pausable=False,
            simulated=False,
            reads_nvml=True,
            options=frozenset(),
            open=_NVML,
        ),
        BackendKind(
            name="dcgm",
            summary="NVML and DCGM, no GPM",
            profiling=True,
            pausable=True,
            simulated=False,
            reads_nvml=True,
            options=_DCGM_OPTIONS,
            open=_DCGM,
        ),
        BackendKind(
            name="sim",
            summary="a simulated node",
            profiling=True,
            pausable=False,
            simulated=True,
            reads_nvml=False,
            options=frozenset({"sim_gpus", "sim_seed", "sim_scenario", "sim_pods"}),
            open=_open_sim,
        ),
    )
}


def accepting(option: str) -> tuple[str, ...] | None:
    """The kinds that accept ``option`` (a settings field name), in table order; None when every kind does."""
    names = tuple(kind.name for kind in KINDS.values() if option in kind.options)
    return names or None
