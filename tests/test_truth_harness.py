"""The truth harness end to end where no GPU is: its measurement of a real exporter process on the
simulated node, its timing, its workload runner, and its refusal to run without a GPU.

The GPU part itself (CuPy/PyTorch workloads, NVML, ncu) runs only on a GPU host; here it is skipped."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.truth.compare import judge_workload, window_verdict
from bench.truth.expect import DeviceLimits, checks_for
from bench.truth.exporter import REPO, CheckRun, Exporter, smlens_env, verdict_of
from bench.truth.harness import Timing, _measure, chosen
from bench.truth.workloads import Running, Workload, make_workloads, rate

from conftest import GPU_ONLY
from smlens import names as n
from smlens.verdicts.thresholds import load

HAS_GPU = shutil.which("nvidia-smi") is not None and importlib.util.find_spec("cupy") is not None
# The simulated node's GPUs have 132 SMs of 64 warps (smlens.sources.sim).
SIM_LIMITS = DeviceLimits("sim", 132, 2048, 1024, 233472, 232448, 1024, 60 << 20, None)
SIM_IDLE_GPU, SIM_SINGLE_SM_GPU, SIM_HEALTHY_GPU = 6, 2, 0  # smlens.sources.sim.DEFAULT_LAYOUT


@pytest.fixture(scope="module")
def sim_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    log = tmp_path_factory.mktemp("truth") / "exporter.log"
    with Exporter(log, 0.2, backend="sim") as exporter:
        exporter.wait_ready()
        yield exporter


def measure_sim_gpu(exporter: Exporter, gpu: int, judged_as: str) -> list[bool | None]:
    timing = Timing(interval=0.2, warmup=0.3, window=1.5, checks=())
    reading, latency = _measure(Workload(), exporter, timing, argparse.Namespace(gpu=gpu, requests=20))
    assert reading.error == "" and len(latency) == 1  # the idle workload also measures /metrics latency
    return [o.passed for o in judge_workload(reading, checks_for(judged_as, SIM_LIMITS))]


def test_an_idle_gpu_passes_the_idle_checks(sim_exporter: Exporter) -> None:
    assert measure_sim_gpu(sim_exporter, SIM_IDLE_GPU, "idle") == [True] * 5


def test_a_single_sm_gpu_passes_the_one_warp_checks(sim_exporter: Exporter) -> None:
    assert measure_sim_gpu(sim_exporter, SIM_SINGLE_SM_GPU, "spin_one_warp") == [True] * 4


def test_the_window_means_carry_every_pipe_and_get_smlens_verdict(sim_exporter: Exporter) -> None:
    timing = Timing(interval=0.2, warmup=0.3, window=1.5, checks=())
    args = argparse.Namespace(gpu=SIM_SINGLE_SM_GPU, requests=1)
    reading, _ = _measure(Workload(), sim_exporter, timing, args)
    assert all(reading.rates[key] is not None for key in (n.COMPUTE_SOL, n.FP32_ACTIVE, n.INTEGER_ACTIVE))
    assert reading.gauges[n.MEMORY_USED_BYTES] is not None and reading.sm_clock_hz
    assert window_verdict(load(), reading.rates, reading.gauges).code == n.VERDICT_HOLLOW


def test_a_busy_gpu_fails_the_idle_checks(sim_exporter: Exporter) -> None:
    outcomes = measure_sim_gpu(sim_exporter, SIM_HEALTHY_GPU, "idle")
    assert outcomes == [False, False, False, False, False]


def test_timing_spans_the_utilization_cadence() -> None:
    every_tick = Timing.derive(1.0, 0.0)
    assert every_tick.checks == (3.0,) and every_tick.warmup == 2.0 and every_tick.window == 7.0
    spaced = Timing.derive(1.0, 5.0)
    assert spaced.checks == (3.0, 6.5)  # the second check spans one utilization read
    assert spaced.warmup == 7.0 and spaced.window == 10.0


def test_the_runner_counts_progress_and_surfaces_failures() -> None:
    running = Running(Workload())
    time.sleep(0.25)
    first = running.progress()
    time.sleep(0.25)
    last = running.progress()
    running.stop()
    assert last.at > first.at and rate(first, last) == 0.0
    assert rate(last, last) is None

    class Broken(Workload):
        def step(self) -> float:
            raise RuntimeError("launch failed")

    broken = Running(Broken())
    time.sleep(0.05)
    assert isinstance(broken.failed(), RuntimeError)
    with pytest.raises(RuntimeError, match="launch failed"):
        broken.stop()


def truth(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.truth", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=smlens_env(),
    )


@pytest.mark.skipif(HAS_GPU, reason=GPU_ONLY + "this host has a GPU: the harness would run for real")
def test_without_a_gpu_it_says_so_in_one_sentence(tmp_path: Path) -> None:
    done = truth("--out", str(tmp_path), timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("truth harness: ")


def test_bad_flags_get_one_line() -> None:
    done = truth("--interval", "0", timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(
    not HAS_GPU,
    reason=GPU_ONLY + "needs an NVIDIA GPU with CuPy and PyTorch: run python3 -m bench.truth on a GPU host",
)
def test_every_check_passes_on_this_gpu(tmp_path: Path) -> None:
    done = truth("--out", str(tmp_path), "--no-ncu", "--no-unprivileged", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_check_runs_report_hollow_gpus_rather_than_failing() -> None:
    """The harness judges check's verdicts itself: a hollow GPU (sim GPU 2) is an answer, not an error,
    although `smlens check` alone exits 3 for it (found on the H200: the harness read exit 3 as a failure)."""
    report = CheckRun(0.5, "sim").result()
    codes = {gpu["index"]: gpu["verdict"]["code"] for gpu in report["gpus"]}
    assert codes[SIM_SINGLE_SM_GPU] == "hollow"
    code, _, means, pipe = verdict_of(report, SIM_SINGLE_SM_GPU)
    assert code == "hollow" and pipe is None and n.COMPUTE_SOL in means


def test_workloads_chosen_by_name_keep_the_harness_order() -> None:
    every = make_workloads(SIM_LIMITS)
    assert [w.name for w in chosen(every, ("gpt2_train", "idle", "fp32_fma"))] == [
        "idle",
        "fp32_fma",
        "gpt2_train",
    ]
    assert chosen(every, ()) == every
    with pytest.raises(ValueError, match="no workload nope; there are idle, spin_one_warp"):
        chosen(every, ("nope", "idle"))
