"""The summary of a capture: what the terminal prints, ``--json`` writes and the report shows."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from smlens import names as n
from smlens.formatting import percent
from smlens.profile import analysis
from smlens.profile.counters import PIPE_RATIOS
from smlens.profile.recording import Recording
from smlens.verdicts.thresholds import Thresholds


def summarize(recording: Recording, t: Thresholds) -> dict[str, Any]:
    s = analysis.series(recording)
    seconds = float(s.seconds.sum())
    means = {
        key: (float(np.average(s.ratio(key), weights=s.seconds)) if seconds > 0 else None)
        for key in s.ratio_keys()
    }
    period = analysis.step_period(s)
    step: dict[str, Any] | None = None
    if period is not None:
        step = {**asdict(period), "breakdown": asdict(analysis.breakdown(s, period, t))}
    span = (int(s.start_ns[-1]) - int(s.start_ns[0])) / 1e9 + float(s.seconds[-1]) if len(s) else 0.0
    return {
        "gpu": dict(recording.gpu),
        "chip": recording.chip,
        "samples": len(s),
        "interval_us": recording.interval_ns / 1000,
        "span_s": span,
        "sampled_s": seconds,
        "means": means,
        "hollow_threshold": t.hollow_sm_active,
        "busy_threshold": t.busy_utilization,
        "hollow_share_of_busy": analysis.hollow_share(s, t),
        "sm_activity_of_busy_time": [
            {"low": lo, "high": hi, "share_of_busy": share}
            for lo, hi, share in analysis.activity_histogram(s)
        ],
        "step": step,
        "peaks": dict(recording.peaks),
        "decode": dict(recording.notes),
    }


# the pipe ratios' titles, short enough for the summary's column of labels
_SHORT = {n.FP32_ACTIVE: "FP32 (FMA) pipes", n.FP64_ACTIVE: "FP64 pipe", n.INTEGER_ACTIVE: "integer (ALU)"}


def _rule(summary: dict[str, Any]) -> str:
    return f"samples busy >= {summary['busy_threshold']:g} with SM active <= {summary['hollow_threshold']:g}"


def render_text(summary: dict[str, Any]) -> str:
    gpu = summary["gpu"]
    means = summary["means"]

    def column(ratio: float | None) -> str:  # right-aligned, so that the values line up
        return percent(ratio, width=5, sep=" ")

    lines = [
        f"GPU {gpu.get('index', '?')} {gpu.get('name', '')} {gpu.get('uuid', '')}".rstrip(),
        f"  {summary['samples']} samples every {summary['interval_us']:g} us over {summary['span_s']:.2f} s",
        f"  kernel running   {column(means['busy'])}   (NVML 'utilization' counts this)",
        f"  SM active        {column(means['sm_active'])}",
        f"  SM occupancy     {column(means['occupancy'])}",
        f"  tensor pipes     {column(means['tensor'])}",
        f"  DRAM bandwidth   {column(means['dram'])}",
        *(f"  {_SHORT[r.key]:<16} {column(means[r.key])}" for r in PIPE_RATIOS if r.key in means),
        f"  hollow share of busy time {column(summary['hollow_share_of_busy'])}   ({_rule(summary)})",
    ]
    step = summary["step"]
    if step is None:
        lines.append("  no repeating step detected")
    else:
        b = step["breakdown"]
        lines.append(
            f"  step period {1e3 * step['seconds']:.2f} ms ({step['repeats']} steps, autocorrelation "
            f"{step['strength']:.2f}): {step_times(b)}"
        )
    return "\n".join(lines)


# The classes of a typical step in the order the summary names them; unknown only when some time is.
STEP_ORDER = (
    analysis.CLASS_NAMES[analysis.COMPUTE_BOUND],
    analysis.CLASS_NAMES[analysis.MEMORY_BOUND],
    analysis.CLASS_NAMES[analysis.STALLED],
    analysis.CLASS_NAMES[analysis.HOLLOW],
    analysis.CLASS_NAMES[analysis.PARTIAL],
    analysis.CLASS_NAMES[analysis.IDLE],
    analysis.CLASS_NAMES[analysis.UNKNOWN],
)


def step_times(breakdown: dict[str, Any]) -> str:
    """``compute-bound 12.00 ms, memory-bound ...`` for a breakdown as ``asdict`` gives it."""
    return ", ".join(
        f"{kind.replace('_', '-')} {1e3 * breakdown[f'{kind}_s']:.2f} ms"
        for kind in STEP_ORDER
        if kind != analysis.CLASS_NAMES[analysis.UNKNOWN] or breakdown[f"{kind}_s"] > 0
    )
