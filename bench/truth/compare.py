"""Judging what was measured against what was expected: one :class:`Outcome` per check."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.truth.expect import (
    Check,
    DeviceLimits,
    ExpectedVerdict,
    checks_for,
    occupancy_tolerance,
    sm_active_tolerance,
)
from bench.truth.ground_truth import (
    DRAM_THROUGHPUT,
    ELAPSED_PERCENT,
    FMA_PIPE,
    TENSOR_PIPE,
    WARPS_ACTIVE,
    NcuPipeRun,
    NcuRun,
)
from bench.truth.metrics import SamplingCost
from bench.truth.unprivileged import UnprivilegedRun

from smlens import names as n
from smlens.verdicts.judge import Means, judge
from smlens.verdicts.thresholds import Thresholds

NCU_MATCH = 0.1  # smlens' window mean vs ncu's counter on one launch of the same kernel
# Per workload of ncu's pipe run: (smlens activity key, ncu metric) that measure the same on the same kernel.
NCU_PAIRS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "fp32_fma": ((n.FP32_ACTIVE, FMA_PIPE),),
    "pointer_chase": ((n.DRAM_ACTIVE, DRAM_THROUGHPUT),),
    "gemm_bf16": ((n.TENSOR_ACTIVE, TENSOR_PIPE),),
}
# Workloads whose SM active and occupancy smlens must read as ncu does on one launch of the same kernel
# (their launch shape bounds them from above only: expect._work_bound).
NCU_PLACED = ("fp32_fma", "pointer_chase")
COST_RATIO = 1.25  # smlens' reads may cost at most this much more than the bare NVML/GPM calls
LATENCY_RATIO = 3.0  # /metrics median within this of /-/healthy's: a scrape only joins pre-rendered bytes


@dataclass(frozen=True)
class Outcome:
    section: str  # workload, verdict, cost, latency, unprivileged, ncu
    subject: str
    metric: str
    expected: str
    measured: str
    passed: bool | None  # None: information, or a step that could not run
    note: str = ""

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "info"}[self.passed]


def fmt(value: float | None) -> str:
    return "absent" if value is None else f"{value:.4g}"


@dataclass(frozen=True)
class Verdict:
    """What one `smlens check --duration seconds` said (``seconds`` 0: the harness' own judging of the
    window means); ``code`` None when it failed (``text`` says why); ``pipe``: the busiest compute pipe a
    compute-bound verdict names."""

    seconds: float
    code: str | None
    text: str
    pipe: str | None = None

    @property
    def shown(self) -> str:
        if self.code is None:
            return "failed"
        return self.code + (f" ({self.pipe})" if self.pipe else "")


@dataclass(frozen=True)
class WorkloadReading:
    """What one workload window gave: smlens' exact means (counters), gauge medians, the workload's own
    throughput and the `smlens check` verdict; ``error`` when the workload or its measurement failed."""

    name: str
    description: str
    rates: Mapping[str, float | None]
    gauges: Mapping[str, float | None]
    achieved: float | None = None
    unit: str = ""
    verdicts: tuple[Verdict, ...] = ()
    error: str = ""
    judged: Verdict | None = None  # smlens.verdicts.judge on the window means (window_verdict)
    # Seconds the exporter's accounting gave each verdict class over the window, and the window's seconds.
    accounted: Mapping[str, float] = field(default_factory=dict)
    window_seconds: float = 0.0

    @property
    def sm_clock_hz(self) -> float | None:
        return self.gauges.get(n.SM_CLOCK_HERTZ)


def judge_workload(reading: WorkloadReading, checks: Sequence[Check]) -> list[Outcome]:
    """Both the counter-based mean and the gauge median must lie in each check's band (the counter alone
    where the check says no gauge is exported by default)."""
    if reading.error:
        return [Outcome("workload", reading.name, "-", "runs and is measured", reading.error, False)]
    outcomes = []
    for check in checks:
        rate, gauge = reading.rates.get(check.metric), reading.gauges.get(check.metric)
        holds = check.band.holds(rate) and (not check.gauge or check.band.holds(gauge))
        measured = f"{fmt(rate)} (gauge {fmt(gauge)})" if check.gauge else f"{fmt(rate)} (counter)"
        outcomes.append(
            Outcome("workload", reading.name, check.metric, check.band.text, measured, holds, check.why)
        )
    return outcomes


def window_verdict(
    thresholds: Thresholds, rates: Mapping[str, float | None], gauges: Mapping[str, float | None]
) -> Verdict:
    """smlens' own verdict (smlens.verdicts.judge) on a window's exact means and its memory in use."""
    verdict = judge(thresholds, Means.of(rates, gauges.get(n.MEMORY_USED_BYTES)))
    return Verdict(0.0, verdict.code, verdict.text, verdict.pipe)


# Of a controlled kernel's window, the share its accounting must give its verdict class: the rest is the
# tick on either side of a change, when the tick's ratios straddle it.
ACCOUNTED_SHARE = 0.9
# Real workloads alternate between kernels tick by tick: their share per class is reported, not judged.
REPORTED_ONLY = ("gpt2_train", "gpt2_generate")


def judge_accounting(reading: WorkloadReading, expected: ExpectedVerdict, interval: float) -> list[Outcome]:
    """The accounting counters over the window: the seconds they add up to (the window's, within a tick
    on either side), and the share in the class the workload must get."""
    if reading.error or not reading.window_seconds:
        return []
    total = sum(reading.accounted.values())
    shares = (
        ", ".join(
            f"{code} {seconds / total:.0%}"
            for code, seconds in sorted(reading.accounted.items(), key=lambda i: -i[1])
        )
        if total
        else "none"
    )
    window = reading.window_seconds
    outcomes = [
        Outcome(
            "accounting",
            reading.name,
            "seconds accounted",
            f"{window:.1f} s +/- {2 * interval:g} s",
            f"{total:.2f} s",
            abs(total - window) <= 2 * interval,
            "every tick's seconds land in one class",
        )
    ]
    if expected.code is None or reading.name in REPORTED_ONLY:
        outcomes.append(Outcome("accounting", reading.name, "share by class", "reported", shares, None))
        return outcomes
    share = reading.accounted.get(expected.code, 0.0) / total if total else 0.0
    outcomes.append(
        Outcome(
            "accounting",
            reading.name,
            f"share {expected.code}",
            f">= {ACCOUNTED_SHARE:.0%}",
            shares,
            share >= ACCOUNTED_SHARE,
            "judged tick by tick",
        )
    )
    return outcomes


def judge_verdicts(reading: WorkloadReading, expected: ExpectedVerdict) -> list[Outcome]:
    """The verdict on the window means, then each `smlens check`'s, against ``expected`` (code and pipe).
    A workload whose verdict is only reported gives information rows."""
    if reading.error:
        return [
            Outcome("verdict", reading.name, "-", expected.text, reading.error, expected.holds(None, None))
        ]
    judged = [("judge(window means)", reading.judged)] if reading.judged else []
    checks = [(f"smlens check --duration {v.seconds:g}", v) for v in reading.verdicts]
    if not checks:
        checks = [("smlens check", Verdict(0.0, None, "not run"))]
    return [
        Outcome(
            "verdict",
            reading.name,
            metric,
            expected.text,
            f"{v.shown}: {v.text}" if v.code else v.text,
            expected.holds(v.code, v.pipe),
            expected.why,
        )
        for metric, v in (*judged, *checks)
    ]


@dataclass(frozen=True)
class RawCost:
    """bench/nvml_call_cost.py's figures for one GPU, microseconds."""

    nvml_calls: float  # sum of the nvml backend's every-tick calls
    gpm_calls: float  # sum of the gpm backend's every-tick calls
    slow_per_second: float  # the calls made every few seconds only, per second at the default intervals
    slow: tuple[tuple[str, float, float], ...]  # each slow call: (name, microseconds, every seconds)

    def per_tick(self, interval: float) -> float:
        return self.nvml_calls + self.gpm_calls + self.slow_per_second * interval


