"""``smlens check``: sample this node for a few seconds and say, per GPU, what its SMs really did."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from smlens import names as n
from smlens.formatting import percent
from smlens.model import Activity, GpuState, Snapshot
from smlens.pipeline.sampler import Sampler
from smlens.verdicts.judge import Verdict, judge
from smlens.verdicts.thresholds import Thresholds

COLUMNS = (n.UTILIZATION, n.SM_ACTIVE, n.SM_OCCUPANCY, n.TENSOR_ACTIVE, n.DRAM_ACTIVE)
HEADERS = ("GPU", "model", "util", "SM active", "occupancy", "tensor", "DRAM", "verdict")


@dataclass(frozen=True)
class GpuReport:
    index: int
    uuid: str
    model: str
    up: bool
    source: str | None
    means: dict[str, float | None]
    verdict: Verdict


def window_mean(first: GpuState, last: GpuState, key: str) -> float | None:
    """Exact mean of an activity between two snapshots, from the cumulative integrals."""
    end = last.activity_totals.get(key)
    if end is None:
        return None
    start = first.activity_totals.get(key, Activity(0.0, 0.0))
    return Activity(
        end.active_seconds - start.active_seconds, end.covered_seconds - start.covered_seconds
    ).ratio


def report(first: Snapshot, last: Snapshot, thresholds: Thresholds) -> list[GpuReport]:
    reports = []
    for before, after in zip(first.gpus, last.gpus, strict=True):
        means = {key: window_mean(before, after, key) for key in COLUMNS}
        verdict = (
            judge(thresholds, *(means[k] for k in COLUMNS))
            if after.up
            else Verdict(
                n.VERDICT_DOWN,
                "GPU not readable: " + ", ".join(f"{k}: {v}" for k, v in after.missing.items()),
            )
        )
        ident = after.identity
        reports.append(
            GpuReport(ident.index, ident.uuid, ident.name, after.up, after.profiling_source, means, verdict)
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
    """One line naming the GPUs whose verdict is in ``fail_on`` (why the command exits 3), or None."""
    hits = [f"GPU {r.index} ({r.verdict.code})" for r in reports if r.verdict.code in fail_on]
    if not hits:
        return None
    return f"smlens check: exit 3: --fail-on {','.join(sorted(fail_on))} matched {', '.join(hits)}."


def render_table(reports: list[GpuReport]) -> str:
    rows = [HEADERS] + [
        (str(r.index), r.model, *(percent(r.means[k]) for k in COLUMNS), r.verdict.text) for r in reports
    ]
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
                "verdict": {"code": r.verdict.code, "text": r.verdict.text},
            }
            for r in reports
        ],
    }
    return json.dumps(payload, indent=2)
