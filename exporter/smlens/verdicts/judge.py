"""Plain-words verdicts on a GPU's activity, judged against the shared thresholds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from smlens import names as n
from smlens.model import GpuState, InstanceState
from smlens.verdicts.thresholds import Thresholds


@dataclass(frozen=True)
class Verdict:
    code: str
    text: str
    pipe: str | None = None  # compute-bound: the busiest compute pipe (names.SOL_PIPE_NAMES)

    def as_json(self) -> dict[str, str | None]:
        """As /api/v1/gpus and `smlens check --json` give it."""
        return {"code": self.code, "text": self.text, "pipe": self.pipe}


class Means(NamedTuple):
    """Mean ratios (0..1) of one GPU or MIG instance over one window; None where unavailable."""

    utilization: float | None
    sm_active: float | None
    occupancy: float | None
    dram: float | None
    compute_sol: float | None  # the busiest compute pipe tick by tick, integrated (names.COMPUTE_SOL)
    pipes: Mapping[str, float]  # window mean per compute-SOL pipe (names.COMPUTE_SOL_PIPES)
    memory_held: bool

    @classmethod
    def of_instance(cls, ratios: Mapping[str, float | None], memory_used_bytes: float | None) -> Means:
        """A MIG instance's: NVML gives it no utilization, so its memory held stands for busy."""
        return cls.of({**ratios, n.UTILIZATION: None}, memory_used_bytes)

    @classmethod
    def of(cls, ratios: Mapping[str, float | None], memory_used_bytes: float | None) -> Means:
        """From ratios by activity key. Without a compute SOL of its own (one tick's ratios), the
        busiest pipe is the SOL: over one tick the two are the same."""
        pipes = {k: v for k in n.COMPUTE_SOL_PIPES if (v := ratios.get(k)) is not None}
        sol = ratios.get(n.COMPUTE_SOL)
        return cls(
            ratios.get(n.UTILIZATION),
            ratios.get(n.SM_ACTIVE),
            ratios.get(n.SM_OCCUPANCY),
            ratios.get(n.DRAM_ACTIVE),
            sol if sol is not None else max(pipes.values(), default=None),
            pipes,
            holds_memory(memory_used_bytes),
        )


def _idle(m: Means) -> Verdict:
    if m.memory_held:
        return Verdict(
            n.VERDICT_IDLE_MEMORY_HELD, "idle, memory held: no kernels run, but a workload holds memory"
        )
    return Verdict(n.VERDICT_IDLE, "idle (no kernels ran)")


def judge(t: Thresholds, m: Means) -> Verdict:
    """What limits a GPU over a window: nothing (idle), its SMs (hollow), DRAM (memory-bound), a compute
    pipe (compute-bound), neither while its SMs are active (stalled), or part-time work (partial)."""
    sm = m.sm_active
    if sm is None:
        if m.utilization is None:
            return Verdict(n.VERDICT_UNKNOWN, "no data")
        if m.utilization < t.idle_utilization:
            return _idle(m)
        return Verdict(n.VERDICT_NO_PROFILING, "kernels ran, but SM activity is unavailable on this GPU")
    if m.utilization is None:  # a MIG instance: its memory held stands for busy, never a 0
        if sm < t.idle_utilization:
            return _idle(m)
        if sm <= t.hollow_sm_active and m.memory_held:
            return Verdict(
                n.VERDICT_HOLLOW, "held but SMs mostly idle: kernels too small or too few to fill it"
            )
    elif m.utilization < t.idle_utilization and sm < t.idle_utilization:
        return _idle(m)
    elif m.utilization >= t.busy_utilization and sm <= t.hollow_sm_active:
        return Verdict(
            n.VERDICT_HOLLOW, "busy but SMs mostly idle: kernels too small or too few to fill the GPU"
        )
    if m.dram is not None and m.dram >= t.memory_bound_dram:
        return Verdict(n.VERDICT_MEMORY_BOUND, "memory-bound: DRAM bandwidth near its peak")
    if m.compute_sol is not None and m.compute_sol >= t.compute_bound_pipe:
        busiest = max(m.pipes, key=m.pipes.__getitem__) if m.pipes else None
        pipe = None if busiest is None else n.SOL_PIPE_NAMES[busiest]
        which = f"the {pipe} pipe" if pipe else "a compute pipe"
        return Verdict(n.VERDICT_COMPUTE_BOUND, f"compute-bound: {which} near its peak", pipe)
    if sm >= t.working_sm_active:
        if m.compute_sol is None or m.dram is None:
            return Verdict(
                n.VERDICT_UNKNOWN,
                "SMs active; pipe or DRAM activity unavailable, so what limits them is unknown",
            )
        few = m.occupancy is not None and m.occupancy <= t.low_occupancy
        return Verdict(
            n.VERDICT_STALLED,
            "stalled: SMs active but neither a compute pipe nor DRAM near its peak"
            + (
                "; few warps resident, latency not hidden"
                if few
                else "; waiting on latency or synchronisation"
            ),
        )
    return Verdict(n.VERDICT_PARTIAL, "partly used: kernels run part of the time on part of the SMs")


def latest(t: Thresholds, gpu: GpuState) -> Verdict | None:
    """The verdict on a GPU's latest ratios; None when the GPU could not be read."""
    if not gpu.up:
        return None
    return judge(t, Means.of(gpu.gauges, gpu.gauges.get(n.MEMORY_USED_BYTES)))


def holds_memory(memory_used_bytes: float | None) -> bool:
    """Does a workload hold memory on a GPU or MIG instance: more in use than one without processes
    reports (the threshold GPUMigInstanceHollow counts an instance held by)?"""
    return memory_used_bytes is not None and memory_used_bytes > n.MIG_HELD_MEMORY_BYTES


def latest_instance(t: Thresholds, instance: InstanceState) -> Verdict:
    """The verdict on a MIG GPU instance's latest ratios (no utilization: NVML gives an instance none)."""
    g = instance.gauges
    return judge(t, Means.of_instance(g, g.get(n.MEMORY_USED_BYTES)))