def raw_cost(report: Any, gpu: int) -> RawCost | None:
    """From nvml_call_cost.py's --json report; None if the GPU or a figure is not in it."""
    for entry in report.get("gpus", []):
        if entry.get("gpu") == gpu:
            try:
                return RawCost(
                    float(entry["nvml_calls_sum_us"]),
                    float(entry["gpm_calls_sum_us"]),
                    float(entry["nvml_slow_us_per_second"]),
                    tuple(
                        (str(c["call"]), float(c["mean_us"]), float(c["every_s"]))
                        for c in entry["nvml_slow_calls"]
                    ),
                )
            except (KeyError, TypeError, ValueError):
                return None
    return None


def judge_cost(
    run: SamplingCost | None, idle: SamplingCost | None, raw: RawCost | None, interval: float
) -> list[Outcome]:
    """smlens' backend reads per GPU per tick over the whole run against the bare calls they make."""
    if run is None or raw is None:
        why = "no sampling ticks were measured" if run is None else "bench/nvml_call_cost.py gave no figures"
        return [Outcome("cost", "sampling", "reads per GPU per tick", "measured", why, False)]
    bare = raw.per_tick(interval)
    ratio = run.backend_reads_us / bare
    outcomes = [
        Outcome(
            "cost",
            "sampling",
            "backend reads per GPU per tick",
            f"<= {COST_RATIO} x {bare:.0f} us (bare NVML + GPM calls, slow ones amortized)",
            f"{run.backend_reads_us:.0f} us ({ratio:.2f}x) over {run.ticks:.0f} ticks",
            ratio <= COST_RATIO,
            f"bare: {raw.nvml_calls:.0f} us nvml + {raw.gpm_calls:.0f} us gpm per tick, "
            f"+ {raw.slow_per_second * interval:.0f} us per tick of slow calls",
        ),
        Outcome(
            "cost",
            "sampling",
            "sampling CPU per GPU per tick",
            "information (the sampler's thread, waits included, and publishing elsewhere)",
            f"{run.sampler_cpu_us:.0f} us CPU",
            None,
        ),
    ]
    if idle is not None:
        outcomes.append(
            Outcome(
                "cost",
                "sampling",
                "backend reads per GPU per tick, GPU idle",
                "information",
                f"{idle.backend_reads_us:.0f} us over {idle.ticks:.0f} ticks",
                None,
                "a short window: slow calls fall into it 0, 1 or 2 times",
            )
        )
    outcomes += [
        Outcome("cost", "sampling", name, f"every {every:g} s, not per tick", f"{spent:.0f} us a call", None)
        for name, spent, every in raw.slow
    ]
    return outcomes


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def judge_latency(label: str, metrics: Sequence[float], healthy: Sequence[float]) -> Outcome:
    """Seconds per request of /metrics and /-/healthy measured back to back."""
    p50, healthy_p50 = statistics.median(metrics), statistics.median(healthy)
    return Outcome(
        "latency",
        label,
        "/metrics",
        f"median <= {LATENCY_RATIO:g} x /-/healthy median ({healthy_p50 * 1e3:.2f} ms)",
        f"median {p50 * 1e3:.2f} ms, p99 {percentile(metrics, 0.99) * 1e3:.2f} ms ({p50 / healthy_p50:.2f}x)",
        p50 <= LATENCY_RATIO * healthy_p50,
    )


