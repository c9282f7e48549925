"""Parsing Nsight Compute's CSV (a real ncu 2025.3 run on an H200, trimmed to three launches)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.truth.ground_truth import (
    ALWAYS_METRICS,
    DRAM_THROUGHPUT,
    DURATION,
    ELAPSED_PERCENT,
    FMA_PIPE,
    assign,
    listed_metrics,
    parse_csv,
    parse_launches,
    pipe_metrics,
)

TEXT = (Path(__file__).parent / "fixtures" / "truth" / "ncu_spin.csv").read_text()


def test_one_truth_per_launch_in_launch_order() -> None:
    one, half, per_sm = parse_csv(TEXT, "smlens_truth_spin")
    assert (one.grid, one.block) == ("(1, 1, 1)", "(32, 1, 1)")
    assert one.sm_active == pytest.approx(74912.78 / 9897095.06)  # thousands separators removed
    assert one.occupancy == pytest.approx(0.0001)
    assert half.grid == "(66, 1, 1)" and half.occupancy == pytest.approx(0.2499)
    assert half.sm_active == pytest.approx(4949593.58 / 9901904.68)
    assert per_sm.grid == "(132, 1, 1)" and per_sm.sm_active == pytest.approx(0.99975, abs=1e-5)


def test_other_kernels_are_ignored() -> None:
    assert parse_csv(TEXT, "some_other_kernel") == []


def test_a_missing_metric_is_an_error() -> None:
    without = "\n".join(line for line in TEXT.splitlines() if "sm__cycles_elapsed" not in line)
    with pytest.raises(ValueError, match=r"sm__cycles_elapsed\.avg"):
        parse_csv(without, "smlens_truth_spin")


# ncu --csv --print-units base of the pipe run, in its shape: one row per launch and metric.
HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
)
HEADER += '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'


def row(launch: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return (
        f'"{launch}","9","python3","127.0.0.1","{kernel}","1","7","(512, 1, 1)","(528, 1, 1)","0","9.0",'
        f'"Command line profiler metrics","{metric}","{unit}","{value}"'
    )


PIPE_CSV = "\n".join(
    [
        "==PROF== Connected to process 9",
        HEADER,
        row(0, "smlens_truth_fma", FMA_PIPE, "%", "91.25"),
        row(0, "smlens_truth_fma", DURATION, "nsecond", "10,020,512"),
        row(1, "smlens_truth_chase", DRAM_THROUGHPUT, "%", "44.10"),
        row(1, "smlens_truth_chase", "sm__pipe_fp16_cycles_active" + ELAPSED_PERCENT, "%", "n/a"),
        row(2, "smlens_truth_copy", DRAM_THROUGHPUT, "%", "88.6"),
        row(3, "void splitKreduce_kernel<float>", DURATION, "nsecond", "9,000"),
        row(4, "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", DURATION, "nsecond", "1,460,000"),
        row(
            4,
            "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
            "sm__pipe_tensor_cycles_active" + ELAPSED_PERCENT,
            "%",
            "91",
        ),
    ]
)


def test_every_launch_and_its_numeric_values_in_launch_order() -> None:
    launches = parse_launches(PIPE_CSV)
    assert [launch.kernel for launch in launches][:3] == [
        "smlens_truth_fma",
        "smlens_truth_chase",
        "smlens_truth_copy",
    ]
    fma = launches[0]
    assert fma.values == {FMA_PIPE: 91.25, DURATION: 10020512.0}  # thousands separators removed
    assert fma.ratio(FMA_PIPE) == 0.9125 and fma.ratio(DRAM_THROUGHPUT) is None
    assert (fma.grid, fma.block) == ("(528, 1, 1)", "(512, 1, 1)")
    assert launches[1].values == {DRAM_THROUGHPUT: 44.1}  # "n/a" left out
    assert launches[0].sm_active is None and launches[0].dram_bytes_per_second is None


def test_launches_go_to_their_workloads_the_gemm_is_the_longest_other() -> None:
    names = ("fp32_fma", "pointer_chase", "copy_d2d", "gemm_bf16")
    found = assign(parse_launches(PIPE_CSV), names)
    assert {name: launch.kernel for name, launch in found.items()} == {
        "fp32_fma": "smlens_truth_fma",
        "pointer_chase": "smlens_truth_chase",
        "copy_d2d": "smlens_truth_copy",
        "gemm_bf16": "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
    }
    only = assign(parse_launches(PIPE_CSV), ("pointer_chase",))
    assert list(only) == ["pointer_chase"]


QUERY = """Device NVIDIA H200 (GH100)
---------------------------------------- --------- -------- ------------------------------------------
Metric Name                              Metric Type Metric Unit Metric Description
---------------------------------------- --------- -------- ------------------------------------------
dram__bytes                              Counter   byte     # of bytes accessed in DRAM
sm__pipe_fma_cycles_active               Counter   cycle    # of cycles where FMA pipe was active
sm__pipe_alu_cycles_active               Counter   cycle    # of cycles where ALU pipe was active
"""


def test_only_the_pipe_metrics_this_ncu_lists_are_asked_for() -> None:
    listed = listed_metrics(QUERY)
    assert listed == {"dram__bytes", "sm__pipe_fma_cycles_active", "sm__pipe_alu_cycles_active"}
    metrics = pipe_metrics(listed)
    assert metrics[: len(ALWAYS_METRICS)] == list(ALWAYS_METRICS)
    assert metrics[len(ALWAYS_METRICS) :] == [
        "sm__pipe_fma_cycles_active" + ELAPSED_PERCENT,
        "sm__pipe_alu_cycles_active" + ELAPSED_PERCENT,
    ]
    assert pipe_metrics(()) == list(ALWAYS_METRICS)  # the query failed: the ones seen on an H200 only
