"""The truth harness' judging: bands on counters and gauges, verdicts, cost, latency, ncu, non-root."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.truth.compare import (
    RawCost,
    Verdict,
    WorkloadReading,
    judge_accounting,
    judge_cost,
    judge_latency,
    judge_verdicts,
    judge_workload,
    ncu_outcomes,
    ncu_pipe_outcomes,
    raw_cost,
    unprivileged_outcomes,
    window_verdict,
)
from bench.truth.expect import VERDICTS, Check, DeviceLimits, ExpectedVerdict, at_least, checks_for
from bench.truth.ground_truth import (
    CYCLES_ACTIVE,
    CYCLES_ELAPSED,
    DRAM_BYTES,
    DRAM_THROUGHPUT,
    DURATION,
    FMA_PIPE,
    TENSOR_PIPE,
    WARPS_ACTIVE,
    KernelTruth,
    Launch,
    NcuPipeRun,
    NcuRun,
    parse_csv,
)
from bench.truth.metrics import SamplingCost, Scrape, parse, seconds_by_verdict
from bench.truth.unprivileged import UnprivilegedRun

from smlens import names as n
from smlens.verdicts.thresholds import load

THRESHOLDS = load()  # the shipped thresholds.yaml

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


def test_a_counter_only_check_ignores_the_absent_gauge() -> None:
    checks = [Check(n.FP32_ACTIVE, at_least(0.8), "why", gauge=False)]
    (outcome,) = judge_workload(reading(fp32_active=(0.9, None)), checks)
    assert outcome.passed is True and outcome.measured == "0.9 (counter)"
    assert [o.passed for o in judge_workload(reading(fp32_active=(0.7, 0.95)), checks)] == [False]


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
        judged=Verdict(0.0, "hollow", "busy but..."),
    )
    hollow = ExpectedVerdict("hollow", "why")
    outcomes = judge_verdicts(spin, hollow)
    assert [(o.metric, o.passed) for o in outcomes] == [
        ("judge(window means)", True),
        ("smlens check --duration 3", False),
        ("smlens check --duration 6.5", True),
    ]
    idle = ExpectedVerdict("idle", "why")
    crashed = WorkloadReading("idle", "t", {}, {}, verdicts=(Verdict(3.0, None, "smlens check failed: x"),))
    assert [o.passed for o in judge_verdicts(crashed, idle)] == [False]
    assert [o.passed for o in judge_verdicts(WorkloadReading("idle", "t", {}, {}), idle)] == [False]
    failed = WorkloadReading("fp32_fma", "t", {}, {}, error="prepare failed: x")
    (outcome,) = judge_verdicts(failed, VERDICTS["fp32_fma"])
    assert outcome.passed is False and outcome.expected == "compute_bound (fp32 pipe)"


def test_a_compute_bound_verdict_must_name_the_expected_pipe() -> None:
    fma = VERDICTS["fp32_fma"]
    right = WorkloadReading("fp32_fma", "t", {}, {}, judged=Verdict(0.0, "compute_bound", "x", "fp32"))
    wrong = WorkloadReading("fp32_fma", "t", {}, {}, judged=Verdict(0.0, "compute_bound", "x", "integer"))
    assert judge_verdicts(right, fma)[0].passed is True
    assert judge_verdicts(right, fma)[0].measured == "compute_bound (fp32): x"
    assert judge_verdicts(wrong, fma)[0].passed is False


def test_a_reported_verdict_is_information() -> None:
    generate = WorkloadReading("gpt2_generate", "t", {}, {}, judged=Verdict(0.0, "partial", "partly used"))
    outcomes = judge_verdicts(generate, VERDICTS["gpt2_generate"])
    assert [o.passed for o in outcomes] == [None, None]  # the window means' verdict and "not run"
    assert outcomes[0].measured == "partial: partly used"


# Window means as the H200 gave them (docs/validation.md), and those of an FMA-bound kernel.
SPIN_WARP_PER_SM = {n.UTILIZATION: 0.99, n.SM_ACTIVE: 0.9986, n.SM_OCCUPANCY: 0.0156, n.DRAM_ACTIVE: 0.0}
IDLE_PIPES = {key: 0.0 for key in n.COMPUTE_SOL_PIPES}


@pytest.mark.parametrize(
    ("rates", "memory", "code", "pipe"),
    [
        ({n.UTILIZATION: 0.0, n.SM_ACTIVE: 0.0, n.DRAM_ACTIVE: 0.0, **IDLE_PIPES}, 0.0, "idle", None),
        ({n.UTILIZATION: 0.0, n.SM_ACTIVE: 0.0, n.DRAM_ACTIVE: 0.0}, 2e9, "idle_memory_held", None),
        ({n.UTILIZATION: 0.99, n.SM_ACTIVE: 0.0076, n.DRAM_ACTIVE: 0.0, **IDLE_PIPES}, 1e9, "hollow", None),
        ({**SPIN_WARP_PER_SM, **IDLE_PIPES, n.COMPUTE_SOL: 0.01}, 1e9, "stalled", None),
        (
            {**SPIN_WARP_PER_SM, n.DRAM_ACTIVE: 0.885, **IDLE_PIPES, n.COMPUTE_SOL: 0.0},
            3e9,
            "memory_bound",
            None,
        ),
        (
            {
                **SPIN_WARP_PER_SM,
                **IDLE_PIPES,
                n.TENSOR_ACTIVE: 0.935,
                n.COMPUTE_SOL: 0.935,
                n.DRAM_ACTIVE: 0.17,
            },
            1e9,
            "compute_bound",
            "tensor",
        ),
        (
            {
                **SPIN_WARP_PER_SM,
                **IDLE_PIPES,
                n.FP32_ACTIVE: 0.9,
                n.INTEGER_ACTIVE: 0.05,
                n.COMPUTE_SOL: 0.9,
            },
            1e9,
            "compute_bound",
            "fp32",
        ),
        ({**SPIN_WARP_PER_SM, **IDLE_PIPES}, 1e9, "stalled", None),  # no compute SOL: the busiest pipe
        ({n.UTILIZATION: 0.5, n.SM_ACTIVE: 0.4, n.DRAM_ACTIVE: 0.01, **IDLE_PIPES}, 1e9, "partial", None),
    ],
)
def test_window_verdict_is_smlens_own_judge(
    rates: dict[str, float], memory: float, code: str, pipe: str | None
) -> None:
    verdict = window_verdict(THRESHOLDS, rates, {n.MEMORY_USED_BYTES: memory})
    assert (verdict.code, verdict.pipe) == (code, pipe)
    assert verdict.seconds == 0.0 and verdict.text


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


def launch(kernel: str, **values: float) -> Launch:
    return Launch(kernel, "(528, 1, 1)", "(512, 1, 1)", values)


def pipe_run() -> NcuPipeRun:
    placed = {CYCLES_ACTIVE: 990.0, CYCLES_ELAPSED: 1000.0, WARPS_ACTIVE: 56.7}
    kernels = {
        "fp32_fma": launch("smlens_truth_fma", **placed, **{FMA_PIPE: 91.0, DRAM_THROUGHPUT: 0.1}),
        "pointer_chase": launch(
            "smlens_truth_chase", **placed, **{DRAM_THROUGHPUT: 45.0, DRAM_BYTES: 2.4e9, DURATION: 1e6}
        ),
        "copy_d2d": launch("smlens_truth_copy", **{DRAM_THROUGHPUT: 88.0}),
        "gemm_bf16": launch("nvjet_gemm", **{TENSOR_PIPE: 91.0}),
    }
    return NcuPipeRun(True, "", kernels, "")


def test_ncu_pipe_counters_against_smlens_on_the_same_kernel() -> None:
    smlens = {
        "fp32_fma": reading(
            "fp32_fma", fp32_active=(0.95, None), sm_active=(0.99, None), sm_occupancy=(0.563, None)
        ),
        "pointer_chase": reading("pointer_chase", dram_active=(0.6, None)),
        "copy_d2d": reading("copy_d2d", dram_active=(0.885, None)),
        "gemm_bf16": reading("gemm_bf16", tensor_active=(0.935, None)),
    }
    outcomes = {(o.subject, o.metric): o for o in ncu_pipe_outcomes(pipe_run(), HOPPER, smlens)}
    active = outcomes[("fp32_fma", n.SM_ACTIVE)]  # 990 / 1000 cycles
    assert active.passed is True and active.expected == "smlens within 0.033 of ncu"
    occupancy = outcomes[("fp32_fma", n.SM_OCCUPANCY)]  # under its launch shape: warps retire early
    assert occupancy.passed is True and occupancy.measured == "0.567 (smlens 0.563)"
    assert outcomes[("pointer_chase", n.SM_ACTIVE)].passed is False  # smlens gave none
    fma = outcomes[("fp32_fma", f"{n.FP32_ACTIVE} vs {FMA_PIPE}")]
    assert fma.passed is True and fma.measured == "ncu 0.91, smlens 0.95"
    chase = outcomes[("pointer_chase", f"{n.DRAM_ACTIVE} vs {DRAM_THROUGHPUT}")]
    assert chase.passed is False  # 0.6 against 0.45: more than 0.1 apart
    assert outcomes[("gemm_bf16", f"{n.TENSOR_ACTIVE} vs {TENSOR_PIPE}")].passed is True
    copy = outcomes[("copy_d2d", f"{n.DRAM_ACTIVE} vs {DRAM_THROUGHPUT}")]
    assert copy.passed is None and "driver memcpy" in copy.expected  # another kernel: information
    moved = outcomes[("pointer_chase", "dram__bytes.sum / gpu__time_duration.sum / peak")]
    assert moved.passed is None and moved.measured == "0.5 (2.40 TB/s)"
    assert outcomes[("fp32_fma", FMA_PIPE)].measured == "0.91"  # every pipe ratio as information


def test_ncu_pipe_counters_absent_on_either_side() -> None:
    outcomes = ncu_pipe_outcomes(pipe_run(), HOPPER, {})
    fma = next(o for o in outcomes if o.metric == f"{n.FP32_ACTIVE} vs {FMA_PIPE}")
    assert fma.passed is False and fma.measured == "ncu 0.91, smlens absent"  # smlens lacks it: a failure
    lacking = NcuPipeRun(True, "", {"gemm_bf16": launch("nvjet_gemm")}, "")
    (gemm,) = ncu_pipe_outcomes(lacking, HOPPER, {})
    assert gemm.passed is None  # ncu lacks the metric: nothing to compare
    (skipped,) = ncu_pipe_outcomes(NcuPipeRun(False, "ncu is not installed", {}, ""), HOPPER, {})
    assert skipped.passed is None and skipped.measured == "not run: ncu is not installed"
    partial = NcuPipeRun(True, "no launch of copy_d2d in ncu's output", {}, "")
    assert [o.measured for o in ncu_pipe_outcomes(partial, HOPPER, {})] == [partial.reason]


def _accounted(name: str, seconds: dict[str, float], window: float = 20.0) -> WorkloadReading:
    return WorkloadReading(name, "test", {}, {}, accounted=seconds, window_seconds=window)


def test_accounting_must_cover_the_window_and_give_the_expected_class_its_share() -> None:
    expected = VERDICTS["gemm_bf16"]
    good = judge_accounting(_accounted("gemm_bf16", {"compute_bound": 19.5, "partial": 0.5}), expected, 0.5)
    assert [o.passed for o in good] == [True, True]
    mixed = judge_accounting(_accounted("gemm_bf16", {"compute_bound": 15.0, "stalled": 5.0}), expected, 0.5)
    assert [o.passed for o in mixed] == [True, False]
    short = judge_accounting(_accounted("gemm_bf16", {"compute_bound": 15.0}), expected, 0.5)
    assert short[0].passed is False  # five seconds of the window lost
    real = judge_accounting(
        _accounted("gpt2_train", {"stalled": 12.0, "partial": 8.0}), VERDICTS["gpt2_train"], 0.5
    )
    assert [o.passed for o in real] == [True, None] and "stalled 60%" in real[1].measured


def test_seconds_by_verdict_reads_one_gpus_counters_across_owners() -> None:
    def scrape(text: str) -> Scrape:
        return parse("# TYPE gpu_verdict_seconds_total counter\n" + text, 0.0)

    row = 'gpu_verdict_seconds_total{{gpu="{}",gpu_instance="",verdict="{}",pod="{}"}} {}\n'
    first = scrape(row.format(0, "idle", "a", 10) + row.format(1, "idle", "", 99))
    last = scrape(
        row.format(0, "idle", "a", 12)
        + row.format(0, "compute_bound", "b", 7)
        + row.format(1, "idle", "", 120)
    )
    assert seconds_by_verdict(first, last, "0") == {"idle": 2.0, "compute_bound": 7.0}