def ncu_outcomes(run: NcuRun, limits: DeviceLimits, smlens: Mapping[str, WorkloadReading]) -> list[Outcome]:
    """ncu's hardware counters against the same bands smlens is held to, with smlens' value beside."""
    if not run.available:
        return [Outcome("ncu", "-", "-", "hardware counters", f"not run: {run.reason}", None)]
    outcomes = []
    for name, truth in run.truths.items():
        bands = {c.metric: c for c in checks_for(name, limits)}
        for key, value in ((n.SM_ACTIVE, truth.sm_active), (n.SM_OCCUPANCY, truth.occupancy)):
            seen = smlens.get(name)
            outcomes.append(
                Outcome(
                    "ncu",
                    name,
                    key,
                    bands[key].band.text,
                    f"{fmt(value)} (smlens {fmt(seen.rates.get(key) if seen else None)})",
                    bands[key].band.holds(value),
                    f"grid {truth.grid}, block {truth.block}",
                )
            )
    return outcomes


def unprivileged_outcomes(run: UnprivilegedRun, root_missing: Mapping[str, str]) -> list[Outcome]:
    if not run.ran:
        return [Outcome("unprivileged", run.user, "-", "exporter serves", f"not run: {run.reason}", None)]
    profiling = run.profiling

    def listed(values: Mapping[str, str]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(values.items())) or "none"

    return [
        Outcome(
            "unprivileged", run.user, "families", "as root", f"{len(run.families)} per-GPU families", None
        ),
        Outcome(
            "unprivileged",
            run.user,
            "lacking vs root",
            "none",
            ", ".join(run.lacking) or "none",
            None,
        ),
        Outcome(
            "unprivileged",
            run.user,
            "profiling (GPM)",
            "available",
            f"available={profiling.get('available')} source={profiling.get('source')} "
            f"{profiling.get('reason') or ''}".strip(),
            None,
        ),
        Outcome(
            "unprivileged",
            run.user,
            "missing values",
            f"as root: {listed(root_missing)}",
            listed(run.missing),
            None,
        ),
    ]


