"""The truth harness' judging: bands on counters and gauges, verdicts, cost, latency, ncu, non-root."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.truth.compare import (
    RawCost,
    Verdict,
    WorkloadReading,
    judge_cost,
    judge_latency,
    judge_verdicts,
    judge_workload,
    ncu_outcomes,
    raw_cost,
    unprivileged_outcomes,
)
from bench.truth.expect import Check, DeviceLimits, at_least, checks_for
from bench.truth.ground_truth import KernelTruth, NcuRun, parse_csv
from bench.truth.metrics import SamplingCost
from bench.truth.unprivileged import UnprivilegedRun

from smlens import names as n

HOPPER = DeviceLimits("hopper-like", 132, 2048, 1024, 233472, 232448, 1024, 60 << 20, 4.8e12)
FIXTURES = Path(__file__).parent / "fixtures" / "truth"


def reading(name: str = "w", **values: tuple[float | None, float | None]) -> WorkloadReading:
    return WorkloadReading(
        name, "test", {k: v[0] for k, v in values.items()}, {k: v[1] for k, v in values.items()}
    )


def test_both_the_counter_mean_and_the_gauge_must_hold() -> None:
    checks = [Check(n.SM_ACTIVE, at_least(0.9), "why")]
    assert [o.passed for o in judge_workload(reading(sm_active=(0.95, 0.96)), checks)] == [True]
    assert [o.passed for o in judge_workload(reading(sm_active=(0.95, 0.5)), checks)] == [False]
    assert [o.passed for o in judge_workload(reading(sm_active=(0.5, 0.95)), checks)] == [False]
    absent = judge_workload(reading(), checks)
    assert absent[0].passed is False and absent[0].measured == "absent (gauge absent)"


def test_a_failed_workload_is_one_failed_outcome() -> None:
    failed = WorkloadReading("gemm_bf16", "test", {}, {}, error="prepare failed: out of memory")
    (outcome,) = judge_workload(failed, checks_for("gemm_bf16", HOPPER))
    assert outcome.passed is False and "out of memory" in outcome.measured


def test_verdicts() -> None:
    spin = WorkloadReading(
        "spin_one_warp",
        "test",
        {},
        {},
        verdicts=(Verdict(3.0, "idle", "idle (no kernels ran)"), Verdict(6.5, "hollow", "busy but...")),
    )
    outcomes = judge_verdicts(spin, "hollow")
    assert [(o.metric, o.passed) for o in outcomes] == [
        ("smlens check --duration 3", False),
        ("smlens check --duration 6.5", True),
    ]
    crashed = WorkloadReading("idle", "t", {}, {}, verdicts=(Verdict(3.0, None, "smlens check failed: x"),))
    assert [o.passed for o in judge_verdicts(crashed, "idle")] == [False]
    assert [o.passed for o in judge_verdicts(WorkloadReading("idle", "t", {}, {}), "idle")] == [False]


def call_cost_report() -> dict[str, object]:
    """The shape bench/nvml_call_cost.py --json writes."""
    slow = [
        {"call": "nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)", "mean_us": 2500.0, "every_s": 5.0},
        {"call": "nvmlDeviceGetTotalEnergyConsumption", "mean_us": 4500.0, "every_s": 15.0},
    ]
    gpu = {
        "gpu": 0,
        "nvml_calls_sum_us": 300.0,
        "gpm_calls_sum_us": 200.0,
        "nvml_slow_us_per_second": 800.0,
        "nvml_slow_calls": slow,
    }
    return {"repeat": 100, "gpus": [gpu]}


def test_raw_cost_from_the_call_cost_report() -> None:
    raw = raw_cost(call_cost_report(), 0)
    assert raw is not None
    assert raw.per_tick(1.0) == 1300.0 and raw.per_tick(0.5) == 900.0
    assert raw.slow[1] == ("nvmlDeviceGetTotalEnergyConsumption", 4500.0, 15.0)
    assert raw_cost(call_cost_report(), 1) is None
    assert raw_cost({"gpus": [{"gpu": 0}]}, 0) is None


@pytest.mark.parametrize(("reads", "passed"), [(1625.0, True), (1626.0, False)])
def test_sampling_cost_within_a_quarter_of_the_bare_calls(reads: float, passed: bool) -> None:
    raw = RawCost(300.0, 200.0, 800.0, (("energy", 4500.0, 15.0),))
    outcomes = judge_cost(SamplingCost(100, reads, 1400.0), None, raw, interval=1.0)
    assert outcomes[0].passed is passed and "1300 us" in outcomes[0].expected
    assert [o.passed for o in outcomes[1:]] == [None, None]  # CPU and the slow call: information


def test_sampling_cost_without_figures_fails() -> None:
    assert judge_cost(None, None, RawCost(1, 1, 1, ()), 1.0)[0].passed is False
    assert judge_cost(SamplingCost(1, 1, 1), None, None, 1.0)[0].passed is False


def test_latency_relative_to_the_health_endpoint() -> None:
    ok = judge_latency("idle", [0.002] * 99 + [0.05], [0.001] * 100)
    assert ok.passed is True and ok.measured == "median 2.00 ms, p99 50.00 ms (2.00x)"
    assert judge_latency("load", [0.0031] * 10, [0.001] * 10).passed is False


def test_ncu_truths_are_held_to_the_same_bands() -> None:
    truths = parse_csv((FIXTURES / "ncu_spin.csv").read_text(), "smlens_truth_spin")
    names = ("spin_one_warp", "spin_half_sms", "spin_warp_per_sm")
    run = NcuRun(True, "", dict(zip(names, truths, strict=True)), "")
    smlens = {"spin_half_sms": reading("spin_half_sms", sm_active=(0.499, None))}
    outcomes = ncu_outcomes(run, HOPPER, smlens)
    assert [o.passed for o in outcomes] == [True] * 6
    assert outcomes[2].measured == "0.4999 (smlens 0.499)"
    assert outcomes[0].measured.endswith("(smlens absent)")
    wrong = NcuRun(True, "", {"spin_one_warp": KernelTruth("(1, 1, 1)", "(32, 1, 1)", 0.5, 0.0001)}, "")
    assert [o.passed for o in ncu_outcomes(wrong, HOPPER, {})] == [False, True]
    (skipped,) = ncu_outcomes(NcuRun(False, "ncu is not installed", {}, ""), HOPPER, {})
    assert skipped.passed is None and "not installed" in skipped.measured


def test_unprivileged_outcomes_are_information() -> None:
    run = UnprivilegedRun(
        True,
        "",
        families=("gpu_up", "gpu_sm_active_ratio"),
        lacking=("gpu_xid_errors_total",),
        profiling={"available": True, "source": "gpm", "reason": ""},
        missing={"xid_events": "no_permission"},
    )
    outcomes = unprivileged_outcomes(run, {})
    assert all(o.passed is None for o in outcomes)
    measured = [o.measured for o in outcomes]
    assert measured[1:] == ["gpu_xid_errors_total", "available=True source=gpm", "xid_events: no_permission"]
    assert outcomes[3].expected == "as root: none"
    (skipped,) = unprivileged_outcomes(UnprivilegedRun(False, "not root"), {})
    assert skipped.passed is None and skipped.measured == "not run: not root"
