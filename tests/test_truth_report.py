"""The truth harness' tables: terminal text and the Markdown of docs/validation.md."""

from __future__ import annotations

from bench.truth.compare import Outcome, Verdict, WorkloadReading
from bench.truth.expect import DeviceLimits
from bench.truth.report import markdown, outcomes_table, summary, table, tally

from smlens import names as n

LIMITS = DeviceLimits("hopper-like", 132, 2048, 1024, 233472, 232448, 1024, 60 << 20, 4.814e12)
OUTCOMES = [
    Outcome("workload", "idle", n.SM_ACTIVE, "<= 0.01", "0 (gauge 0)", True, "no kernel runs"),
    Outcome("verdict", "spin_one_warp", "smlens check --duration 3", "hollow", "idle: idle", False),
    Outcome("ncu", "-", "-", "hardware counters", "not run: ncu | missing", None),
]
READINGS = [
    WorkloadReading(
        "copy_d2d",
        "copy",
        {n.UTILIZATION: 0.99, n.DRAM_ACTIVE: 0.8856},
        {},
        achieved=4.26e12,
        unit="bytes",
        verdicts=(Verdict(3.0, "memory_bound", "x"), Verdict(6.5, None, "failed")),
        judged=Verdict(0.0, "memory_bound", "x"),
    ),
    WorkloadReading("gemm_bf16", "gemm", {}, {}, error="prepare failed: no memory"),
    WorkloadReading(
        "fp32_fma",
        "fma",
        {n.FP32_ACTIVE: 0.93, n.COMPUTE_SOL: 0.93},
        {},
        achieved=55e12,
        unit="flop",
        judged=Verdict(0.0, "compute_bound", "x", "fp32"),
    ),
    WorkloadReading("gpt2_generate", "gpt2", {}, {}, achieved=612.3, unit="tokens"),
]


def test_text_table_aligns_columns() -> None:
    lines = table(["a", "long header"], [["wide cell", "x"], ["y", "z"]], markdown=False).splitlines()
    assert lines == ["a          long header", "wide cell  x", "y          z"]


def test_markdown_table_escapes_pipes() -> None:
    text = table(["h1", "h2"], [["a|b", "c"]], markdown=True)
    assert text.splitlines() == ["| h1 | h2 |", "| --- | --- |", "| a\\|b | c |"]


def test_summary_shows_means_throughput_and_verdicts() -> None:
    rows = summary(READINGS, markdown=False).splitlines()
    assert rows[0].split()[:6] == ["workload", "util", "SM", "active", "occupancy", "tensor"]
    # util, SM active, occupancy, tensor, the eight pipes, DRAM, compute SOL
    means = ["0.99", *["absent"] * 11, "0.8856", "absent"]
    verdicts = ["memory_bound", "memory_bound", "/", "failed"]
    assert rows[1].split() == ["copy_d2d", *means, "4.26", "TB/s", *verdicts]
    assert rows[2].split() == ["gemm_bf16", *["error"] * 14]
    fma = rows[3].split()
    assert fma[10] == "0.93" and fma[14] == "0.93"  # the fp32 pipe and the compute SOL
    assert fma[-4:] == ["55", "TFLOP/s", "compute_bound", "(fp32)"]  # the verdict names the busiest pipe
    assert rows[4].split()[-2:] == ["612.3", "tokens/s"]


def test_outcomes_and_tally() -> None:
    text = outcomes_table(OUTCOMES, markdown=False)
    assert [line.split()[-1] for line in text.splitlines()] == ["result", "PASS", "FAIL", "info"]
    assert "why / note" in outcomes_table(OUTCOMES, markdown=True)
    assert tally(OUTCOMES) == "1 passed, 1 failed, 1 informational"


def test_markdown_document() -> None:
    document = markdown({"gpu": "NVIDIA H200", "driver": "580"}, LIMITS, READINGS, OUTCOMES, "python3 -m x")
    assert document.startswith("Command: `python3 -m x`")
    assert "| gpu | NVIDIA H200 |" in document and "| SMs | 132 |" in document
    assert "| compute capability | unknown |" in document
    assert "| peak DRAM bandwidth (2 x memory clock x bus width) | 4.81 TB/s |" in document
    assert "ncu \\| missing" in document
    assert document.endswith("Result: 1 passed, 1 failed, 1 informational.")
