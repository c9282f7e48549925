"""Verdicts on the H200 reference measurements (../shared/reference/h200-gpm-probe.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smlens import names as n
from smlens.errors import ConfigError
from smlens.verdicts import thresholds
from smlens.verdicts.judge import judge

LIMITS = thresholds.load()


@pytest.mark.parametrize(
    ("util", "sm", "occ", "tensor", "dram", "code"),
    [
        (0.0, 0.0, 0.0, 0.0, 0.0, "idle"),
        (1.0, 0.00757, 0.00012, 0.0, 0.0, "hollow"),  # spin kernel, 1 block x 1 warp
        (1.0, 0.9999, 0.0156, 0.0, 0.0, "low_occupancy"),  # one warp per SM
        (1.0, 0.9998, 0.4999, 0.0, 0.0, "working"),  # 1024 threads per SM
        (0.992, 0.959, 0.142, 0.931, 0.173, "working"),  # bf16 GEMM 8192^3: low occupancy, tensor busy
        (0.313, 0.119, 0.017, 0.0025, 0.0, "partial"),  # launch-bound tiny GEMMs
        (0.992, 0.986, 0.797, 0.0, 0.88, "memory_bound"),  # 2 GiB device copy
        (1.0, None, None, None, None, "no_profiling"),
        (None, None, None, None, None, "unknown"),
        (None, 0.00757, 0.00012, 0.0, 0.0, "sm_underused"),  # utilization not read in the window
        (None, 0.0, 0.0, 0.0, 0.0, "idle"),
        (None, 0.959, 0.142, 0.931, 0.173, "working"),
    ],
)
def test_reference_workloads(
    util: float | None,
    sm: float | None,
    occ: float | None,
    tensor: float | None,
    dram: float | None,
    code: str,
) -> None:
    assert judge(LIMITS, util, sm, occ, tensor, dram).code == code


def test_override_file_changes_thresholds_and_rejects_nonsense(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("hollow_sm_active: 0.5\nhollow_for: 1m\n")
    custom = thresholds.load(path)
    assert custom.hollow_sm_active == 0.5 and custom.hollow_for == "1m"
    assert judge(custom, 0.9, 0.45, 0.1, 0.0, 0.0).code == "hollow"
    assert judge(LIMITS, 0.9, 0.45, 0.1, 0.0, 0.0).code == "partial"
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
        judge(LIMITS, util, sm, occ, tensor, dram).code
        for util in ratios
        for sm in ratios
        for occ in ratios
        for tensor in (None, 0.0, 0.9)
        for dram in (None, 0.0, 0.9)
    }
    assert given | {n.VERDICT_DOWN} == set(n.VERDICT_CODES)
