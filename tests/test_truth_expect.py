"""The truth harness' expected values: derived from device limits, never from a model name."""

from __future__ import annotations

import pytest
from bench.truth.expect import (
    SM_ACTIVE_PER_UTILIZATION,
    DeviceLimits,
    Spin,
    at_least,
    at_most,
    checks_for,
    near,
    peak_dram_bandwidth,
    spin_shapes,
)

from smlens import names as n

HOPPER = DeviceLimits("hopper-like", 132, 2048, 1024, 233472, 232448, 1024, 60 << 20, 4.8e12)
# A GPU of another shape: 84 SMs of 48 warps (1536 threads), 100 KiB shared memory per SM.
ADA = DeviceLimits("ada-like", 84, 1536, 1024, 102400, 101376, 1024, 48 << 20, None)


def bands(name: str, limits: DeviceLimits, achieved: float | None = None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for check in checks_for(name, limits, achieved):
        out.setdefault(check.metric, []).append(check.band.text)
    return out


def test_spin_shapes_follow_the_sm_count_and_warp_limit() -> None:
    hopper, ada = spin_shapes(HOPPER), spin_shapes(ADA)
    assert hopper["spin_one_warp"] == Spin(1, 1, 32)
    assert hopper["spin_half_sms"] == Spin(66, 1, 1024)
    assert hopper["spin_quarter_occupancy"] == Spin(132, 1, 512)
    assert hopper["spin_full_occupancy"] == Spin(132, 2, 1024)
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
    # An H200 reports 3201 MHz and a 6016-bit bus through NVML.
    assert peak_dram_bandwidth(3201e6, 6016) == pytest.approx(4.814e12, rel=1e-3)
