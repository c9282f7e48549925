"""Builds the sampler for a set of settings: the backends the registry opens, then attribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from smlens.pipeline.sampler import Sampler
from smlens.settings import ServeSettings, SourceSettings
from smlens.sources.registry import KINDS

if TYPE_CHECKING:
    from smlens.attribution.sim_layout import SimPod


def build_sampler(settings: SourceSettings, sim_pods: Sequence[SimPod] | None = None) -> Sampler:
    """An opened (attached, not started) sampler; everything it opened is closed if a step fails.
    ``sim_pods``: the simulated pod layout, when serve has read it already."""
    opened = KINDS[settings.backend].open(settings)
    sampler = Sampler(opened.device, opened.extras, hostname=settings.node_name, interval=settings.interval)
    try:
        gpus = sampler.open(opened.gpus)
        if isinstance(settings, ServeSettings):  # attribution belongs to serve only
            from smlens.pipeline.attribution import build_refresher

            refresher = build_refresher(settings, gpus, opened.nvml_session, sim_pods)
            if refresher is not None:
                sampler.attach_attribution(refresher)
    except BaseException:
        sampler.close()
        raise
    return sampler
