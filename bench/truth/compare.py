"""Judging what was measured against what was expected: one :class:`Outcome` per check."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.truth.expect import Check, DeviceLimits, checks_for
from bench.truth.ground_truth import NcuRun
from bench.truth.metrics import SamplingCost
from bench.truth.unprivileged import UnprivilegedRun

from smlens import names as n

COST_RATIO = 1.25  # smlens' reads may cost at most this much more than the bare NVML/GPM calls
LATENCY_RATIO = 3.0  # /metrics median within this of /-/healthy's (bench/metrics_latency.py's target)


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
    """What one `smlens check --duration seconds` said; ``code`` None when it failed (``text`` says why)."""

    seconds: float
    code: str | None
    text: str


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


def judge_workload(reading: WorkloadReading, checks: Sequence[Check]) -> list[Outcome]:
    """Both the counter-based mean and the gauge median must lie in each check's band."""
    if reading.error:
        return [Outcome("workload", reading.name, "-", "runs and is measured", reading.error, False)]
    outcomes = []
    for check in checks:
        rate, gauge = reading.rates.get(check.metric), reading.gauges.get(check.metric)
        outcomes.append(
            Outcome(
                "workload",
                reading.name,
                check.metric,
                check.band.text,
                f"{fmt(rate)} (gauge {fmt(gauge)})",
                check.band.holds(rate) and check.band.holds(gauge),
                check.why,
            )
        )
    return outcomes


def judge_verdicts(reading: WorkloadReading, expected: str) -> list[Outcome]:
    if not reading.verdicts:
        return [Outcome("verdict", reading.name, "smlens check", expected, "not run", False)]
    return [
        Outcome(
            "verdict",
            reading.name,
            f"smlens check --duration {v.seconds:g}",
            expected,
            f"{v.code}: {v.text}" if v.code else v.text,
            v.code == expected,
        )
        for v in reading.verdicts
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
