"""The fold on its own: pure, exact integrals, absent never zero, one profiling source."""

from __future__ import annotations

import pytest

from smlens import names as n
from smlens.model import Activity, GpuIdentity, Reading
from smlens.pipeline.fold import GpuTotals, fold
from smlens.pipeline.profiling_policy import ProfilingChoice

GPU = GpuIdentity(0, "GPU-0", "Fake")
GPM = ProfilingChoice("gpm")


def nvml(util: float, seconds: float, **extra: object) -> Reading:
    return Reading(
        "nvml",
        gauges={n.POWER_WATTS: 100.0},
        activity={n.UTILIZATION: Activity.of(util, seconds)},
        totals={n.ENERGY_JOULES: 5.0},
        **extra,  # type: ignore[arg-type]
    )


def gpm(sm: float, seconds: float) -> Reading:
    return Reading("gpm", activity={n.SM_ACTIVE: Activity.of(sm, seconds)} if seconds else {}, profiling=True)


def test_fold_is_pure() -> None:
    def inputs() -> tuple[GpuTotals, list[Reading], dict[str, str]]:
        totals = GpuTotals(activity={n.UTILIZATION: Activity(1.0, 2.0)}, xids={"13": 1})
        return totals, [nvml(0.5, 1.0, xid_events={13: 2}), gpm(0.25, 1.0)], {n.SM_OCCUPANCY: "not_supported"}

    totals, readings, missing = inputs()
    first = fold(GPU, totals, readings, missing, True, GPM)
    assert fold(GPU, totals, readings, missing, True, GPM) == first
    assert (totals, readings, missing) == inputs()


def test_what_fold_returns_cannot_be_changed_in_place() -> None:
    """A published state must not change when the sampler holds on to the totals it came with."""
    totals, state = fold(
        GPU, GpuTotals(), [nvml(0.5, 1.0, xid_events={13: 2}), gpm(0.25, 1.0)], {}, True, GPM
    )
    for mapping in (totals.activity, totals.ratios, totals.increments, totals.xids, state.xid_totals):
        with pytest.raises(TypeError):
            mapping[13] = 5  # type: ignore[index]


def test_integrals_add_up_and_counters_accumulate() -> None:
    totals = GpuTotals()
    for seconds in (0.3, 1.7, 2.0):
        totals, state = fold(
            GPU,
            totals,
            [nvml(0.5, seconds, increments={n.PCIE_TX_BYTES: 10.0}), gpm(0.25, seconds)],
            {},
            True,
            GPM,
        )
    assert state.activity_totals[n.UTILIZATION] == Activity(pytest.approx(2.0), pytest.approx(4.0))
    assert state.activity_totals[n.SM_ACTIVE].active_seconds == pytest.approx(1.0)
    assert state.totals == {n.ENERGY_JOULES: 5.0, n.PCIE_TX_BYTES: 30.0}
    assert state.gauges[n.SM_ACTIVE] == pytest.approx(0.25) and state.profiling_available


def test_another_profiling_source_is_ignored_never_mixed() -> None:
    dcgm = Reading("dcgm", activity={n.SM_ACTIVE: Activity.of(0.9, 1.0)}, profiling=True)
    _, state = fold(GPU, GpuTotals(), [nvml(0.5, 1.0), dcgm], {}, True, GPM)
    assert n.SM_ACTIVE not in state.gauges and n.SM_ACTIVE not in state.activity_totals
    assert state.profiling_available is False and state.sources == ("nvml", "dcgm")


def test_a_failed_backend_leaves_its_values_absent_with_the_reason() -> None:
    totals, _ = fold(GPU, GpuTotals(), [nvml(0.5, 1.0), gpm(0.25, 1.0)], {}, True, GPM)
    totals, state = fold(GPU, totals, [nvml(0.5, 1.0)], {"gpm": "timeout"}, True, GPM)
    assert n.SM_ACTIVE not in state.gauges  # not the last value, not zero
    assert state.activity_totals[n.SM_ACTIVE].covered_seconds == pytest.approx(1.0)  # kept
    assert (state.profiling_available, state.profiling_reason) == (False, "timeout")
    assert state.missing == {"gpm": "timeout"}


def test_a_ratio_without_new_coverage_keeps_its_last_value_from_the_same_source() -> None:
    totals, _ = fold(GPU, GpuTotals(), [gpm(0.25, 1.0)], {}, True, GPM)
    _, state = fold(GPU, totals, [gpm(0.25, 0.0)], {}, True, GPM)
    assert state.gauges[n.SM_ACTIVE] == pytest.approx(0.25)


