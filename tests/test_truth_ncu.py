"""Parsing Nsight Compute's CSV (a real ncu 2025.3 run on an H200, trimmed to three launches)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.truth.ground_truth import parse_csv

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
