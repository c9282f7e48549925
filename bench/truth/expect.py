"""What each truth workload must make smlens report, derived from the device's own limits.

Nothing here knows a GPU model: the SM count, warps per SM, shared memory and the memory bus come from
:class:`DeviceLimits`, read off the device. Tolerances are stated beside each band.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from smlens import names as n

WARP = 32
# Derived metric: SM active over utilization, how much of the "busy" time the SMs really had work.
SM_ACTIVE_PER_UTILIZATION = "sm_active_per_utilization"

IDLE_CEILING = 0.01  # an idle GPU: every ratio at or below 1 %
SPIN_UTILIZATION = 0.95  # a kernel is resident all the time; NVML samples may miss the relaunch gaps
SPIN_FULL_SM_ACTIVE = 0.97  # every SM holds a warp all the time
WORKING_SM_ACTIVE = 0.8  # a large GEMM or a memory-bound kernel keeps SMs busy
GEMM_TENSOR = 0.8  # a large bf16 GEMM keeps the tensor pipes busy
NO_TENSOR = 0.05  # kernels without matrix instructions: tensor pipes idle
TINY_GEMM_SM_SHARE = 0.6  # launch-bound tiny GEMMs: SMs busy well under the time "utilization" counts
TINY_GEMM_TENSOR = 0.1
COPY_DRAM = 0.7  # a large device-to-device copy: DRAM interface mostly busy
DRAM_MATCH = 0.1  # GPM DRAM activity vs the bandwidth the workload itself achieved over peak


def sm_active_tolerance(centre: float) -> float:
    """0.003 absolute (a third of one SM on a 132-SM GPU) plus 3 % of the value."""
    return 0.003 + 0.03 * centre


def occupancy_tolerance(centre: float) -> float:
    """0.001 absolute plus 5 % of the value."""
    return 0.001 + 0.05 * centre


@dataclass(frozen=True)
class DeviceLimits:
    """The facts about one GPU that the expectations are derived from."""

    name: str
    sm_count: int
    max_threads_per_sm: int
    max_threads_per_block: int
    max_shared_per_sm: int  # bytes
    max_shared_per_block_optin: int  # bytes
    reserved_shared_per_block: int  # bytes the runtime keeps per resident block
    l2_bytes: int
    peak_dram_bytes_per_second: float | None  # None when the memory clock or bus width is unknown

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // WARP


def peak_dram_bandwidth(memory_clock_hz: float, bus_width_bits: int) -> float:
    """Peak bytes per second of a double-data-rate memory bus (HBM and GDDR report their base clock)."""
    return 2 * memory_clock_hz * bus_width_bits / 8


@dataclass(frozen=True)
class Spin:
    """A spin-kernel launch: ``sms`` SMs each holding ``blocks_per_sm`` blocks of ``threads`` threads."""

    sms: int
    blocks_per_sm: int
    threads: int

    @property
    def blocks(self) -> int:
        return self.sms * self.blocks_per_sm

    def shared_bytes(self, limits: DeviceLimits) -> int:
        """Dynamic shared memory per block that lets at most ``blocks_per_sm`` blocks share one SM.

        Without it the block scheduler may stack several blocks on one SM when the grid is smaller
        than the GPU; a full grid (every SM at its thread limit) needs none.
        """
        by_threads = limits.max_threads_per_sm // self.threads
        if by_threads <= self.blocks_per_sm:
            return 0
        per_block = limits.max_shared_per_sm // (self.blocks_per_sm + 1) + 1
        return max(per_block - limits.reserved_shared_per_block, 0)

    def sm_active(self, limits: DeviceLimits) -> float:
        return self.sms / limits.sm_count

    def occupancy(self, limits: DeviceLimits) -> float:
        warps = self.blocks * self.threads / WARP
        return warps / (limits.sm_count * limits.max_warps_per_sm)


def spin_shapes(limits: DeviceLimits) -> dict[str, Spin]:
    """The spin launches of the harness, by workload name."""
    s, w = limits.sm_count, limits.max_warps_per_sm
    per_sm = w * WARP
    full_blocks = -(-per_sm // limits.max_threads_per_block)  # fewest blocks that fill one SM
    if per_sm % (full_blocks * WARP):
        raise ValueError(f"{limits.name}: {w} warps per SM do not split into {full_blocks} equal blocks.")
    return {
        "spin_one_warp": Spin(1, 1, WARP),
        "spin_half_sms": Spin(s // 2, 1, min(limits.max_threads_per_block, per_sm)),
        "spin_warp_per_sm": Spin(s, 1, WARP),
        "spin_quarter_occupancy": Spin(s, 1, per_sm // 4),
        "spin_full_occupancy": Spin(s, full_blocks, per_sm // full_blocks),
    }


@dataclass(frozen=True)
class Band:
    """An accepted range; ``text`` says it the way the report prints it."""

    low: float | None
    high: float | None
    text: str

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


def at_least(low: float) -> Band:
    return Band(low, None, f">= {low:.4g}")


def at_most(high: float) -> Band:
    return Band(None, high, f"<= {high:.4g}")


def near(centre: float, tolerance: float) -> Band:
    """``centre`` +/- ``tolerance``, clipped to the 0..1 a ratio can take."""
    return Band(
        max(centre - tolerance, 0.0), min(centre + tolerance, 1.0), f"{centre:.4g} +/- {tolerance:.2g}"
    )


@dataclass(frozen=True)
class Check:
    metric: str  # a Reading.activity key of smlens.model, or SM_ACTIVE_PER_UTILIZATION
    band: Band
    why: str


def _idle() -> list[Check]:
    keys = (n.UTILIZATION, n.SM_ACTIVE, n.SM_OCCUPANCY, n.TENSOR_ACTIVE, n.DRAM_ACTIVE)
    return [Check(key, at_most(IDLE_CEILING), "no kernel runs") for key in keys]


def _spin(shape: Spin, limits: DeviceLimits) -> list[Check]:
    active, occupancy = shape.sm_active(limits), shape.occupancy(limits)
    placement = (
        f"{shape.sms} of {limits.sm_count} SMs, {shape.blocks_per_sm} x {shape.threads} threads "
        f"of {limits.max_threads_per_sm} per SM"
    )
    sm_band = (
        at_least(SPIN_FULL_SM_ACTIVE)
        if shape.sms == limits.sm_count
        else near(active, sm_active_tolerance(active))
    )
    return [
        Check(n.UTILIZATION, at_least(SPIN_UTILIZATION), "a kernel is always resident"),
        Check(n.SM_ACTIVE, sm_band, placement),
        Check(n.SM_OCCUPANCY, near(occupancy, occupancy_tolerance(occupancy)), placement),
        Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
    ]


def _dram_matches(achieved: float | None, limits: DeviceLimits, minimum_only: bool) -> list[Check]:
    if achieved is None or limits.peak_dram_bytes_per_second is None:
        return []
    share = achieved / limits.peak_dram_bytes_per_second
    why = f"workload moved {achieved / 1e12:.2f} TB/s of {limits.peak_dram_bytes_per_second / 1e12:.2f} peak"
    if minimum_only:  # the workload's byte count is a lower bound (re-reads that miss L2 come on top)
        return [Check(n.DRAM_ACTIVE, at_least(max(share - DRAM_MATCH, 0.0)), why + " (at least)")]
    return [Check(n.DRAM_ACTIVE, near(share, DRAM_MATCH), why)]


def checks_for(
    name: str, limits: DeviceLimits, achieved_bytes_per_second: float | None = None
) -> list[Check]:
    """The checks of one workload. ``achieved_bytes_per_second``: what a memory workload measured itself."""
    spins = spin_shapes(limits)
    if name in spins:
        return _spin(spins[name], limits)
    if name == "idle":
        return _idle()
    if name == "gemm_bf16":
        return [
            Check(n.UTILIZATION, at_least(SPIN_UTILIZATION), "GEMMs back to back"),
            Check(n.SM_ACTIVE, at_least(WORKING_SM_ACTIVE), "tiles cover every SM"),
            Check(n.TENSOR_ACTIVE, at_least(GEMM_TENSOR), "bf16 matrix instructions"),
        ]
    if name == "gemm_tiny_launch_bound":
        return [
            Check(
                SM_ACTIVE_PER_UTILIZATION,
                at_most(TINY_GEMM_SM_SHARE),
                "a few tiles per GEMM: utilization overstates SM use",
            ),
            Check(n.TENSOR_ACTIVE, at_most(TINY_GEMM_TENSOR), "launch gaps dominate"),
        ]
    if name == "copy_d2d":
        return [
            Check(n.DRAM_ACTIVE, at_least(COPY_DRAM), "large copy streams through DRAM"),
            *_dram_matches(achieved_bytes_per_second, limits, minimum_only=False),
            Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
        ]
    if name == "softmax_fp32":
        return [
            Check(n.SM_ACTIVE, at_least(WORKING_SM_ACTIVE), "rows cover every SM"),
            *_dram_matches(achieved_bytes_per_second, limits, minimum_only=True),
            Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
        ]
    raise KeyError(f"no expectations for workload {name!r}")


# The `smlens check` verdict code each of these workloads must get (thresholds.yaml decides the codes).
VERDICTS: Mapping[str, str] = {
    "idle": "idle",
    "spin_one_warp": "hollow",
    "spin_warp_per_sm": "low_occupancy",
    "gemm_bf16": "working",
}
