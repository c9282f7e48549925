"""Builds the sampler for a set of settings: which backends, in which order."""

from __future__ import annotations

from smlens.backends.base import Backend, DeviceSource
from smlens.backends.sim import Scenario, SimBackend, load_scenario
from smlens.config import Settings
from smlens.sampler import Sampler


def build_backends(settings: Settings) -> tuple[DeviceSource, list[Backend]]:
    """The device source and the extra (profiling) backends, in priority order."""
    if settings.backend == "sim":
        scenario = (
            load_scenario(settings.sim_scenario)
            if settings.sim_scenario
            else Scenario.steady(settings.sim_gpus)
        )
        return SimBackend(scenario, seed=settings.sim_seed, hostname_hint=settings.node_name), []
    from smlens.backends.nvml import open_nvml_backends

    nvml, gpm = open_nvml_backends(energy_interval=settings.energy_interval)
    return nvml, ([gpm] if settings.backend == "auto" else [])


def build_sampler(settings: Settings) -> Sampler:
    device, extras = build_backends(settings)
    sampler = Sampler(device, extras, hostname=settings.node_name, interval=settings.interval)
    try:
        gpus = sampler.open()
        if "attribution_interval" in settings.values:  # serve has attribution options, check has none
            from smlens.attribution.setup import build_refresher

            refresher = build_refresher(settings, gpus)
            if refresher is not None:
                sampler.attach_attribution(refresher)
    except BaseException:
        sampler.close()
        raise
    return sampler
