"""Verdicts on the H200 reference measurements (docs/validation.md): what limits each workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from smlens import names as n
from smlens.errors import ConfigError
from smlens.verdicts import thresholds
from smlens.verdicts.judge import Means, judge

LIMITS = thresholds.load()
FP32, INT, TENSOR = n.FP32_ACTIVE, n.INTEGER_ACTIVE, n.TENSOR_ACTIVE
GIB = 1 << 30


def means(
    util: float | None,
    sm: float | None,
    occ: float | None = None,
    dram: float | None = 0.0,
    pipes: dict[str, float] | None = None,
    memory: float | None = None,
) -> Means:
    """Window means as a sampler gives them: the compute SOL from the pipes (one tick's, where the busiest
    pipe is the SOL)."""
    ratios: dict[str, float | None] = {
        n.UTILIZATION: util,
        n.SM_ACTIVE: sm,
        n.SM_OCCUPANCY: occ,
        n.DRAM_ACTIVE: dram,
    }
    if sm is not None:
        ratios.update(
            {TENSOR: 0.0, n.FP64_ACTIVE: 0.0, FP32: 0.0, n.FP16_ACTIVE: 0.0, INT: 0.0, **(pipes or {})}
        )
    return Means.of(ratios, memory)


@pytest.mark.parametrize(
    ("name", "window", "code", "pipe"),
    [
        # Window means an H200 gave for these workloads (docs/validation.md): what each must read.
        ("spin kernel, all SMs, 8 warps each", means(1.0, 0.998, 0.125, 0.0, {INT: 0.38}), "stalled", None),
        (
            "FP32 FMA chains",
            means(0.98, 0.988, 0.614, 0.0, {TENSOR: 0.053, FP32: 0.852, INT: 0.107}),
            "compute_bound",
            "fp32",
        ),
        ("pointer chase over 1 GiB", means(1.0, 0.942, 0.94, 0.521, {INT: 0.005}), "stalled", None),
        ("1 GiB device copies", means(1.0, 0.983, 0.793, 0.88, {INT: 0.079}), "memory_bound", None),
        (
            "bf16 GEMM 8192^3",
            means(1.0, 0.962, 0.142, 0.175, {TENSOR: 0.933, INT: 0.014}),
            "compute_bound",
            "tensor",
        ),
        ("GPT-2 training, bf16", means(0.99, 0.923, 0.479, 0.423, {TENSOR: 0.153}), "stalled", None),
        # Earlier references: a one-warp kernel, launch-bound tiny GEMMs.
        ("spin kernel, 1 block x 1 warp", means(1.0, 0.00757, 0.00012), "hollow", None),
        ("launch-bound tiny GEMMs", means(0.313, 0.119, 0.017, 0.0, {TENSOR: 0.0025}), "partial", None),
        ("nothing ran", means(0.0, 0.0, 0.0), "idle", None),
        (
            "a notebook holding memory, no kernels",
            means(0.0, 0.0, 0.0, memory=98 * GIB),
            "idle_memory_held",
            None,
        ),
        ("no SM metrics", means(1.0, None), "no_profiling", None),
        ("no SM metrics, idle, memory held", means(0.0, None, memory=2 * GIB), "idle_memory_held", None),
        ("no data", means(None, None), "unknown", None),
        ("SMs active, DRAM unknown", means(1.0, 0.95, 0.5, None), "unknown", None),
        # A MIG instance (no utilization): its memory held stands for busy.
        ("held instance, SMs mostly idle", means(None, 0.05, 0.01, memory=GIB), "hollow", None),
        ("free instance, SMs mostly idle", means(None, 0.05, 0.01), "partial", None),
        ("held instance, no kernels", means(None, 0.0, 0.0, memory=GIB), "idle_memory_held", None),
        (
            "instance at the tensor roof",
            means(None, 0.96, 0.14, 0.17, {TENSOR: 0.93}),
            "compute_bound",
            "tensor",
        ),
    ],
)
def test_reference_workloads(name: str, window: Means, code: str, pipe: str | None) -> None:
    verdict = judge(LIMITS, window)
    assert (verdict.code, verdict.pipe) == (code, pipe), name


def test_the_compute_sol_is_the_integrated_one_not_the_busiest_window_mean() -> None:
    """Two ticks, FP32 busy in one and INT in the other: each pipe's window mean is 0.45, the busiest
    pipe tick by tick averages 0.9. The verdict takes the integrated SOL and names the busier mean."""
    ratios = {n.UTILIZATION: 1.0, n.SM_ACTIVE: 0.99, n.SM_OCCUPANCY: 0.5, n.DRAM_ACTIVE: 0.0}
    ratios |= {TENSOR: 0.0, FP32: 0.45, INT: 0.44, n.COMPUTE_SOL: 0.9}
    verdict = judge(LIMITS, Means.of(ratios, None))
    assert (verdict.code, verdict.pipe) == ("compute_bound", "fp32")
    assert judge(LIMITS, Means.of({**ratios, n.COMPUTE_SOL: 0.45}, None)).code == "stalled"


def test_override_file_changes_thresholds_and_rejects_nonsense(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("hollow_sm_active: 0.5\nhollow_for: 1m\n")
    custom = thresholds.load(path)
    assert custom.hollow_sm_active == 0.5 and custom.hollow_for == "1m"
    assert judge(custom, means(0.9, 0.45, 0.1)).code == "hollow"
    assert judge(LIMITS, means(0.9, 0.45, 0.1)).code == "partial"
    path.write_text("compute_bound_pipe: 0.9\n")
    assert judge(thresholds.load(path), means(0.98, 0.988, 0.614, 0.0, {FP32: 0.852})).code == "stalled"
    path.write_text("hollow_sm_active: 1.5\n")
    with pytest.raises(ConfigError, match="must be a ratio from 0 to 1"):
        thresholds.load(path)
    path.write_text("hollow_for: soon\n")
    with pytest.raises(ConfigError, match="must be a Prometheus duration"):
        thresholds.load(path)


def test_every_code_judge_gives_is_a_listed_code_and_every_listed_code_is_given() -> None:
    """VERDICT_CODES is the API's list (verdict.code); down comes from the sampler, the rest from judge."""
    ratios = (None, 0.0, 0.005, 0.05, 0.3, 0.6, 0.9, 1.0)
    given = {
        judge(LIMITS, means(util, sm, occ, dram, {FP32: pipe}, memory)).code
        for util in ratios
        for sm in ratios
        for occ in (None, 0.0, 0.5)
        for pipe in (0.0, 0.9)
        for dram in (None, 0.0, 0.9)
        for memory in (None, 2.0 * GIB)
    }
    assert given | {n.VERDICT_DOWN} == set(n.VERDICT_CODES)
