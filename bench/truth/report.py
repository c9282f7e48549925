"""The harness' tables: plain text for the terminal, Markdown for docs/validation.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.truth.compare import Outcome, WorkloadReading, fmt
from bench.truth.expect import DeviceLimits

from smlens import names as n

SUMMARY_COLUMNS = (
    (n.UTILIZATION, "util"),
    (n.SM_ACTIVE, "SM active"),
    (n.SM_OCCUPANCY, "occupancy"),
    (n.TENSOR_ACTIVE, "tensor"),
    *((key, pipe) for key, pipe in n.PIPE_LABELS),
    (n.DRAM_ACTIVE, "DRAM"),
    (n.COMPUTE_SOL, "compute SOL"),
)
SUMMARY_KEYS = tuple(key for key, _ in SUMMARY_COLUMNS)
ENVIRONMENT_KEYS = (
    "date",
    "gpu",
    "uuid",
    "driver",
    "nvml",
    "gpm_supported",
    "kernel",
    "cuda_runtime",
    "python",
    "torch",
    "cupy",
    "nvidia_ml_py",
    "smlens",
    "ncu",
    "user",
)


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = [headers, ["---"] * len(headers), *rows]
        return "\n".join("| " + " | ".join(_escape(c) for c in line) + " |" for line in lines)
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (headers, *rows)
    )


def _throughput(reading: WorkloadReading) -> str:
    if reading.achieved is None or not reading.unit:
        return ""
    if reading.unit == "tokens":
        return f"{reading.achieved:.4g} tokens/s"
    scale = "TB/s" if reading.unit == "bytes" else "TFLOP/s"
    return f"{reading.achieved / 1e12:.3g} {scale}"


def summary(readings: Sequence[WorkloadReading], markdown: bool) -> str:
    """What smlens read per workload: exact window means from its counters, the verdict on them
    (smlens.verdicts.judge) and that of each `smlens check`."""
    headers = [
        "workload",
        *(title for _, title in SUMMARY_COLUMNS),
        "workload's own rate",
        "verdict",
        "smlens check",
    ]
    rows = [
        [
            r.name,
            *(("error" if r.error else fmt(r.rates.get(k))) for k in SUMMARY_KEYS),
            _throughput(r),
            r.judged.shown if r.judged else "",
            " / ".join(v.shown for v in r.verdicts),
        ]
        for r in readings
    ]
    return table(headers, rows, markdown)


def outcomes_table(outcomes: Sequence[Outcome], markdown: bool) -> str:
    headers = ["section", "subject", "metric", "expected", "measured", "result"]
    rows = [[o.section, o.subject, o.metric, o.expected, o.measured, o.status] for o in outcomes]
    if markdown:
        headers.append("why / note")
        for row, outcome in zip(rows, outcomes, strict=True):
            row.append(outcome.note)
    return table(headers, rows, markdown)


def tally(outcomes: Sequence[Outcome]) -> str:
    passed = sum(o.passed is True for o in outcomes)
    failed = sum(o.passed is False for o in outcomes)
    return f"{passed} passed, {failed} failed, {len(outcomes) - passed - failed} informational"


def markdown(
    environment: Mapping[str, Any],
    limits: DeviceLimits,
    readings: Sequence[WorkloadReading],
    outcomes: Sequence[Outcome],
    command: str,
) -> str:
    """The generated part of docs/validation.md."""
    facts = [[key, str(environment.get(key, ""))] for key in ENVIRONMENT_KEYS]
    peak = limits.peak_dram_bytes_per_second
    derived = [
        ["SMs", str(limits.sm_count)],
        [
            "compute capability",
            ".".join(map(str, limits.compute_capability)) if limits.compute_capability else "unknown",
        ],
        ["max warps per SM", str(limits.max_warps_per_sm)],
        ["max threads per block", str(limits.max_threads_per_block)],
        [
            "shared memory per SM / per block (opt-in)",
            f"{limits.max_shared_per_sm} / {limits.max_shared_per_block_optin} B",
        ],
        ["L2", f"{limits.l2_bytes / 2**20:.0f} MiB"],
        [
            "peak DRAM bandwidth (2 x memory clock x bus width)",
            "unknown" if peak is None else f"{peak / 1e12:.2f} TB/s",
        ],
    ]
    return "\n\n".join(
        [
            f"Command: `{command}`",
            table(["", "environment"], facts, markdown=True),
            "Device limits the expectations derive from:\n\n" + table(["", "value"], derived, markdown=True),
            "What smlens read (exact means over each window, from its counters):\n\n"
            + summary(readings, markdown=True),
            "Checks:\n\n" + outcomes_table(outcomes, markdown=True),
            f"Result: {tally(outcomes)}.",
        ]
    )
