"""`smlens profile` judges each sample with the exporter's verdict (smlens.verdicts.judge): its typical step
says how long it was compute-bound (and on which pipe), memory-bound or stalled, besides hollow, partial
and idle. The capture below is built from raw counters, with peaks other than 1, so that every ratio goes
through the normalisation a real capture does; each expected duration is counted by hand from its phases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smlens import names as n
from smlens.profile import analysis
from smlens.profile.counters import (
    COUNTERS,
    CUPTI_ALU_ACTIVE,
    CUPTI_DRAM_BYTES,
    CUPTI_DRAM_ELAPSED,
    CUPTI_FMA_ACTIVE,
    CUPTI_FP64_ACTIVE,
    CUPTI_GR_ACTIVE,
    CUPTI_GR_ELAPSED,
    CUPTI_SM_ACTIVE,
    CUPTI_SM_ELAPSED,
    CUPTI_TENSOR_ACTIVE,
    CUPTI_WARPS_ACTIVE,
    PEAK_OF,
    PIPE_COUNTERS,
)
from smlens.profile.recording import Recording, RecordingError
from smlens.profile.report import render_html
from smlens.profile.summary import render_text, summarize
from smlens.verdicts import thresholds
from smlens.verdicts.judge import Means, judge

RULE = thresholds.load()  # busy 0.8, hollow 0.3, idle 0.05, working 0.8, memory 0.8, compute 0.6
SAMPLE_NS = 100_000
SM_CYCLES, DRAM_CYCLES = 198_000.0, 320_000.0  # elapsed per 100 us sample (1.98 and 3.2 GHz)
PEAKS = {  # per elapsed cycle; GH100-like, none 1, so that a counter read as a ratio would be wrong
    CUPTI_SM_ACTIVE: 1.0,
    CUPTI_WARPS_ACTIVE: 64.0,
    CUPTI_TENSOR_ACTIVE: 4.0,
    CUPTI_DRAM_BYTES: 1504.0,
    CUPTI_GR_ACTIVE: 1.0,
    CUPTI_FMA_ACTIVE: 8.0,
    CUPTI_FP64_ACTIVE: 4.0,
    CUPTI_ALU_ACTIVE: 4.0,
}
RATIO_OF = {  # phase ratio -> its counter and that counter's elapsed cycles
    "busy": (CUPTI_GR_ACTIVE, SM_CYCLES),
    "sm": (CUPTI_SM_ACTIVE, SM_CYCLES),
    "occupancy": (CUPTI_WARPS_ACTIVE, SM_CYCLES),
    "tensor": (CUPTI_TENSOR_ACTIVE, SM_CYCLES),
    "dram": (CUPTI_DRAM_BYTES, DRAM_CYCLES),
    "fma": (CUPTI_FMA_ACTIVE, SM_CYCLES),
    "fp64": (CUPTI_FP64_ACTIVE, SM_CYCLES),
    "alu": (CUPTI_ALU_ACTIVE, SM_CYCLES),
}
# One step: (samples of 100 us, what the verdict must call it, busiest pipe, ratios). The stalled phase has
# every pipe at 0.5 and DRAM at 0.5: busy, but nothing near its peak.
STEP = [
    (25, "compute_bound", "fp32", {"busy": 1, "sm": 0.95, "occupancy": 0.5, "fma": 0.9, "alu": 0.3}),
    (15, "memory_bound", None, {"busy": 1, "sm": 0.9, "occupancy": 0.8, "dram": 0.85, "alu": 0.1}),
    (20, "stalled", None, {"busy": 1, "sm": 0.98, "occupancy": 0.03, "dram": 0.5, "fma": 0.5, "alu": 0.5}),
    (10, "compute_bound", "fp64", {"busy": 1, "sm": 0.99, "occupancy": 0.25, "fp64": 0.7, "fma": 0.2}),
    (10, "hollow", None, {"busy": 1, "sm": 0.1, "occupancy": 0.001}),
    (10, "partial", None, {"busy": 0.4, "sm": 0.3, "occupancy": 0.1, "tensor": 0.1}),
    (10, "idle", None, {}),
]
STEPS = 12


def build(
    step: list[tuple[int, str, str | None, dict[str, float]]], counters: tuple[str, ...], steps: int = STEPS
) -> Recording:
    rows: list[list[float]] = []
    for _ in range(steps):
        for samples, _, _, ratios in step:
            row = {CUPTI_SM_ELAPSED: SM_CYCLES, CUPTI_GR_ELAPSED: SM_CYCLES, CUPTI_DRAM_ELAPSED: DRAM_CYCLES}
            for key, (counter, elapsed) in RATIO_OF.items():
                row[counter] = ratios.get(key, 0.0) * elapsed * PEAKS[counter]
            rows += [[row[c] for c in counters]] * samples
    count = len(rows)
    start = 5_000_000_000 + np.arange(count, dtype=np.int64) * SAMPLE_NS
    peaks = {c: PEAKS[c] for c in PEAK_OF if c in counters}
    return Recording(
        {"index": 0}, "GH100", SAMPLE_NS, counters, peaks, start, start + SAMPLE_NS, np.array(rows)
    )


def test_typical_step_says_how_long_it_was_compute_bound_memory_bound_or_stalled() -> None:
    """Per step of 10 ms: compute-bound 2.5 ms on FP32 (FMA 0.9) plus 1.0 ms on FP64 (0.7) = 3.5 ms;
    memory-bound 1.5 ms (DRAM 0.85); stalled 2.0 ms (SMs 0.98 active, every pipe and DRAM at 0.5); hollow,
    partial and idle 1.0 ms each. The step starts where its idle stretch ends: at the FP32 phase."""
    s = analysis.series(build(STEP, COUNTERS))
    period = analysis.step_period(s)
    assert period is not None and period.samples == pytest.approx(100, abs=0.5)
    step = analysis.breakdown(s, period, RULE)
    expected = {
        "compute_bound": 3.5e-3,
        "memory_bound": 1.5e-3,
        "stalled": 2.0e-3,
        "hollow": 1.0e-3,
        "partial": 1.0e-3,
        "idle": 1.0e-3,
        "unknown": 0.0,
    }
    assert {kind: step.seconds(kind) for kind in analysis.CLASS_NAMES} == pytest.approx(expected)
    assert step.period_s == pytest.approx(10e-3)
    stretches = [(x.kind, round(x.start_s * 1e4), round(x.seconds * 1e4), x.pipe) for x in step.stretches]
    assert stretches == [
        ("compute_bound", 0, 25, "fp32"),
        ("memory_bound", 25, 15, None),
        ("stalled", 40, 20, None),
        ("compute_bound", 60, 10, "fp64"),
        ("hollow", 70, 10, None),
        ("partial", 80, 10, None),
        ("idle", 90, 10, None),
    ]
    memory = next(x for x in step.stretches if x.kind == "memory_bound")
    assert memory.dram == pytest.approx(0.85)


def test_every_sample_gets_the_exporters_verdict() -> None:
    """Each sample's class is its phase's (hand-given) verdict; the hollow share is the hollow phase's 10
    busy samples over the 80 busy ones plus the partial phase's 10 at 0.4."""
    s = analysis.series(build(STEP, COUNTERS))
    classes = [analysis.CLASS_NAMES[c] for c in analysis.classify(s, RULE)]
    expected = [kind for samples, kind, _, _ in STEP for _ in range(samples)] * STEPS
    assert classes == expected
    assert analysis.hollow_share(s, RULE) == pytest.approx(10 / (80 + 0.4 * 10))


