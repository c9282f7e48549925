"""The truth harness' reading of /metrics: parsing, exact window means, gauge medians, sampling cost."""

from __future__ import annotations

import math

import pytest
from bench.truth.expect import SM_ACTIVE_PER_UTILIZATION
from bench.truth.metrics import Scrape, gauge_medians, parse, sampling_cost, window_means
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from smlens import names as n


def exposition(
    busy: float,
    sampled: float,
    sm_active: float,
    profiled: float,
    gauges: dict[str, float],
    reads: dict[str, float] | None = None,
    ticks: float = 0,
    cpu: float = 0.0,
) -> str:
    """An exposition with smlens' names for two GPUs (GPU 1 holds other values), from its own registry."""
    registry = CollectorRegistry()
    labels = ["gpu", "uuid", "hostname"]

    def counter(name: str, values: dict[str, float]) -> None:
        family = Counter(name.removesuffix("_total"), "test", labels, registry=registry)
        for gpu, value in values.items():
            family.labels(gpu, f"GPU-{gpu}", "node").inc(value)

    counter("gpu_busy_seconds_total", {"0": busy, "1": 5.0})
    counter("gpu_utilization_sampled_seconds_total", {"0": sampled, "1": 10.0})
    counter("gpu_sm_active_seconds_total", {"0": sm_active, "1": 1.0})
    counter("gpu_profiled_seconds_total", {"0": profiled, "1": 10.0})
    for key, value in gauges.items():
        name = key if key.startswith("gpu_") else f"gpu_{key}_ratio"
        Gauge(name, "test", labels, registry=registry).labels("0", "GPU-0", "node").set(value)
    backend = Counter("smlens_backend_sample_seconds", "test", ["backend"], registry=registry)
    samples = Counter("smlens_backend_samples", "test", ["backend"], registry=registry)
    for name, spent in (reads or {}).items():
        backend.labels(name).inc(spent)
        samples.labels(name).inc(ticks)
    Counter("smlens_sampler_cpu_seconds", "test", registry=registry).inc(cpu)
    return generate_latest(registry).decode()


def test_window_means_are_increase_over_increase() -> None:
    first = parse(exposition(busy=10.0, sampled=20.0, sm_active=1.0, profiled=20.0, gauges={}), at=0.0)
    last = parse(exposition(busy=19.9, sampled=30.0, sm_active=1.075, profiled=30.0, gauges={}), at=10.0)
    means = window_means(first, last, "0")
    assert means[n.UTILIZATION] == pytest.approx(0.99)
    assert means[n.SM_ACTIVE] == pytest.approx(0.0075)
    assert means[SM_ACTIVE_PER_UTILIZATION] == pytest.approx(0.0075 / 0.99)
    assert means[n.DRAM_ACTIVE] is None  # not exposed: absent, not 0
    assert window_means(first, first, "0")[n.UTILIZATION] is None  # nothing covered in between
    assert window_means(first, last, "7")[n.SM_ACTIVE] is None  # no such GPU


def test_a_nan_counter_reads_as_nan_so_the_check_fails() -> None:
    first = parse(exposition(1.0, 2.0, math.nan, 2.0, {}), at=0.0)
    last = parse(exposition(2.0, 3.0, math.nan, 3.0, {}), at=1.0)
    assert math.isnan(window_means(first, last, "0")[n.SM_ACTIVE] or 0.0)


def test_gauge_medians_per_gpu() -> None:
    scrapes = [
        parse(exposition(0, 0, 0, 0, {n.SM_ACTIVE: value, n.UTILIZATION: 1.0}), at=float(i))
        for i, value in enumerate((0.2, 0.9, 0.5))
    ]
    medians = gauge_medians(scrapes, "0")
    assert medians[n.SM_ACTIVE] == 0.5 and medians[n.UTILIZATION] == 1.0
    assert medians[SM_ACTIVE_PER_UTILIZATION] == 0.5
    assert medians[n.TENSOR_ACTIVE] is None
    assert gauge_medians(scrapes, "1")[n.SM_ACTIVE] is None


