"""The one small interface every data source implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from smlens.model import GpuIdentity, Reading

# What ``Backend.capture`` returns: the Reading, or what makes it from the values already read.
Captured = Reading | Callable[[], Reading]


def finish(captured: Captured) -> Reading:
    """The Reading of a capture; decoding raises what ``read`` would have raised."""
    return captured if isinstance(captured, Reading) else captured()


class Backend(abc.ABC):
    """A source of per-GPU readings.

    Lifecycle: ``attach(gpus)`` once, then ``capture(gpu, now)`` (by default ``read``) once per tick
    for each GPU it serves, then ``close()``. ``now`` is the sampler's monotonic clock, in seconds.
    ``read`` (or ``finish`` on a capture) raises :class:`~smlens.errors.GpuLostError` when the GPU is gone and
    :class:`~smlens.errors.BackendError` for any other failure of that GPU's read; values it
    merely cannot read go into ``Reading.missing``.
    """

    name: str
    provides_profiling: bool = False  # does it deliver SM-level (profiling) activity

    @abc.abstractmethod
    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        """Prepare to read these GPUs. Returns, per GPU uuid, None if served or why not."""

    @abc.abstractmethod
    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        """Read one GPU."""

    def capture(self, gpu: GpuIdentity, now: float) -> Captured:
        """Make this tick's calls for one GPU; turning their results into a Reading may wait (``finish``).

        The sampler makes every GPU's calls first and decodes them after, so that the calls of one tick
        stand close together in time. Backends whose values need no decoding just read."""
        return self.read(gpu, now)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release resources."""


class DeviceSource(Backend):
    """A backend that can also enumerate the node's GPUs (nvml, sim)."""

    @abc.abstractmethod
    def discover(self) -> list[GpuIdentity]:
        """List the GPUs of this node, in index order."""


@runtime_checkable
class ProfilingControl(Protocol):
    """A backend that can pause its profiling so that another tool (Nsight Compute) gets the counters;
    the admin endpoints drive it. :class:`smlens.sources.dcgm.backend.DcgmBackend` is one."""

    @property
    def paused(self) -> bool: ...

    def pause_profiling(self) -> None: ...

    def resume_profiling(self) -> None: ...
