"""The judging of the profile truth harness (bench/truth/profile_truth.py), without a GPU: a reference that
was asked for and came back empty is a failure; one skipped on request is named in the summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.truth.profile_truth import judge_all

SHAPES = {  # (SMs, blocks per SM, threads per block) of a 4-SM, 64-warp-per-SM toy GPU
    "spin_one_warp": (1, 1, 32),
    "spin_half_sms": (2, 1, 32),
    "spin_warp_per_sm": (4, 1, 32),
    "spin_full_occupancy": (4, 2, 1024),
}
CHILD = {"sm_count": 4, "max_warps_per_sm": 64, "shapes": SHAPES}
STEADY_METRICS = ("sm_active", "occupancy", "tensor", "dram")


def physics(name: str) -> dict[str, float]:
    sms, per_sm, threads = SHAPES[name]
    return {"sm_active": sms / 4, "occupancy": sms * per_sm * threads / 32 / (4 * 64), "tensor": 0.0}


def measured() -> dict[str, dict[str, float]]:
    phases = {name: physics(name) for name in SHAPES}
    phases["gemm_bf16"] = {"sm_active": 0.9, "occupancy": 0.2, "tensor": 0.7}
    phases["launch_bound"] = {"sm_active": 0.1, "occupancy": 0.02, "tensor": 0.05}
    phases["idle"] = {"sm_active": 0.0}
    return phases


def results() -> dict[str, object]:
    return {"schedule": measured(), "step": {"stamped_mean_s": 0.5, "detected": {"seconds": 0.5}}}


def steady() -> dict[str, dict[str, dict[str, float]]]:
    same = {name: {**metrics, "dram": 0.1} for name, metrics in measured().items()}
    same["gemm_tiny_launch_bound"] = same.pop("launch_bound")
    return {name: {"gpm": metrics, "pm": metrics} for name, metrics in same.items() if name != "idle"}


def ncu() -> dict[str, dict[str, float]]:
    return {name: physics(name) for name in SHAPES}


def test_every_reference_present_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert judge_all(results(), CHILD, ncu(), steady(), tmp_path) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(" passed, 0 failed")


@pytest.mark.parametrize("lost", ["ncu", "steady"])
def test_a_reference_that_came_back_empty_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lost: str
) -> None:
    references = {"ncu": ncu(), "steady": steady(), lost: {}}
    assert judge_all(results(), CHILD, references["ncu"], references["steady"], tmp_path) == 1
    out = capsys.readouterr().out
    reference = "ncu" if lost == "ncu" else "GPM steady"
    assert f"FAIL phase   spin_one_warp          sm_active  {reference}" in out


def test_references_skipped_on_request_are_named_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    skipped = frozenset({"ncu", "GPM steady", "PM steady"})
    assert judge_all(results(), CHILD, {}, {}, tmp_path, skipped) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(" passed, 0 failed; references skipped on request: GPM steady, PM steady, ncu")
