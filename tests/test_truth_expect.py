"""The truth harness' expected values: derived from device limits, never from a model name."""

from __future__ import annotations

import pytest
from bench.truth.expect import (
    SM_ACTIVE_PER_UTILIZATION,
    VERDICTS,
    DeviceLimits,
    ExpectedVerdict,
    Spin,
    at_least,
    at_most,
    chase_dram_floor,
    checks_for,
    near,
    peak_dram_bandwidth,
    pipe_shape,
    spin_shapes,
)
from bench.truth.workloads import make_workloads

from smlens import names as n

HOPPER = DeviceLimits("hopper-like", 132, 2048, 1024, 233472, 232448, 1024, 60 << 20, 4.8e12, (9, 0))
# A GPU of another shape: 84 SMs of 48 warps (1536 threads), 100 KiB shared memory per SM.
ADA = DeviceLimits("ada-like", 84, 1536, 1024, 102400, 101376, 1024, 48 << 20, None)


def bands(
    name: str, limits: DeviceLimits, achieved: float | None = None, sm_clock_hz: float | None = None
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for check in checks_for(name, limits, achieved, sm_clock_hz):
        out.setdefault(check.metric, []).append(check.band.text)
    return out


def test_spin_shapes_follow_the_sm_count_and_warp_limit() -> None:
    hopper, ada = spin_shapes(HOPPER), spin_shapes(ADA)
    assert hopper["spin_one_warp"] == Spin(1, 1, 32)
    assert hopper["spin_half_sms"] == Spin(66, 1, 1024)
    assert hopper["spin_quarter_occupancy"] == Spin(132, 1, 512)
    assert hopper["spin_full_occupancy"] == Spin(132, 2, 1024)
    assert hopper["spin_8_warps_per_sm"] == Spin(132, 1, 256)
    assert ada["spin_8_warps_per_sm"] == Spin(84, 1, 256)
    assert ada["spin_half_sms"] == Spin(42, 1, 1024)
    assert ada["spin_quarter_occupancy"] == Spin(84, 1, 384)
    assert ada["spin_full_occupancy"] == Spin(84, 2, 768)  # 1536 threads need two blocks of 768


@pytest.mark.parametrize("limits", [HOPPER, ADA])
def test_expected_activity_and_occupancy(limits: DeviceLimits) -> None:
    shapes, sms, warps = spin_shapes(limits), limits.sm_count, limits.max_warps_per_sm
    assert shapes["spin_one_warp"].sm_active(limits) == pytest.approx(1 / sms)
    assert shapes["spin_one_warp"].occupancy(limits) == pytest.approx(1 / (sms * warps))
    assert shapes["spin_warp_per_sm"].occupancy(limits) == pytest.approx(1 / warps)
    assert shapes["spin_quarter_occupancy"].occupancy(limits) == pytest.approx(0.25)
    assert shapes["spin_full_occupancy"].occupancy(limits) == pytest.approx(1.0)
    half = shapes["spin_half_sms"]
    assert half.sm_active(limits) == pytest.approx((sms // 2) / sms)
    assert half.occupancy(limits) == pytest.approx((sms // 2) * 32 / (sms * warps))


@pytest.mark.parametrize("limits", [HOPPER, ADA])
def test_shared_memory_leaves_room_for_exactly_the_planned_blocks(limits: DeviceLimits) -> None:
    for name, shape in spin_shapes(limits).items():
        shared = shape.shared_bytes(limits)
        by_threads = limits.max_threads_per_sm // shape.threads
        if shared == 0:  # the thread limit alone places the blocks
            assert by_threads == shape.blocks_per_sm, name
            continue
        per_block = shared + limits.reserved_shared_per_block
        assert shared <= limits.max_shared_per_block_optin, name
        assert shape.blocks_per_sm * per_block <= limits.max_shared_per_sm, name
        assert (shape.blocks_per_sm + 1) * per_block > limits.max_shared_per_sm, name


def test_a_warp_limit_that_does_not_split_evenly_is_refused() -> None:
    odd = DeviceLimits("odd", 10, 1056, 1024, 65536, 65536, 0, 1 << 20, None)  # 33 warps per SM
    with pytest.raises(ValueError, match="33 warps per SM"):
        spin_shapes(odd)


def test_spin_checks_for_a_hopper_like_gpu() -> None:
    one = bands("spin_one_warp", HOPPER)
    assert one[n.UTILIZATION] == [">= 0.95"]
    assert one[n.SM_ACTIVE] == ["0.007576 +/- 0.0032"]  # 1/132, +/- 0.003 + 3 %
    assert one[n.SM_OCCUPANCY] == ["0.0001184 +/- 0.001"]
    assert bands("spin_warp_per_sm", HOPPER)[n.SM_ACTIVE] == [">= 0.97"]
    assert bands("spin_warp_per_sm", HOPPER)[n.SM_OCCUPANCY] == ["0.01562 +/- 0.0018"]
    assert bands("spin_full_occupancy", HOPPER)[n.SM_OCCUPANCY] == ["1 +/- 0.051"]


def test_other_workload_checks() -> None:
    assert set(bands("idle", HOPPER)) == {
        n.UTILIZATION,
        n.SM_ACTIVE,
        n.SM_OCCUPANCY,
        n.TENSOR_ACTIVE,
        n.DRAM_ACTIVE,
    }
    assert bands("gemm_bf16", HOPPER)[n.TENSOR_ACTIVE] == [">= 0.8"]
    assert bands("gemm_tiny_launch_bound", HOPPER)[SM_ACTIVE_PER_UTILIZATION] == ["<= 0.6"]


def test_dram_bands_come_from_what_the_workload_moved() -> None:
    copy = bands("copy_d2d", HOPPER, achieved=4.32e12)  # 0.9 of the 4.8 TB/s peak
    assert copy[n.DRAM_ACTIVE] == [">= 0.7", "0.9 +/- 0.1"]
    softmax = bands("softmax_fp32", HOPPER, achieved=3.36e12)  # bytes counted are a lower bound
    assert softmax[n.DRAM_ACTIVE] == [">= 0.6"]
    # Unknown peak or throughput: only the fixed floor of the copy remains.
    assert bands("copy_d2d", ADA, achieved=1e12)[n.DRAM_ACTIVE] == [">= 0.7"]
    assert n.DRAM_ACTIVE not in bands("softmax_fp32", HOPPER)


def test_unknown_workload() -> None:
    with pytest.raises(KeyError):
        checks_for("no_such_workload", HOPPER)


def test_bands() -> None:
    assert at_least(0.5).holds(0.5) and not at_least(0.5).holds(0.49)
    assert at_most(0.01).holds(0.0) and not at_most(0.01).holds(0.02)
    assert not at_least(0.0).holds(None)  # an absent value never passes
    assert not at_most(1.0).holds(float("nan"))
    assert near(1.0, 0.05) == near(1.0, 0.05) and near(1.0, 0.05).high == 1.0  # clipped to a ratio
    assert near(0.002, 0.003).low == 0.0
    assert near(0.25, 0.02).holds(0.27) and not near(0.25, 0.02).holds(0.271)


def test_peak_dram_bandwidth_is_double_data_rate() -> None:
    # The memory clock and bus width NVML gives for an H200.
    assert peak_dram_bandwidth(3201e6, 6016) == pytest.approx(4.814e12, rel=1e-3)


def test_the_pipe_kernels_fill_every_sm_with_four_blocks_of_512() -> None:
    assert pipe_shape(HOPPER) == Spin(132, 4, 512)
    assert pipe_shape(HOPPER).occupancy(HOPPER) == 1.0
    assert pipe_shape(ADA) == Spin(84, 3, 512)  # 1536 threads per SM hold three


def test_compute_peaks_scale_with_the_sm_clock_and_need_a_known_architecture() -> None:
    assert HOPPER.peak_bf16_flops(1.83e9) == pytest.approx(989.4e12, rel=1e-3)  # the datasheet's dense bf16
    assert HOPPER.peak_fp32_flops(1.98e9) == pytest.approx(66.9e12, rel=1e-3)  # 128 lanes x 2 FLOP a cycle
    assert HOPPER.peak_bf16_flops(None) is None and HOPPER.peak_fp32_flops(0.0) is None
    assert ADA.peak_bf16_flops(2e9) is None  # compute capability unknown: no physics check


def test_fp32_fma_checks_its_pipe_against_the_flop_rate_at_the_clock() -> None:
    achieved = 0.9 * HOPPER.peak_fp32_flops(1.5e9)  # type: ignore[operator]
    fma = bands("fp32_fma", HOPPER, achieved, sm_clock_hz=1.5e9)
    assert fma[n.FP32_ACTIVE] == ["0.9 +/- 0.1"]
    # Warps and SMs finish their work at different times: the launch shape bounds occupancy from above.
    assert fma[n.SM_ACTIVE] == [">= 0.8"] and fma[n.SM_OCCUPANCY] == ["<= 1.051"]
    (pipe,) = [c for c in checks_for("fp32_fma", HOPPER, achieved, 1.5e9) if c.metric == n.FP32_ACTIVE]
    assert pipe.gauge is False  # no FP32 gauge in the default groups: the counter decides
    assert n.FP32_ACTIVE not in bands("fp32_fma", HOPPER, achieved)  # no clock measured: no physics


def test_gemm_tensor_at_least_its_share_of_the_bf16_peak() -> None:
    peak = HOPPER.peak_bf16_flops(1.6e9)
    assert peak is not None
    gemm = bands("gemm_bf16", HOPPER, 0.75 * peak, sm_clock_hz=1.6e9)
    assert gemm[n.TENSOR_ACTIVE] == [">= 0.8", ">= 0.65"]
    assert bands("gemm_bf16", HOPPER, 0.75 * peak)[n.TENSOR_ACTIVE] == [">= 0.8"]


def test_pointer_chase_dram_at_least_a_sector_per_missed_load() -> None:
    assert chase_dram_floor(HOPPER) == pytest.approx(1 - 60 / 1024)
    assert chase_dram_floor(HOPPER, 32 << 20) == 0.0  # fits the L2: no floor
    chase = bands("pointer_chase", HOPPER, achieved=1.44e12)  # 0.3 of the 4.8 TB/s peak
    assert chase[n.DRAM_ACTIVE] == [">= 0.2"]
    assert chase[n.SM_OCCUPANCY] == ["<= 1.051"]


def test_gpt2_workloads() -> None:
    assert bands("gpt2_train", HOPPER) == {n.TENSOR_ACTIVE: [">= 0.05"]}
    assert bands("gpt2_generate", HOPPER) == {}  # reported only


def test_every_expected_verdict_names_a_workload_a_code_and_a_pipe_smlens_knows() -> None:
    names = {w.name for w in make_workloads(HOPPER)}
    assert set(VERDICTS) <= names
    for name, expected in VERDICTS.items():
        assert expected.code is None or expected.code in n.VERDICT_CODES, name
        assert expected.pipe is None or expected.pipe in n.SOL_PIPE_NAMES.values(), name
        checks_for(name, HOPPER)  # and has expectations
    assert VERDICTS["fp32_fma"] == ExpectedVerdict(n.VERDICT_COMPUTE_BOUND, VERDICTS["fp32_fma"].why, "fp32")
    assert VERDICTS["gemm_bf16"].pipe == "tensor"
    assert {VERDICTS[w].code for w in ("spin_8_warps_per_sm", "pointer_chase", "gpt2_train")} == {
        n.VERDICT_STALLED
    }
    assert VERDICTS["copy_d2d"].code == n.VERDICT_MEMORY_BOUND
    assert VERDICTS["gpt2_generate"].code is None


def test_an_expected_verdict_holds_on_its_code_and_pipe() -> None:
    bound = ExpectedVerdict(n.VERDICT_COMPUTE_BOUND, "why", "fp32")
    assert bound.text == "compute_bound (fp32 pipe)"
    assert bound.holds("compute_bound", "fp32") is True
    assert bound.holds("compute_bound", "tensor") is False  # the wrong pipe fails
    assert bound.holds("stalled", None) is False
    stalled = ExpectedVerdict(n.VERDICT_STALLED, "why")
    assert stalled.text == "stalled" and stalled.holds("stalled", None) is True
    reported = ExpectedVerdict(None, "why")
    assert reported.text == "reported (any)" and reported.holds("partial", None) is None
