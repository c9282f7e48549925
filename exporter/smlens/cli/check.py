"""``smlens check``: sample this node for a few seconds and say, per GPU, what its SMs really did."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smlens import names as n
from smlens.formatting import percent, reason
from smlens.model import Activity, GpuState, InstanceState, MigInstance, Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.verdicts.judge import Means, Verdict, judge
from smlens.verdicts.thresholds import Thresholds

COLUMNS = (n.UTILIZATION, n.SM_ACTIVE, n.SM_OCCUPANCY, n.TENSOR_ACTIVE, n.DRAM_ACTIVE, n.COMPUTE_SOL)
HEADERS = ("GPU", "model", "util", "SM active", "occupancy", "tensor", "DRAM", "compute SOL", "verdict")
# The window means a verdict is judged on: the columns, and each compute pipe to name the busiest.
JUDGED = tuple(dict.fromkeys((*COLUMNS, *n.COMPUTE_SOL_PIPES)))
Totals = Mapping[str, Activity]


@dataclass(frozen=True)
class InstanceReport:
    """A MIG GPU instance of a GPU, judged on its means over the window and its latest memory in use."""

    gpu_instance: int
    mig_profile: str
    mig_uuids: tuple[str, ...]
    means: dict[str, float | None]
    memory_used_bytes: float | None
    verdict: Verdict


@dataclass(frozen=True)
class GpuReport:
    index: int
    uuid: str
    model: str
    up: bool
    source: str | None
    means: dict[str, float | None]
    verdict: Verdict
    instances: tuple[InstanceReport, ...] = ()


def window_mean(first: Totals, last: Totals, key: str) -> float | None:
    """Exact mean of an activity between two snapshots, from the cumulative integrals."""
    end = last.get(key)
    if end is None:
        return None
    start = first.get(key, Activity(0.0, 0.0))
    return Activity(
        end.active_seconds - start.active_seconds, end.covered_seconds - start.covered_seconds
    ).ratio


def _instances(before: GpuState, after: GpuState, thresholds: Thresholds) -> tuple[InstanceReport, ...]:
    """The instances the GPU has at the end of the window; one created within it counts from zero."""
    started: dict[MigInstance, InstanceState] = {i.instance: i for i in before.instances}
    reports = []
    for state in after.instances:
        first = started.get(state.instance)
        means = {
            key: window_mean({} if first is None else first.activity_totals, state.activity_totals, key)
            for key in JUDGED
        }
        memory = state.gauges.get(n.MEMORY_USED_BYTES)
        verdict = judge(thresholds, Means.of_instance(means, memory))
        info = state.instance
        reports.append(
            InstanceReport(info.gpu_instance, info.profile, info.mig_uuids, means, memory, verdict)
        )
    return tuple(reports)


def report(first: Snapshot, last: Snapshot, thresholds: Thresholds) -> list[GpuReport]:
    reports = []
    for before, after in zip(first.gpus, last.gpus, strict=True):
        means = {key: window_mean(before.activity_totals, after.activity_totals, key) for key in JUDGED}
        memory = after.gauges.get(n.MEMORY_USED_BYTES)
        verdict = (
            judge(thresholds, Means.of(means, memory))
            if after.up
            else Verdict(
                n.VERDICT_DOWN,
                "GPU not readable: " + ", ".join(f"{k}: {reason(v)}" for k, v in after.missing.items()),
            )
        )
        ident = after.identity
        reports.append(
            GpuReport(
                ident.index,
                ident.uuid,
                ident.name,
                after.up,
                after.profiling_source,
                means,
                verdict,
                _instances(before, after, thresholds),
            )
        )
    return reports


def sample(sampler: Sampler, seconds: float) -> tuple[Snapshot, Snapshot]:
    sampler.tick()  # primes the backends that need two samples (GPM, utilization samples)
    first = sampler.tick()
    deadline = time.monotonic() + seconds
    last = first
    while time.monotonic() < deadline:
        time.sleep(min(sampler.interval, max(deadline - time.monotonic(), 0.0)))
        last = sampler.tick()
    return first, last


def matched(reports: list[GpuReport], fail_on: frozenset[str]) -> str | None:
    """One line naming the GPUs and MIG instances whose verdict is in ``fail_on`` (why the command
    exits 3), or None."""
    hits = []
    for r in reports:
        if r.verdict.code in fail_on:
            hits.append(f"GPU {r.index} ({r.verdict.code})")
        hits.extend(
            f"GPU {r.index} MIG instance {i.gpu_instance} {i.mig_profile} ({i.verdict.code})"
            for i in r.instances
            if i.verdict.code in fail_on
        )
    if not hits:
        return None
    return f"smlens check: exit 3: --fail-on {','.join(sorted(fail_on))} matched {', '.join(hits)}."


def render_table(reports: list[GpuReport]) -> str:
    """One row per GPU, then one per MIG instance of it (GPU column "GPU/instance")."""
    rows: list[tuple[str, ...]] = [HEADERS]
    for r in reports:
        rows.append((str(r.index), r.model, *(percent(r.means[k]) for k in COLUMNS), r.verdict.text))
        rows.extend(
            (
                f"{r.index}/{i.gpu_instance}",
                f"  MIG {i.mig_profile}",
                *(percent(i.means[k]) for k in COLUMNS),
                i.verdict.text,
            )
            for i in r.instances
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )


def render_json(hostname: str, seconds: float, reports: list[GpuReport]) -> str:
    payload: dict[str, Any] = {
        "hostname": hostname,
        "window_seconds": seconds,
        "gpus": [
            {
                "index": r.index,
                "uuid": r.uuid,
                "model": r.model,
                "up": r.up,
                "profiling_source": r.source,
                "means": r.means,
                "verdict": r.verdict.as_json(),
                "instances": [
                    {
                        "gpu_instance": i.gpu_instance,
                        "mig_profile": i.mig_profile,
                        "mig_uuids": list(i.mig_uuids),
                        "means": i.means,
                        "memory_used_bytes": i.memory_used_bytes,
                        "verdict": i.verdict.as_json(),
                    }
                    for i in r.instances
                ],
            }
            for r in reports
        ],
    }
    return json.dumps(payload, indent=2)
