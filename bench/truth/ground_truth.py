"""Independent ground truth from Nsight Compute's hardware counters, for the spin kernels.

``run_ncu`` profiles a child (``python3 -m bench.truth.ground_truth --target``) that launches each spin
shape once for a few milliseconds, and reads, per launch, SM active (active over elapsed SM cycles)
and achieved occupancy (active warps over the maximum, averaged over every SM).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CYCLES_ACTIVE = "sm__cycles_active.avg"
CYCLES_ELAPSED = "sm__cycles_elapsed.avg"
WARPS_ACTIVE = "sm__warps_active.avg.pct_of_peak_sustained_elapsed"
METRICS = (CYCLES_ACTIVE, CYCLES_ELAPSED, WARPS_ACTIVE)
TARGET_NANOSECONDS = 5_000_000


@dataclass(frozen=True)
class KernelTruth:
    grid: str
    block: str
    sm_active: float
    occupancy: float


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_csv(text: str, kernel: str) -> list[KernelTruth]:
    """Per launch of ``kernel``, in launch order, from ``ncu --csv`` output (other lines are skipped)."""
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    launches: dict[int, dict[str, str]] = {}
    for row in rows:
        if kernel not in row.get("Kernel Name", ""):
            continue
        launch = launches.setdefault(int(row["ID"]), {"grid": row["Grid Size"], "block": row["Block Size"]})
        launch[row["Metric Name"]] = row["Metric Value"]
    truths = []
    for _, values in sorted(launches.items()):
        if any(metric not in values for metric in METRICS):
            raise ValueError(f"ncu output lacks one of {', '.join(METRICS)} for a launch of {kernel}.")
        elapsed = _number(values[CYCLES_ELAPSED])
        truths.append(
            KernelTruth(
                grid=values["grid"],
                block=values["block"],
                sm_active=_number(values[CYCLES_ACTIVE]) / elapsed if elapsed else 0.0,
                occupancy=_number(values[WARPS_ACTIVE]) / 100,
            )
        )
    return truths


@dataclass(frozen=True)
class NcuRun:
    available: bool
    reason: str  # why not, when not
    truths: Mapping[str, KernelTruth]  # by workload name
    output: str


def run_ncu(names: Sequence[str], gpu: int, timeout: float = 240) -> NcuRun:
    """Profile the spin shapes ``names`` (in this order) with ncu, clocks left as they are."""
    from bench.truth.workloads import SPIN_KERNEL

    ncu = shutil.which("ncu")
    if ncu is None:
        return NcuRun(False, "ncu is not installed", {}, "")
    argv = [
        ncu,
        "--clock-control",
        "none",
        "--csv",
        "--metrics",
        ",".join(METRICS),
        "--kernel-name",
        SPIN_KERNEL,
        sys.executable,
        "-m",
        "bench.truth.ground_truth",
        "--target",
        "--gpu",
        str(gpu),
        *names,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return NcuRun(False, f"ncu did not finish within {timeout:.0f} s", {}, "")
    output = done.stdout + done.stderr
    if done.returncode != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        return NcuRun(False, f"ncu exited with {done.returncode}: {last[0]}", {}, output)
    try:
        truths = parse_csv(done.stdout, SPIN_KERNEL)
    except (ValueError, KeyError) as exc:
        return NcuRun(False, f"ncu output not understood: {exc}", {}, output)
    if len(truths) != len(names):
        return NcuRun(False, f"ncu reported {len(truths)} launches, expected {len(names)}", {}, output)
    return NcuRun(True, "", dict(zip(names, truths, strict=True)), output)


def _target(gpu: int, names: Sequence[str]) -> None:
    """Launch each named spin shape once (run under ncu)."""
    from bench.truth.device import read_limits
    from bench.truth.expect import spin_shapes
    from bench.truth.workloads import SpinWorkload

    limits = read_limits(gpu)
    shapes = spin_shapes(limits)
    for name in names:
        SpinWorkload(name, shapes[name], limits).launch(TARGET_NANOSECONDS)


def main() -> int:
    parser = argparse.ArgumentParser(description="Launch spin kernels for ncu (used by the truth harness).")
    parser.add_argument("--target", action="store_true", required=True)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    _target(args.gpu, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
