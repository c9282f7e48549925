"""Which backend serves a GPU's SM-level (profiling) metrics: one source per GPU, never a mix.

Backends are attached in priority order (the device source first, then GPM, then DCGM). A later
profiling backend is offered only the GPUs that no earlier one serves, so DCGM takes the GPUs without
GPM. The choice is made once, at attach time; readings from any other profiling source are ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from smlens.model import GpuIdentity, Reading
from smlens.names import SM_ACTIVE
from smlens.sources.base import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfilingChoice:
    """The backend serving one GPU's SM-level metrics (None if none), or why none does."""

    source: str | None = None
    reason: str = ""

    def admits(self, reading: Reading) -> bool:
        """Does this reading's activity count for the GPU? Non-profiling activity always does."""
        return not reading.profiling or reading.source == self.source

    def delivered(self, readings: Iterable[Reading]) -> bool:
        """Did the chosen source deliver profiling metrics in these readings?"""
        return any(r.profiling and r.source == self.source for r in readings)

    def unavailable_reason(self, delivered: bool, missing: Mapping[str, str]) -> str:
        """Why the GPU has no SM-level metrics this tick; empty when it has them."""
        if self.reason or delivered:
            return self.reason
        return missing.get(self.source or "", missing.get(SM_ACTIVE, ""))


def attach(
    backends: Sequence[Backend], gpus: Sequence[GpuIdentity]
) -> tuple[list[frozenset[str]], dict[str, ProfilingChoice]]:
    """Attach every backend in order; returns the uuids each serves and the profiling choice per GPU."""
    choices = {gpu.uuid: ProfilingChoice() for gpu in gpus}
    served: list[frozenset[str]] = []
    for backend in backends:
        wanted = [g for g in gpus if not backend.provides_profiling or choices[g.uuid].source is None]
        verdicts = backend.attach(wanted) if wanted else {}
        served.append(frozenset(uuid for uuid, reason in verdicts.items() if reason is None))
        if not backend.provides_profiling:
            continue
        for gpu in gpus:
            if choices[gpu.uuid].source is not None:
                continue
            reason = verdicts.get(gpu.uuid, "not attached")
            choices[gpu.uuid] = (
                ProfilingChoice(backend.name)
                if reason is None
                else ProfilingChoice(None, f"{backend.name}: {reason}")
            )
    for gpu in gpus:
        choice = choices[gpu.uuid]
        log.info(
            "GPU %d (%s): profiling from %s%s",
            gpu.index,
            gpu.uuid,
            choice.source or "nowhere",
            f" ({choice.reason})" if choice.reason else "",
        )
    return served, choices
