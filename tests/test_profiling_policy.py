"""The profiling-source policy on its own: one source per GPU, in priority order, never a mix."""

from __future__ import annotations

from collections.abc import Sequence

from smlens import names as n
from smlens.model import Activity, GpuIdentity, Reading
from smlens.pipeline.profiling_policy import ProfilingChoice, attach
from smlens.sources.base import Backend

GPUS = [GpuIdentity(i, f"GPU-{i}", "Fake") for i in range(3)]


class Scripted(Backend):
    """Serves the GPUs named in ``serves``; records what it was offered."""

    def __init__(self, name: str, serves: set[int], profiling: bool = True) -> None:
        self.name = name
        self.provides_profiling = profiling
        self.serves = serves
        self.offered: list[int] = []

    def attach(self, gpus: Sequence[GpuIdentity]) -> dict[str, str | None]:
        self.offered = [g.index for g in gpus]
        return {g.uuid: None if g.index in self.serves else "not supported" for g in gpus}

    def read(self, gpu: GpuIdentity, now: float) -> Reading:
        raise AssertionError("the policy never reads")


def test_first_profiling_backend_wins_and_later_ones_get_only_the_rest() -> None:
    device = Scripted("dev", {0, 1, 2}, profiling=False)
    gpm, dcgm = Scripted("gpm", {0}), Scripted("dcgm", {1})
    served, choices = attach([device, gpm, dcgm], GPUS)
    assert device.offered == [0, 1, 2] and gpm.offered == [0, 1, 2] and dcgm.offered == [1, 2]
    assert served == [frozenset({"GPU-0", "GPU-1", "GPU-2"}), frozenset({"GPU-0"}), frozenset({"GPU-1"})]
    assert choices == {
        "GPU-0": ProfilingChoice("gpm"),
        "GPU-1": ProfilingChoice("dcgm"),
        "GPU-2": ProfilingChoice(None, "dcgm: not supported"),  # the last backend's reason
    }


def test_a_backend_offered_nothing_is_not_attached() -> None:
    gpm, dcgm = Scripted("gpm", {0, 1, 2}), Scripted("dcgm", set())
    served, _ = attach([gpm, dcgm], GPUS)
    assert dcgm.offered == [] and served[1] == frozenset()


def test_choice_admits_one_profiling_source_and_says_why_it_is_missing() -> None:
    choice = ProfilingChoice("gpm")
    part = {n.SM_ACTIVE: Activity.of(0.5, 1.0)}
    gpm = Reading("gpm", activity=part, profiling=True)
    dcgm = Reading("dcgm", activity=part, profiling=True)
    nvml = Reading("nvml", activity={n.UTILIZATION: Activity.of(1.0, 1.0)})
    assert choice.admits(gpm) and not choice.admits(dcgm) and choice.admits(nvml)
    assert choice.delivered([nvml, gpm]) and not choice.delivered([nvml, dcgm])
    assert choice.unavailable_reason(True, {"gpm": "timeout"}) == ""
    assert choice.unavailable_reason(False, {"gpm": "timeout"}) == "timeout"
    assert choice.unavailable_reason(False, {n.SM_ACTIVE: "not_supported"}) == "not_supported"
    assert ProfilingChoice(None, "gpm: not supported").unavailable_reason(False, {}) == "gpm: not supported"
