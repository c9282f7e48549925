"""Builds the sampler for a set of settings: which backends, in which order."""

from __future__ import annotations

import logging

from smlens.backends.base import Backend, DeviceSource
from smlens.backends.sim import Scenario, SimBackend, load_scenario
from smlens.config import Settings
from smlens.errors import BackendUnavailable
from smlens.model import GpuIdentity
from smlens.sampler import Sampler

log = logging.getLogger(__name__)


def build_backends(settings: Settings) -> tuple[DeviceSource, list[GpuIdentity], list[Backend]]:
    """The device source, its GPUs and the extra (profiling) backends, in priority order.

    GPUs are discovered first so that a node without NVML fails with that cause before any
    optional source (DCGM) is tried."""
    if settings.backend == "sim":
        scenario = (
            load_scenario(settings.sim_scenario)
            if settings.sim_scenario
            else Scenario.steady(settings.sim_gpus)
        )
        sim = SimBackend(scenario, seed=settings.sim_seed, hostname_hint=settings.node_name)
        return sim, sim.discover(), []
    from smlens.backends.nvml import open_nvml_backends

    nvml, gpm = open_nvml_backends(
        energy_interval=settings.energy_interval, utilization_interval=settings.utilization_interval
    )
    try:
        gpus = nvml.discover()
    except BaseException:
        nvml.close()
        raise
    extras: list[Backend] = [gpm] if settings.backend == "auto" else []
    if settings.backend in ("auto", "dcgm"):
        from smlens.backends.dcgm import open_dcgm_backend

        try:
            extras.append(
                open_dcgm_backend(settings.dcgm_hostengine, settings.dcgm_embedded, settings.interval)
            )
        except BackendUnavailable as exc:
            if settings.backend == "dcgm":
                nvml.close()
                raise
            log.info("DCGM not used (GPUs without GPM get NVML metrics only): %s", exc)
    return nvml, gpus, extras


def build_sampler(settings: Settings) -> Sampler:
    device, gpus, extras = build_backends(settings)
    sampler = Sampler(device, extras, hostname=settings.node_name, interval=settings.interval)
    try:
        gpus = sampler.open(gpus)
        if "attribution_interval" in settings.values:  # serve has attribution options, check has none
            from smlens.attribution.setup import build_refresher

            refresher = build_refresher(settings, gpus)
            if refresher is not None:
                sampler.attach_attribution(refresher)
    except BaseException:
        sampler.close()
        raise
    return sampler