def ncu_pipe_outcomes(
    run: NcuPipeRun, limits: DeviceLimits, smlens: Mapping[str, WorkloadReading]
) -> list[Outcome]:
    """ncu's counters on one launch of each pipe and memory kernel: SM active and occupancy held to the
    launch's bands, the pipe or DRAM ratio smlens measures held to ncu's within NCU_MATCH, and every other
    pipe ratio ncu gave as information."""
    if not run.available:
        return [Outcome("ncu", "pipes", "-", "hardware counters", f"not run: {run.reason}", None)]
    outcomes = []
    if run.reason:
        outcomes.append(Outcome("ncu", "pipes", "-", "every kernel profiled", run.reason, None))
    peak = limits.peak_dram_bytes_per_second
    for name, launch in run.kernels.items():
        seen = smlens.get(name)
        rates = seen.rates if seen else {}
        note = f"{launch.kernel[:60]}, grid {launch.grid}, block {launch.block}"
        if name in NCU_PLACED:
            placed = (
                (n.SM_ACTIVE, launch.sm_active, sm_active_tolerance),
                (n.SM_OCCUPANCY, launch.ratio(WARPS_ACTIVE), occupancy_tolerance),
            )
            for key, value, tolerance in placed:
                mine = rates.get(key)
                allowed = None if value is None else tolerance(value)
                passed = None if allowed is None else mine is not None and abs(mine - value) <= allowed
                expected = "smlens as ncu" if allowed is None else f"smlens within {allowed:.2g} of ncu"
                measured = f"{fmt(value)} (smlens {fmt(mine)})"
                outcomes.append(Outcome("ncu", name, key, expected, measured, passed, note))
        for key, metric in NCU_PAIRS.get(name, ()):
            value, mine = launch.ratio(metric), rates.get(key)
            passed = None if value is None else mine is not None and abs(mine - value) <= NCU_MATCH
            outcomes.append(
                Outcome(
                    "ncu",
                    name,
                    f"{key} vs {metric}",
                    f"smlens within {NCU_MATCH:g} of ncu",
                    f"ncu {fmt(value)}, smlens {fmt(mine)}",
                    passed,
                    note,
                )
            )
        if name == "copy_d2d":
            mine = rates.get(n.DRAM_ACTIVE)
            outcomes.append(
                Outcome(
                    "ncu",
                    name,
                    f"{n.DRAM_ACTIVE} vs {DRAM_THROUGHPUT}",
                    "information: a CuPy copy kernel of the same size stands in for torch's copy_ "
                    "(a driver memcpy, which ncu does not profile)",
                    f"ncu {fmt(launch.ratio(DRAM_THROUGHPUT))}, smlens (torch copy_) {fmt(mine)}",
                    None,
                    note,
                )
            )
        for metric, value in sorted(launch.values.items()):
            if metric.endswith(ELAPSED_PERCENT) and metric != WARPS_ACTIVE:
                outcomes.append(Outcome("ncu", name, metric, "information", fmt(value / 100), None, note))
        moved = launch.dram_bytes_per_second
        if moved is not None and peak:
            outcomes.append(
                Outcome(
                    "ncu",
                    name,
                    "dram__bytes.sum / gpu__time_duration.sum / peak",
                    "information",
                    f"{fmt(moved / peak)} ({moved / 1e12:.2f} TB/s)",
                    None,
                    note,
                )
            )
    return outcomes
