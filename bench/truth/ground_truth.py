"""Independent ground truth from Nsight Compute's hardware counters, for the spin kernels and the
compute-pipe and memory kernels.

``run_ncu`` profiles a child (``python3 -m bench.truth.ground_truth --target``) that launches each spin
shape once for a few milliseconds, and reads, per launch, SM active (active over elapsed SM cycles)
and achieved occupancy (active warps over the maximum, averaged over every SM).

``run_ncu_pipes`` profiles a child (``--target --pipes``) that prepares the FP32 FMA chains, the pointer
chase, a copy kernel of the copy workload's size and the bf16 GEMM, then launches each once between
cudaProfilerStart and cudaProfilerStop, and reads per launch the pipe, DRAM and SM counters of
PIPE_METRICS (those this ncu lists, ``ncu --query-metrics``, besides the ones always there).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CYCLES_ACTIVE = "sm__cycles_active.avg"
CYCLES_ELAPSED = "sm__cycles_elapsed.avg"
WARPS_ACTIVE = "sm__warps_active.avg.pct_of_peak_sustained_elapsed"
METRICS = (CYCLES_ACTIVE, CYCLES_ELAPSED, WARPS_ACTIVE)
TARGET_NANOSECONDS = 5_000_000

ELAPSED_PERCENT = ".avg.pct_of_peak_sustained_elapsed"
DURATION = "gpu__time_duration.sum"
DRAM_BYTES = "dram__bytes.sum"
DRAM_THROUGHPUT = "dram__throughput" + ELAPSED_PERCENT
TENSOR_PIPE = "sm__pipe_tensor_cycles_active" + ELAPSED_PERCENT
FMA_PIPE = "sm__pipe_fma_cycles_active" + ELAPSED_PERCENT
# Asked for whatever ncu lists: the spin run's, ncu's own Speed Of Light metrics (duration, DRAM
# throughput) and the tensor and DRAM counters CUPTI gave on an H200 (docs/validation.md).
ALWAYS_METRICS = (*METRICS, DURATION, DRAM_BYTES, DRAM_THROUGHPUT, TENSOR_PIPE)
# Asked for only where `ncu --query-metrics` lists their base name: the names differ between chips.
PIPE_BASES = (
    "sm__pipe_fma_cycles_active",
    "sm__pipe_fmaheavy_cycles_active",
    "sm__pipe_fp32_cycles_active",
    "sm__inst_executed_pipe_fma",
    "sm__pipe_alu_cycles_active",
    "sm__inst_executed_pipe_alu",
    "sm__pipe_fp16_cycles_active",
    "sm__pipe_fp64_cycles_active",
    "sm__pipe_tensor_op_hmma_cycles_active",
    "sm__pipe_tensor_op_gmma_cycles_active",
)
# The workloads the pipe run covers, in launch order; the copy is a CuPy kernel of the copy workload's
# size, since torch's device-to-device copy_ is a driver memcpy that ncu does not profile.
PIPE_TARGETS = ("fp32_fma", "pointer_chase", "copy_d2d", "gemm_bf16")
PIPE_LAUNCH_SECONDS = 0.01
_METRIC_NAME = re.compile(r"^\s*([a-z0-9]+__[a-z0-9_]+)")


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


@dataclass(frozen=True)
class Launch:
    """One profiled kernel launch: its name, shape and every numeric metric value ncu gave."""

    kernel: str
    grid: str
    block: str
    values: Mapping[str, float]

    def ratio(self, metric: str) -> float | None:
        """A ``pct_of_peak`` metric as a 0..1 ratio; None when ncu did not give it."""
        value = self.values.get(metric)
        return None if value is None else value / 100

    @property
    def sm_active(self) -> float | None:
        active, elapsed = self.values.get(CYCLES_ACTIVE), self.values.get(CYCLES_ELAPSED)
        return None if active is None or not elapsed else active / elapsed

    @property
    def dram_bytes_per_second(self) -> float | None:
        moved, nanoseconds = self.values.get(DRAM_BYTES), self.values.get(DURATION)
        return None if moved is None or not nanoseconds else moved / (nanoseconds * 1e-9)


def parse_launches(text: str) -> list[Launch]:
    """Every launch in ``ncu --csv`` output, in launch order; values that are not numbers are left out."""
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    heads: dict[int, tuple[str, str, str]] = {}
    values: dict[int, dict[str, float]] = {}
    for row in rows:
        launch = int(row["ID"])
        heads.setdefault(launch, (row["Kernel Name"], row["Grid Size"], row["Block Size"]))
        try:
            values.setdefault(launch, {})[row["Metric Name"]] = _number(row["Metric Value"])
        except ValueError:
            values.setdefault(launch, {})
    return [Launch(*heads[launch], values[launch]) for launch in sorted(heads)]


def listed_metrics(text: str) -> set[str]:
    """Base metric names in ``ncu --query-metrics`` output."""
    return {m.group(1) for line in text.splitlines() if (m := _METRIC_NAME.match(line))}


def pipe_metrics(listed: Iterable[str]) -> list[str]:
    """ALWAYS_METRICS and, of PIPE_BASES, those ``listed``, as ratios of their peak over elapsed cycles."""
    there = set(listed)
    return [*ALWAYS_METRICS, *(base + ELAPSED_PERCENT for base in PIPE_BASES if base in there)]


def assign(launches: Sequence[Launch], names: Sequence[str]) -> dict[str, Launch]:
    """Each pipe-run launch by the workload it stands for: the harness' own kernels by name, the GEMM
    the longest of the rest (cuBLAS' kernel names vary by version)."""
    from bench.truth.workloads import CHASE_KERNEL, COPY_KERNEL, FMA_KERNEL

    own = {FMA_KERNEL: "fp32_fma", CHASE_KERNEL: "pointer_chase", COPY_KERNEL: "copy_d2d"}
    found: dict[str, Launch] = {}
    others = []
    for launch in launches:
        name = next((w for kernel, w in own.items() if kernel in launch.kernel), None)
        if name is None:
            others.append(launch)
        elif name in names:
            found[name] = launch
    if "gemm_bf16" in names and others:
        found["gemm_bf16"] = max(others, key=lambda launch: launch.values.get(DURATION, 0.0))
    return found


@dataclass(frozen=True)
class NcuPipeRun:
    available: bool
    reason: str  # why not, when not
    kernels: Mapping[str, Launch]  # by workload name
    output: str
    metrics: tuple[str, ...] = ()


def _profile_pipes(
    ncu: str, metrics: Sequence[str], names: Sequence[str], gpu: int, timeout: float
) -> tuple[subprocess.CompletedProcess[str] | None, str]:
    """ncu over the pipe target; (None, output so far) when it ran out of time."""
    argv = [ncu, "--clock-control", "none", "--csv", "--profile-from-start", "off", "--print-units", "base"]
    argv += ["--metrics", ",".join(metrics), sys.executable, "-m", "bench.truth.ground_truth", "--target"]
    argv += ["--pipes", "--gpu", str(gpu), *names]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired as exc:
        return None, str(exc.stdout or "") + str(exc.stderr or "")
    return done, done.stdout + done.stderr


def run_ncu_pipes(names: Sequence[str], gpu: int, timeout: float = 240) -> NcuPipeRun:
    """Profile one launch of each of the workloads ``names`` (those of PIPE_TARGETS) with ncu, clocks left
    as they are."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return NcuPipeRun(False, "ncu is not installed", {}, "")
    names = [name for name in PIPE_TARGETS if name in names]
    try:
        query = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        query = subprocess.CompletedProcess([], 1, "", "")
    metrics = tuple(pipe_metrics(listed_metrics(query.stdout) if query.returncode == 0 else ()))
    done, output = _profile_pipes(ncu, metrics, names, gpu, timeout)
    if done is not None and done.returncode != 0 and len(metrics) > len(ALWAYS_METRICS):
        # One metric this ncu lists but cannot collect fails the whole run: again with ALWAYS_METRICS.
        metrics = ALWAYS_METRICS
        done, retried = _profile_pipes(ncu, metrics, names, gpu, timeout)
        output += "\n==== again with ALWAYS_METRICS only\n" + retried
    if done is None:
        return NcuPipeRun(False, f"ncu did not finish within {timeout:.0f} s", {}, output, metrics)
    if done.returncode != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        return NcuPipeRun(False, f"ncu exited with {done.returncode}: {last[0]}", {}, output, metrics)
    try:
        kernels = assign(parse_launches(done.stdout), names)
    except (ValueError, KeyError) as exc:
        return NcuPipeRun(False, f"ncu output not understood: {exc}", {}, output, metrics)
    lacking = [name for name in names if name not in kernels]
    reason = f"no launch of {', '.join(lacking)} in ncu's output" if lacking else ""
    return NcuPipeRun(bool(kernels), reason, kernels, output, metrics)


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


def _profiler(start: bool) -> None:
    """cudaProfilerStart or cudaProfilerStop: what ncu --profile-from-start off profiles in between."""
    import cupy  # type: ignore[import-not-found,unused-ignore]

    runtime: Any = cupy.cuda.runtime
    call = getattr(runtime, "profilerStart" if start else "profilerStop", None)
    if call is None:  # a CuPy without the wrappers: PyTorch's
        import torch  # type: ignore[import-not-found,unused-ignore]

        call = torch.cuda.profiler.start if start else torch.cuda.profiler.stop
    call()


def _target_pipes(gpu: int, names: Sequence[str]) -> None:
    """Prepare the named pipe workloads (compile, allocate, warm up), then launch each once inside the
    profiled range (run under ncu)."""
    import cupy  # type: ignore[import-not-found,unused-ignore]
    from bench.truth.device import read_limits
    from bench.truth.workloads import pipe_targets

    limits = read_limits(gpu)
    targets = pipe_targets(limits, names, PIPE_LAUNCH_SECONDS)
    for target in targets:
        target.prepare()
    cupy.cuda.Device().synchronize()
    _profiler(True)
    for target in targets:
        target.launch_once()
    cupy.cuda.Device().synchronize()
    _profiler(False)
    for target in targets:
        target.release()


def main() -> int:
    parser = argparse.ArgumentParser(description="Launch kernels for ncu (used by the truth harness).")
    parser.add_argument("--target", action="store_true", required=True)
    parser.add_argument("--pipes", action="store_true", help="the pipe workloads, not the spin shapes")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    (_target_pipes if args.pipes else _target)(args.gpu, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