def test_grouped_verdicts_equal_one_judge_call_per_sample() -> None:
    """Random ratios, a third of them exactly on a threshold, where < and <= differ."""
    rng = np.random.default_rng(3)
    count = 5000
    edges = np.array([0.05, 0.3, 0.6, 0.8, 0.05, 0.8])

    def draw() -> np.ndarray:
        values = rng.random(count)
        on = rng.random(count) < 0.33
        values[on] = rng.choice(edges, on.sum())
        return values

    s = analysis.Series(
        start_ns=np.arange(count, dtype=np.int64) * SAMPLE_NS,
        seconds=np.full(count, 1e-4),
        busy=draw(),
        sm_active=draw(),
        occupancy=draw() / 4,
        tensor=draw(),
        dram=draw(),
        pipes={n.FP32_ACTIVE: draw(), n.FP64_ACTIVE: draw() / 2, n.INTEGER_ACTIVE: draw()},
    )
    grouped = analysis.classify(s, RULE)
    one_by_one = []
    for i in range(count):
        pipes = {
            n.TENSOR_ACTIVE: float(s.tensor[i]),
            **{key: float(values[i]) for key, values in s.pipes.items()},
        }
        means = Means(
            float(s.busy[i]),
            float(s.sm_active[i]),
            float(s.occupancy[i]),
            float(s.dram[i]),
            max(pipes.values()),
            pipes,
            False,
        )
        one_by_one.append(judge(RULE, means).code)
    assert [analysis.CLASS_NAMES[c] for c in grouped] == one_by_one
    assert len(set(one_by_one)) == 6  # idle, partial, hollow, stalled, memory_bound, compute_bound


