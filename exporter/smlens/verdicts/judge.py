"""Plain-words verdicts on a GPU's activity, judged against the shared thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from smlens import names as n
from smlens.model import GpuState
from smlens.verdicts.thresholds import Thresholds


@dataclass(frozen=True)
class Verdict:
    code: str
    text: str


def judge(
    t: Thresholds,
    utilization: float | None,
    sm_active: float | None,
    occupancy: float | None,
    tensor: float | None,
    dram: float | None,
) -> Verdict:
    """Classify mean ratios (0..1) of one GPU over some window. None means unavailable."""
    if sm_active is None:
        if utilization is None:
            return Verdict(n.VERDICT_UNKNOWN, "no data")
        if utilization < t.idle_utilization:
            return Verdict(n.VERDICT_IDLE, "idle (no kernels ran)")
        return Verdict(n.VERDICT_NO_PROFILING, "kernels ran, but SM activity is unavailable on this GPU")
    if utilization is None:  # never read as 0: the SM figures alone decide
        if sm_active == 0.0:
            return Verdict(n.VERDICT_IDLE, "idle (no kernels ran)")
        if sm_active <= t.hollow_sm_active:
            return Verdict(
                n.VERDICT_SM_UNDERUSED, "SMs mostly idle (utilization unavailable: hollow or intermittent)"
            )
    elif utilization < t.idle_utilization and sm_active < t.idle_utilization:
        return Verdict(n.VERDICT_IDLE, "idle (no kernels ran)")
    elif utilization >= t.busy_utilization and sm_active <= t.hollow_sm_active:
        return Verdict(
            n.VERDICT_HOLLOW, "busy but SMs mostly idle: kernels too small or too few to fill the GPU"
        )
    if dram is not None and dram >= t.memory_bound_dram:
        return Verdict(n.VERDICT_MEMORY_BOUND, "memory-bound: DRAM bandwidth near its peak")
    if (
        sm_active >= t.working_sm_active
        and occupancy is not None
        and occupancy <= t.low_occupancy
        and (tensor or 0.0) < t.tensor_busy
    ):
        return Verdict(
            n.VERDICT_LOW_OCCUPANCY, "SMs active but occupancy low: few warps per SM, latency not hidden"
        )
    if sm_active >= t.working_sm_active:
        return Verdict(n.VERDICT_WORKING, "working: SMs busy")
    return Verdict(n.VERDICT_PARTIAL, "partly used: kernels run part of the time on part of the SMs")


def latest(t: Thresholds, gpu: GpuState) -> Verdict | None:
    """The verdict on a GPU's latest ratios; None when the GPU could not be read."""
    if not gpu.up:
        return None
    g = gpu.gauges
    return judge(
        t,
        g.get(n.UTILIZATION),
        g.get(n.SM_ACTIVE),
        g.get(n.SM_OCCUPANCY),
        g.get(n.TENSOR_ACTIVE),
        g.get(n.DRAM_ACTIVE),
    )