def test_xid_totals_stay_read_only_and_earlier_states_keep_theirs() -> None:
    """Ticks without XIDs pass the totals' mapping on instead of copying it: no state may see a later count,
    and a plain dict a caller passed in never reaches a state."""
    totals, first = fold(GPU, GpuTotals(xids={"13": 1}), [nvml(0.5, 1.0), gpm(0.25, 1.0)], {}, True, GPM)
    with pytest.raises(TypeError):
        first.xid_totals["13"] = 5  # type: ignore[index]
    totals, second = fold(GPU, totals, [nvml(0.5, 1.0), gpm(0.25, 1.0)], {}, True, GPM)
    totals, third = fold(GPU, totals, [nvml(0.5, 1.0, xid_events={13: 2, 79: 1})], {}, True, GPM)
    assert dict(first.xid_totals) == dict(second.xid_totals) == {"13": 1}
    assert dict(third.xid_totals) == dict(totals.xids) == {"13": 3, "79": 1}
    given = {"13": 1}
    _, state = fold(GPU, GpuTotals(xids=given), [nvml(0.5, 1.0)], {}, True, GPM)
    given["13"] = 99
    assert dict(state.xid_totals) == {"13": 1}


def test_activities_add_up_as_spans_not_as_tuples() -> None:
    total = Activity(1.0, 2.0) + Activity(0.5, 1.0)
    assert type(total) is Activity and total == Activity(1.5, 3.0)


def pipes(seconds: float, missing: dict[str, str] | None = None, **ratios: float) -> Reading:
    """A gpm reading of ``seconds`` at the given ratios, keyed by activity key."""
    activity = {key: Activity.of(ratio, seconds) for key, ratio in ratios.items()}
    return Reading("gpm", activity=activity, missing=missing or {}, profiling=True)


def test_compute_sol_integrates_each_ticks_busiest_pipe() -> None:
    """Tick 1 (1 s): tensor 0.75 is the busiest, tick 2 (2 s): FP32 0.5. SOL = 0.75 x 1 + 0.5 x 2 = 1.75
    active seconds of 3, a mean of 0.5833; the busiest window mean, FP32's (0.25 + 1.0) / 3 = 0.4167,
    would say less. SM active and DRAM are busier still, and are no compute pipe."""
    first = {n.TENSOR_ACTIVE: 0.75, n.FP32_ACTIVE: 0.25, n.INTEGER_ACTIVE: 0.125}
    second = {n.TENSOR_ACTIVE: 0.125, n.FP32_ACTIVE: 0.5, n.INTEGER_ACTIVE: 0.25}
    others = {n.SM_ACTIVE: 1.0, n.DRAM_ACTIVE: 0.875}
    totals, state = fold(GPU, GpuTotals(), [pipes(1.0, **first, **others)], {}, True, GPM)
    assert state.activity_totals[n.COMPUTE_SOL] == Activity(0.75, 1.0)
    totals, state = fold(GPU, totals, [pipes(2.0, **second, **others)], {}, True, GPM)
    assert state.activity_totals[n.COMPUTE_SOL] == Activity(1.75, 3.0)
    assert state.activity_totals[n.TENSOR_ACTIVE] == Activity(1.0, 3.0)
    assert state.activity_totals[n.FP32_ACTIVE] == Activity(1.25, 3.0)
    assert state.gauges[n.COMPUTE_SOL] == 0.5  # the last tick's, in /api/v1/gpus values


def test_compute_sol_is_the_busiest_of_the_pipes_read_and_absent_without_any() -> None:
    totals, state = fold(
        GPU, GpuTotals(), [pipes(1.0, **{n.SM_ACTIVE: 0.5, n.DRAM_ACTIVE: 0.5})], {}, True, GPM
    )
    assert n.COMPUTE_SOL not in state.activity_totals and n.COMPUTE_SOL not in state.gauges  # not 0
    totals, state = fold(GPU, totals, [pipes(1.0, **{n.SM_ACTIVE: 0.5, n.FP64_ACTIVE: 0.25})], {}, True, GPM)
    assert state.activity_totals[n.COMPUTE_SOL] == Activity(0.25, 1.0)
    assert state.gauges[n.COMPUTE_SOL] == 0.25
    gone = pipes(1.0, {n.FP64_ACTIVE: "not_supported"}, **{n.SM_ACTIVE: 0.5})
    _, state = fold(GPU, totals, [gone], {}, True, GPM)
    assert state.activity_totals[n.COMPUTE_SOL] == Activity(0.25, 1.0)  # no coverage for this tick
    assert state.activity_totals[n.SM_ACTIVE] == Activity(1.5, 3.0)
    assert n.COMPUTE_SOL not in state.gauges and n.FP64_ACTIVE not in state.gauges
