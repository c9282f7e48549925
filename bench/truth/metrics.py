"""Reading smlens' /metrics: samples of one scrape, exact means between two scrapes, gauge medians."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.truth.expect import SM_ACTIVE_PER_UTILIZATION
from prometheus_client.parser import text_string_to_metric_families

from smlens import names as n


@dataclass(frozen=True)
class Rate:
    """An exact mean: the increase of ``integral`` (the series carrying ``labels``) over that of
    ``covered``, as docs/metrics.md defines them."""

    integral: str
    covered: str
    labels: tuple[tuple[str, str], ...] = ()


PROFILED = f"{n.GPU_PROFILED_SECONDS}_total"
RATES: Mapping[str, Rate] = {
    n.UTILIZATION: Rate("gpu_busy_seconds_total", "gpu_utilization_sampled_seconds_total"),
    n.SM_ACTIVE: Rate("gpu_sm_active_seconds_total", PROFILED),
    n.SM_OCCUPANCY: Rate("gpu_sm_occupancy_seconds_total", PROFILED),
    n.TENSOR_ACTIVE: Rate("gpu_tensor_active_seconds_total", PROFILED),
    n.DRAM_ACTIVE: Rate("gpu_dram_active_seconds_total", PROFILED),
    n.COMPUTE_SOL: Rate(f"{n.GPU_COMPUTE_SOL_SECONDS}_total", PROFILED),
    **{
        key: Rate(f"{n.GPU_PIPE_ACTIVE_SECONDS}_total", PROFILED, ((n.PIPE, pipe),))
        for key, pipe in n.PIPE_LABELS
    },
}
GAUGE_KEYS = (
    n.UTILIZATION,
    n.SM_ACTIVE,
    n.SM_OCCUPANCY,
    n.TENSOR_ACTIVE,
    n.HMMA_ACTIVE,
    n.DRAM_ACTIVE,
    n.FP32_ACTIVE,
)
# Gauges in base units, by Reading.gauges key: the SM clock the compute peaks scale with, and the memory
# in use that tells idle from idle with memory held.
PLAIN_GAUGES: Mapping[str, str] = {
    n.SM_CLOCK_HERTZ: n.GPU_SM_CLOCK_HERTZ,
    n.MEMORY_USED_BYTES: n.GPU_MEMORY_USED_BYTES,
}


def gauge_name(key: str) -> str:
    return f"gpu_{key}_ratio"


Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    """One /metrics response: sample name -> labels -> value, and when it was taken (monotonic)."""

    at: float
    samples: Mapping[str, Mapping[Labels, float]]

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` whose labels include ``labels``; None if there is none."""
        wanted = set(labels.items())
        found = [v for lbl, v in self.samples.get(name, {}).items() if wanted <= lbl]
        return found[0] if len(found) == 1 else None

    def total(self, name: str) -> float | None:
        """Sum of every sample of ``name``; None if there is none."""
        values = self.samples.get(name)
        return sum(values.values()) if values else None

    def largest(self, name: str) -> float | None:
        values = self.samples.get(name)
        return max(values.values()) if values else None

    def families(self, **labels: str) -> set[str]:
        """Names of the samples that have at least one series carrying ``labels``."""
        wanted = set(labels.items())
        return {name for name, series in self.samples.items() if any(wanted <= lbl for lbl in series)}


def parse(text: str, at: float) -> Scrape:
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return Scrape(at, samples)


def _with_derived(means: dict[str, float | None]) -> dict[str, float | None]:
    util, active = means.get(n.UTILIZATION), means.get(n.SM_ACTIVE)
    means[SM_ACTIVE_PER_UTILIZATION] = active / util if util and active is not None else None
    return means


def window_means(first: Scrape, last: Scrape, gpu: str) -> dict[str, float | None]:
    """Exact mean of each activity between two scrapes: increase(integral) / increase(denominator)."""
    means: dict[str, float | None] = {}
    for key, rate in RATES.items():
        labels = dict(rate.labels)
        values = [
            s.value(name, gpu=gpu, **(labels if name == rate.integral else {}))
            for s in (first, last)
            for name in (rate.integral, rate.covered)
        ]
        if any(v is None for v in values):
            means[key] = None
            continue
        a0, c0, a1, c1 = (float(v) for v in values if v is not None)
        means[key] = (a1 - a0) / (c1 - c0) if c1 > c0 else None
    return _with_derived(means)


def seconds_by_verdict(first: Scrape, last: Scrape, gpu: str) -> dict[str, float]:
    """Seconds the GPU's accounting counters (gpu_verdict_seconds_total) added per verdict class between
    two scrapes, over every owner; a class first seen after ``first`` counts from 0."""
    name = f"{n.GPU_VERDICT_SECONDS}_total"
    added: dict[str, float] = {}
    before = first.samples.get(name, {})
    for labels, value in last.samples.get(name, {}).items():
        fields = dict(labels)
        if fields.get(n.GPU) == gpu and not fields.get(n.GPU_INSTANCE):
            verdict = fields[n.VERDICT]
            added[verdict] = added.get(verdict, 0.0) + value - before.get(labels, 0.0)
    return added


def gauge_medians(scrapes: Sequence[Scrape], gpu: str) -> dict[str, float | None]:
    """Median over the scrapes of each ratio gauge (each gauge covers the tick before its scrape), and of
    the plain gauges of PLAIN_GAUGES."""
    names = {**{key: gauge_name(key) for key in GAUGE_KEYS}, **PLAIN_GAUGES}
    medians: dict[str, float | None] = {}
    for key, name in names.items():
        values = [v for s in scrapes if (v := s.value(name, gpu=gpu)) is not None]
        medians[key] = statistics.median(values) if values else None
    return _with_derived(medians)


@dataclass(frozen=True)
class SamplingCost:
    """What smlens spent sampling between two scrapes, per GPU per tick, in microseconds."""

    ticks: float
    backend_reads_us: float  # wall time inside the backends' read() calls
    sampler_cpu_us: float  # sampling CPU: the sampler's thread, waits included, and publishing elsewhere


def sampling_cost(first: Scrape, last: Scrape, gpus: int) -> SamplingCost | None:
    """From smlens' self-metrics; None when there was no tick between the scrapes."""
    names = ("smlens_backend_sample_seconds_total", "smlens_sampler_cpu_seconds_total")
    ticks0, ticks1 = (s.largest("smlens_backend_samples_total") for s in (first, last))
    totals = [(first.total(n), last.total(n)) for n in names]
    if ticks0 is None or ticks1 is None or ticks1 <= ticks0 or gpus < 1:
        return None
    spent = []
    for before, after in totals:
        if before is None or after is None:
            return None
        spent.append((after - before) / (ticks1 - ticks0) / gpus * 1e6)
    return SamplingCost(ticks1 - ticks0, spent[0], spent[1])


def median_gauge(scrapes: Iterable[Scrape], name: str) -> float | None:
    values = [v for s in scrapes if (v := s.total(name)) is not None]
    return statistics.median(values) if values else None
