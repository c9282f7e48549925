"""What each truth workload must make smlens report, derived from the device's own limits.

Nothing here knows a GPU model: the SM count, warps per SM, shared memory and the memory bus come from
:class:`DeviceLimits`, read off the device; the compute peaks per SM and cycle go by the CUDA architecture
(compute capability) and the SM clock measured over the window. Tolerances are stated beside each band.
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
PIPE_MATCH = 0.1  # a pipe's GPM activity vs the rate the workload achieved over the pipe's peak at the clock
TRAINING_TENSOR = 0.05  # bf16 autocast training: the tensor pipes do some of the work
# The compute-pipe workloads' launch: blocks of this many threads, this many per SM (4 x 512 fills a
# Hopper SM's 2048 threads; fewer blocks where an SM holds fewer threads).
PIPE_BLOCK_THREADS = 512
PIPE_BLOCKS_PER_SM = 4
CHASE_BYTES = (
    2**30
)  # the pointer chase's permutation: 1 GiB of 4-byte indices, >= 16 x the L2 of today's GPUs
SECTOR_BYTES = 32  # the smallest unit DRAM serves an L2 miss in: a random 4-byte load moves at least this

# Per SM and clock cycle, by CUDA compute capability, from NVIDIA's architecture whitepapers: dense bf16
# tensor FLOP (A100: 312 TFLOP/s at 1410 MHz on 108 SMs; H100/H200 SXM: 989 at 1830 MHz on 132) and FP32
# lanes, each one FMA (2 FLOP) a cycle. A GPU not listed gets no physics check for these pipes.
BF16_DENSE_FLOP_PER_SM_CYCLE: Mapping[tuple[int, int], int] = {(8, 0): 2048, (9, 0): 4096}
FP32_LANES_PER_SM: Mapping[tuple[int, int], int] = {(8, 0): 64, (8, 6): 128, (8, 9): 128, (9, 0): 128}


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
    compute_capability: tuple[int, int] | None = None

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // WARP

    def peak_bf16_flops(self, sm_clock_hz: float | None) -> float | None:
        """Dense bf16 tensor FLOP/s at ``sm_clock_hz``; None when the clock or the architecture is unknown."""
        per_cycle = BF16_DENSE_FLOP_PER_SM_CYCLE.get(self.compute_capability or (0, 0))
        return None if per_cycle is None or not sm_clock_hz else self.sm_count * per_cycle * sm_clock_hz

    def peak_fp32_flops(self, sm_clock_hz: float | None) -> float | None:
        """FP32 FMA FLOP/s (2 a lane a cycle) at ``sm_clock_hz``; None when the clock or the architecture
        is unknown."""
        lanes = FP32_LANES_PER_SM.get(self.compute_capability or (0, 0))
        return None if lanes is None or not sm_clock_hz else self.sm_count * lanes * 2 * sm_clock_hz


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


def pipe_shape(limits: DeviceLimits) -> Spin:
    """The launch of the FP32 FMA and pointer-chase kernels: every SM, PIPE_BLOCKS_PER_SM blocks of
    PIPE_BLOCK_THREADS (as many as fit where an SM holds fewer threads)."""
    per_sm = min(PIPE_BLOCKS_PER_SM, limits.max_threads_per_sm // PIPE_BLOCK_THREADS)
    return Spin(limits.sm_count, per_sm, PIPE_BLOCK_THREADS)


def chase_dram_floor(limits: DeviceLimits, size: int = CHASE_BYTES) -> float:
    """Share of a pointer chase's random loads that miss the L2 (and each moves a DRAM sector) at least."""
    return max(0.0, 1.0 - limits.l2_bytes / size)


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
        "spin_8_warps_per_sm": Spin(s, 1, min(8, w) * WARP),
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
    gauge: bool = True  # the gauge median must hold too (False: no gauge in the default groups)


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


def _work_bound(shape: Spin, limits: DeviceLimits, what: str) -> list[Check]:
    """SM active and occupancy of a kernel launched as ``shape`` on every SM whose warps run until their
    work is done (not a timer): the shape bounds the occupancy from above only. Warps that win the pipe
    more often finish first, and SMs whose loads come back sooner idle before the slowest one, so both
    fall below the shape within each launch; ncu's counters on one launch of the same kernel are the
    reference for them (compare.ncu_pipe_outcomes)."""
    occupancy = shape.occupancy(limits)
    placement = f"{what}: {shape.blocks_per_sm} x {shape.threads} threads on each of {shape.sms} SMs"
    return [
        Check(n.SM_ACTIVE, at_least(WORKING_SM_ACTIVE), placement),
        Check(n.SM_OCCUPANCY, at_most(occupancy + occupancy_tolerance(occupancy)), placement + " (at most)"),
        Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
    ]


def _pipe_matches(key: str, achieved: float | None, peak: float | None, what: str) -> list[Check]:
    """The pipe's activity against the FLOP rate the workload achieved over the pipe's peak at the SM
    clock (the window's median): counter only, no pipe gauge is in the default groups."""
    if achieved is None or not peak:
        return []
    share = achieved / peak
    why = f"workload ran {achieved / 1e12:.1f} TFLOP/s of {peak / 1e12:.0f} {what} at the SM clock"
    return [Check(key, near(share, PIPE_MATCH), why, gauge=False)]