def test_a_recording_without_the_pipe_counters_still_loads_and_says_unknown() -> None:
    """A recording made before the FMA, FP64 and ALU counters: the tensor pipe near its peak is still
    compute-bound and DRAM near its peak memory-bound; but SMs active with tensor low could be limited by
    a pipe it lacks, so the stalled and the FP32 and FP64 phases are unknown, never stalled."""
    old = tuple(c for c in COUNTERS if c not in PIPE_COUNTERS)
    gemm = (10, "compute_bound", "tensor", {"busy": 1, "sm": 0.97, "occupancy": 0.14, "tensor": 0.93})
    recording = Recording.from_json(json.loads(json.dumps(build([*STEP, gemm], old).to_json())))
    s = analysis.series(recording)
    assert not s.pipes
    classes = [analysis.CLASS_NAMES[c] for c in analysis.classify(s, RULE)]
    unknown = {"compute_bound": "unknown", "stalled": "unknown"}
    first = [
        (unknown.get(kind, kind) if pipe != "tensor" else kind)
        for samples, kind, pipe, _ in [*STEP, gemm]
        for _ in range(samples)
    ]
    assert classes[: len(first)] == first
    with_pipes = build(STEP, COUNTERS).to_json()
    del with_pipes["peaks"][CUPTI_FMA_ACTIVE]
    with pytest.raises(RecordingError, match=r"lacks sm__pipe_fma_cycles_active\.avg"):
        Recording.from_json(with_pipes)


def test_summary_and_report_name_the_new_classes() -> None:
    recording = build(STEP, COUNTERS)
    summary = summarize(recording, RULE)
    assert summary["means"][n.FP32_ACTIVE] == pytest.approx((25 * 0.9 + 20 * 0.5 + 10 * 0.2) / 100)
    text = render_text(summary)
    assert (
        "compute-bound 3.50 ms, memory-bound 1.50 ms, stalled 2.00 ms, hollow 1.00 ms, partial 1.00 ms, "
        "idle 1.00 ms" in text
    )
    assert "unknown" not in text
    assert "  FP64 pipe          7.0 %" in text  # 10 of 100 samples at 0.7, in the column of the others
    page = render_html(recording, summary)
    assert "compute_bound (fp32)" in page and "compute_bound (fp64)" in page
    assert "compute_bound: a compute pipe near its peak" in page  # the legend
    assert "stalled: SMs active, neither a pipe nor DRAM near its peak" in page
    assert "working" not in page


def test_steps_of_varying_length_are_each_placed_before_their_median_is_taken() -> None:
    """A training loop on the H200 (bench/truth/profile_verdicts.py): a host gap of about 4 ms whose length
    varies from step to step, a memory-bound pass, the bf16 forward and backward. Its step period was
    108.35 samples at 100 us over 283 steps, and folding at that period (or its rounding, 108) mixed the
    phases: compute-bound 0.7 ms where each step held 2.2. Here 300 steps of 3 ms memory-bound and 3 ms
    compute-bound (tensor) after an idle gap of 40 +/- 4 samples: the typical step holds the phases' own
    lengths, and its idle gap is the gaps' median (40 samples)."""
    rng = np.random.default_rng(7)
    gaps = 40 + rng.integers(-4, 5, 300)
    phases = {
        "memory_bound": {"busy": 1, "sm": 0.99, "occupancy": 0.85, "dram": 0.88},
        "compute_bound": {"busy": 1, "sm": 0.97, "occupancy": 0.3, "tensor": 0.85, "dram": 0.25},
    }
    step: list[tuple[int, str, str | None, dict[str, float]]] = []
    for gap in gaps:
        step += [(int(gap), "idle", None, {}), (30, "memory_bound", None, phases["memory_bound"])]
        step.append((30, "compute_bound", "tensor", phases["compute_bound"]))
    recording = build(step, COUNTERS, steps=1)
    s = analysis.series(recording)
    period = analysis.step_period(s)
    assert period is not None and period.samples == pytest.approx(100, abs=1)
    b = analysis.breakdown(s, period, RULE)
    assert b.steps >= 295
    assert (b.memory_bound_s, b.compute_bound_s) == (pytest.approx(3e-3), pytest.approx(3e-3))
    assert b.idle_s == pytest.approx(float(np.median(gaps)) * 1e-4, abs=1.5e-4)
    assert [x.kind for x in b.stretches] == ["memory_bound", "compute_bound", "idle"]