def test_scrape_lookups() -> None:
    scrape = parse(exposition(1, 2, 3, 4, {n.SM_ACTIVE: 0.5}), at=3.0)
    assert scrape.at == 3.0
    assert scrape.value("gpu_busy_seconds_total", gpu="1") == 5.0
    assert scrape.value("gpu_busy_seconds_total") is None  # two series match: ambiguous
    assert scrape.total("gpu_busy_seconds_total") == 6.0
    assert "gpu_sm_active_ratio" in scrape.families(gpu="0")
    assert "gpu_sm_active_ratio" not in scrape.families(gpu="1")
    assert Scrape(0.0, {}).total("gpu_busy_seconds_total") is None


def test_sampling_cost_per_gpu_per_tick() -> None:
    first = parse(exposition(0, 0, 0, 0, {}, reads={"nvml": 1.0, "gpm": 0.5}, ticks=100, cpu=2.0), at=0.0)
    last = parse(exposition(0, 0, 0, 0, {}, reads={"nvml": 1.5, "gpm": 0.7}, ticks=200, cpu=2.6), at=1.0)
    cost = sampling_cost(first, last, gpus=2)
    assert cost is not None
    assert cost.ticks == 100
    assert cost.backend_reads_us == pytest.approx((0.5 + 0.2) / 100 / 2 * 1e6)
    assert cost.sampler_cpu_us == pytest.approx(0.6 / 100 / 2 * 1e6)
    assert sampling_cost(first, first, gpus=2) is None  # no tick in between


def pipes_exposition(fp32: float, integer: float, sol: float, profiled: float) -> str:
    """smlens' pipe and compute SOL counters for GPU 0 (GPU 1 holds other values)."""
    registry = CollectorRegistry()
    labels = ["gpu", "uuid", "hostname"]
    pipes = Counter("gpu_pipe_active_seconds", "test", [*labels, "pipe"], registry=registry)
    for gpu, scale in (("0", 1.0), ("1", 0.5)):
        pipes.labels(gpu, f"GPU-{gpu}", "node", "fp32").inc(fp32 * scale)
        pipes.labels(gpu, f"GPU-{gpu}", "node", "integer").inc(integer * scale)
    Counter("gpu_compute_sol_seconds", "test", labels, registry=registry).labels("0", "GPU-0", "node").inc(
        sol
    )
    covered = Counter("gpu_profiled_seconds", "test", labels, registry=registry)
    covered.labels("0", "GPU-0", "node").inc(profiled)
    covered.labels("1", "GPU-1", "node").inc(profiled)
    return generate_latest(registry).decode()


def test_pipe_and_compute_sol_means_from_their_counters() -> None:
    first = parse(pipes_exposition(fp32=1.0, integer=0.1, sol=1.0, profiled=10.0), at=0.0)
    last = parse(pipes_exposition(fp32=10.0, integer=0.6, sol=10.1, profiled=20.0), at=10.0)
    means = window_means(first, last, "0")
    assert means[n.FP32_ACTIVE] == pytest.approx(0.9)
    assert means[n.INTEGER_ACTIVE] == pytest.approx(0.05)
    assert means[n.COMPUTE_SOL] == pytest.approx(0.91)
    assert means[n.HMMA_ACTIVE] is None  # a pipe the source does not report: absent
    assert window_means(first, last, "1")[n.FP32_ACTIVE] == pytest.approx(0.45)
    assert window_means(first, last, "1")[n.COMPUTE_SOL] is None


def test_plain_gauges_beside_the_ratios() -> None:
    scrapes = [
        parse(exposition(0, 0, 0, 0, {n.GPU_SM_CLOCK_HERTZ: hz, n.GPU_MEMORY_USED_BYTES: 2e9}), at=float(i))
        for i, hz in enumerate((1.98e9, 1.5e9, 1.755e9))
    ]
    medians = gauge_medians(scrapes, "0")
    assert medians[n.SM_CLOCK_HERTZ] == 1.755e9 and medians[n.MEMORY_USED_BYTES] == 2e9