def _dram_matches(achieved: float | None, limits: DeviceLimits, minimum_only: bool) -> list[Check]:
    if achieved is None or limits.peak_dram_bytes_per_second is None:
        return []
    share = achieved / limits.peak_dram_bytes_per_second
    why = f"workload moved {achieved / 1e12:.2f} TB/s of {limits.peak_dram_bytes_per_second / 1e12:.2f} peak"
    if minimum_only:  # the workload's byte count is a lower bound (re-reads that miss L2 come on top)
        return [Check(n.DRAM_ACTIVE, at_least(max(share - DRAM_MATCH, 0.0)), why + " (at least)")]
    return [Check(n.DRAM_ACTIVE, near(share, DRAM_MATCH), why)]


def checks_for(
    name: str, limits: DeviceLimits, achieved: float | None = None, sm_clock_hz: float | None = None
) -> list[Check]:
    """The checks of one workload. ``achieved``: what the workload measured itself, per second in its
    unit (bytes for the memory workloads, FLOP for the GEMM and the FMA chains); ``sm_clock_hz``: the SM
    clock over its window, for the compute peaks."""
    spins = spin_shapes(limits)
    if name in spins:
        return _spin(spins[name], limits)
    if name == "idle":
        return _idle()
    if name == "gemm_bf16":
        checks = [
            Check(n.UTILIZATION, at_least(SPIN_UTILIZATION), "GEMMs back to back"),
            Check(n.SM_ACTIVE, at_least(WORKING_SM_ACTIVE), "tiles cover every SM"),
            Check(n.TENSOR_ACTIVE, at_least(GEMM_TENSOR), "bf16 matrix instructions"),
        ]
        # Tensor-active cycles include those the pipe runs below its full rate: at least the share of the
        # peak the GEMM achieved.
        peak = limits.peak_bf16_flops(sm_clock_hz)
        if achieved is not None and peak:
            why = f"GEMM ran {achieved / 1e12:.0f} TFLOP/s of {peak / 1e12:.0f} dense bf16 at the SM clock"
            checks.append(Check(n.TENSOR_ACTIVE, at_least(max(achieved / peak - PIPE_MATCH, 0.0)), why))
        return checks
    if name == "fp32_fma":
        peak = limits.peak_fp32_flops(sm_clock_hz)
        return [
            *_work_bound(pipe_shape(limits), limits, "independent FP32 FMA chains"),
            *_pipe_matches(n.FP32_ACTIVE, achieved, peak, "FP32 FMA"),
        ]
    if name == "pointer_chase":
        return [
            *_work_bound(pipe_shape(limits), limits, "dependent loads"),
            *_dram_matches(achieved, limits, minimum_only=True),
        ]
    if name == "gpt2_train":
        return [
            Check(n.TENSOR_ACTIVE, at_least(TRAINING_TENSOR), "bf16 autocast: matmuls on the tensor pipes")
        ]
    if name == "gpt2_generate":
        return []  # what it reads is reported, not required
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
            *_dram_matches(achieved, limits, minimum_only=False),
            Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
        ]
    if name == "softmax_fp32":
        return [
            Check(n.SM_ACTIVE, at_least(WORKING_SM_ACTIVE), "rows cover every SM"),
            *_dram_matches(achieved, limits, minimum_only=True),
            Check(n.TENSOR_ACTIVE, at_most(NO_TENSOR), "no matrix instructions"),
        ]
    raise KeyError(f"no expectations for workload {name!r}")


@dataclass(frozen=True)
class ExpectedVerdict:
    """The verdict a workload must get, from its window means and from `smlens check`; ``code`` None:
    whatever it reads is reported, not required. ``pipe``: the busiest pipe a compute-bound verdict names."""

    code: str | None
    why: str
    pipe: str | None = None

    @property
    def text(self) -> str:
        if self.code is None:
            return "reported (any)"
        return self.code + (f" ({self.pipe} pipe)" if self.pipe else "")

    def holds(self, code: str | None, pipe: str | None) -> bool | None:
        if self.code is None:
            return None
        return code == self.code and (self.pipe is None or pipe == self.pipe)


# The verdict each of these workloads must get (smlens.verdicts.judge, thresholds.yaml's values).
VERDICTS: Mapping[str, ExpectedVerdict] = {
    "idle": ExpectedVerdict(n.VERDICT_IDLE, "no kernel, no memory held"),
    "spin_one_warp": ExpectedVerdict(n.VERDICT_HOLLOW, "busy, but one SM of all"),
    "spin_warp_per_sm": ExpectedVerdict(n.VERDICT_STALLED, "every SM active, no pipe and no DRAM busy"),
    "spin_8_warps_per_sm": ExpectedVerdict(
        n.VERDICT_STALLED, "every SM active, waiting on the timer: no pipe and no DRAM busy"
    ),
    "fp32_fma": ExpectedVerdict(
        n.VERDICT_COMPUTE_BOUND, "FMA chains keep the FP32 pipe near its peak", "fp32"
    ),
    "pointer_chase": ExpectedVerdict(
        n.VERDICT_STALLED, "every SM active, each warp waiting on its own load's latency"
    ),
    "copy_d2d": ExpectedVerdict(n.VERDICT_MEMORY_BOUND, "streams through DRAM near its peak"),
    "gemm_bf16": ExpectedVerdict(
        n.VERDICT_COMPUTE_BOUND, "large bf16 GEMM: tensor pipes near peak", "tensor"
    ),
    "gpt2_train": ExpectedVerdict(
        n.VERDICT_STALLED, "a small model's many kernels: SMs busy, no pipe or DRAM near its peak"
    ),
    "gpt2_generate": ExpectedVerdict(None, "batch-1 decoding: small kernels between Python's launches"),
}
