"""The truth harness: runs controlled workloads on one GPU while the shipped exporter watches, and checks
that smlens reports what the physics says.

    PYTHONPATH=exporter python3 -m bench.truth [--gpu 0] [--out truth-out]

Steps: the bare cost of smlens' NVML/GPM calls (bench/nvml_call_cost.py); ``smlens serve --backend
auto`` (shipped defaults) on a loopback port; each workload (or those of --workloads) for a window,
reading /metrics (gauges, and the exact means from the *_seconds_total counters), judging the window
means with smlens' own verdict (smlens.verdicts.judge) and, for the workloads of expect.VERDICTS, also
running ``smlens check``; smlens' sampling cost over the whole run; /metrics latency idle and under a
GEMM; the exporter as user ``nobody``; ncu's hardware counters on the spin kernels and on the pipe and
memory kernels. Prints a table, writes results to --out, exits 1 if any check fails and 2 if the harness
cannot start (no GPU, no CuPy...).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.truth.compare import (
    Outcome,
    RawCost,
    Verdict,
    WorkloadReading,
    judge_accounting,
    judge_cost,
    judge_latency,
    judge_verdicts,
    judge_workload,
    ncu_outcomes,
    ncu_pipe_outcomes,
    raw_cost,
    unprivileged_outcomes,
    window_verdict,
)
from bench.truth.expect import VERDICTS, checks_for, spin_shapes
from bench.truth.exporter import (
    METRIC_GROUP_ARGS,
    PROMETHEUS_ACCEPT,
    REPO,
    CheckRun,
    Exporter,
    latencies,
    smlens_env,
    verdict_of,
)
from bench.truth.metrics import (
    Scrape,
    gauge_medians,
    median_gauge,
    sampling_cost,
    seconds_by_verdict,
    window_means,
)
from bench.truth.report import markdown, outcomes_table, summary, tally

# `smlens check` runs twice per verdict workload, side by side: with its default duration, and long
# enough to span one read of NVML's utilization samples (made every few seconds only).
CHECK_DEFAULT_SECONDS = 3.0
LATENCY_UNDER = ("idle", "gemm_bf16")


def say(message: str) -> None:
    print(message, flush=True)


def utilization_interval() -> float:
    """Seconds between the nvml backend's reads of NVML's utilization samples (0: every tick)."""
    from smlens.sources.nvml import backend as nvml

    return float(getattr(nvml, "DEFAULT_UTILIZATION_INTERVAL", 0.0))


@dataclass(frozen=True)
class Timing:
    """How long each phase lasts, derived from the exporter's sampling cadence."""

    interval: float  # exporter sampling interval
    warmup: float  # a workload runs this long before its window: every gauge then reflects it
    window: float
    checks: tuple[float, ...]  # durations of the `smlens check` runs of a verdict workload

    @staticmethod
    def derive(interval: float, utilization_every: float) -> Timing:
        checks: tuple[float, ...] = (CHECK_DEFAULT_SECONDS,)
        if utilization_every >= CHECK_DEFAULT_SECONDS:
            checks += (utilization_every + 1.5,)
        return Timing(
            interval,
            warmup=utilization_every + 2 * interval,
            window=max(max(checks) + 3.5, utilization_every + 2 * interval, 7.0),
            checks=checks,
        )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    from smlens.cli import _Parser  # one line and exit 2 on bad flags, as smlens' own CLI does

    parser = _Parser(prog="python3 -m bench.truth", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to test (default 0)")
    parser.add_argument("--out", type=Path, default=Path("truth-out"), help="results folder")
    parser.add_argument("--interval", type=float, default=1.0, help="exporter sampling interval, s")
    parser.add_argument("--requests", type=int, default=200, help="requests per latency measurement")
    parser.add_argument("--no-ncu", action="store_true", help="skip the ncu ground truth")
    parser.add_argument("--no-unprivileged", action="store_true", help="skip the run as user nobody")
    parser.add_argument(
        "--workloads",
        type=lambda text: tuple(name for name in text.split(",") if name),
        default=(),
        metavar="NAME,...",
        help="run only these workloads, in the harness' order (default: all)",
    )
    args = parser.parse_args(argv)
    if not 0.1 <= args.interval <= 5 or args.requests < 1 or args.gpu < 0:
        parser.error("--interval must be from 0.1 to 5 s, --requests at least 1 and --gpu at least 0")
    return args


def _call_cost(out: Path, gpu: int) -> RawCost | None:
    path = out / "nvml_call_cost.json"
    argv = [sys.executable, str(REPO / "bench" / "nvml_call_cost.py"), "--json", str(path)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=smlens_env())
    except subprocess.TimeoutExpired:
        say("bench/nvml_call_cost.py did not finish within 300 s")
        return None
    say(done.stdout + done.stderr)
    if done.returncode != 0 or not path.exists():
        return None
    return raw_cost(json.loads(path.read_text()), gpu)


def _latency(exporter: Exporter, requests: int) -> tuple[list[float], list[float]]:
    scrape = {"Accept-Encoding": "gzip", "Accept": PROMETHEUS_ACCEPT}  # what Prometheus sends
    metrics = latencies(exporter.client, "/metrics", requests, scrape)
    healthy = latencies(exporter.client, "/-/healthy", requests, {"Accept-Encoding": "identity"})
    return metrics, healthy


def _verdict(run: CheckRun, seconds: float, gpu: int) -> Verdict:
    try:
        code, text, _, pipe = verdict_of(run.result(), gpu)
    except (RuntimeError, KeyError, ValueError) as exc:
        return Verdict(seconds, None, f"smlens check failed: {exc}")
    return Verdict(seconds, code, text, pipe)


def _measure(
    workload: Any, exporter: Exporter, timing: Timing, args: argparse.Namespace
) -> tuple[WorkloadReading, list[Outcome]]:
    """Run one workload through its window; the reading and, for some, the latency outcome."""
    from bench.truth.workloads import Running, rate

    name, gpu = workload.name, str(args.gpu)
    base = {"name": name, "description": workload.description, "unit": workload.unit}
    try:
        workload.prepare()
    except Exception as exc:
        workload.release()
        return WorkloadReading(rates={}, gauges={}, error=f"prepare failed: {exc}", **base), []
    running = Running(workload)
    latency: list[Outcome] = []
    verdicts: list[Verdict] = []
    failure = ""
    try:
        time.sleep(timing.warmup)
        checks = [(s, CheckRun(s)) for s in timing.checks] if name in VERDICTS else []
        scrapes: list[Scrape] = [exporter.scrape()]
        start = running.progress()
        deadline = scrapes[0].at + timing.window
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(timing.interval, left))
            scrapes.append(exporter.scrape())
        end = running.progress()
        if name in LATENCY_UNDER:
            latency.append(judge_latency(f"during {name}", *_latency(exporter, args.requests)))
        verdicts = [_verdict(run, seconds, args.gpu) for seconds, run in checks]
    finally:
        try:
            running.stop()
        except Exception as exc:
            failure = f"workload failed: {exc}"
        workload.release()
    return (
        WorkloadReading(
            rates=window_means(scrapes[0], scrapes[-1], gpu),
            accounted=seconds_by_verdict(scrapes[0], scrapes[-1], gpu),
            window_seconds=scrapes[-1].at - scrapes[0].at,
            gauges=gauge_medians(scrapes[1:], gpu),
            achieved=rate(start, end) if workload.unit else None,
            verdicts=tuple(verdicts),
            error=failure,
            **base,
        ),
        latency,
    )


def _gpm_request_outcome() -> Outcome:
    from smlens.sources.nvml.gpm import METRICS

    names = [metric.removeprefix("NVML_GPM_METRIC_") for _, metric in METRICS]
    return Outcome(
        "cost",
        "sampling",
        "GPM metrics asked per tick",
        "no GRAPHICS_UTIL (~1.5 ms per call, repeats NVML utilization)",
        f"{len(names)}: {', '.join(names)}",
        "GRAPHICS_UTIL" not in names,
    )


def chosen(workloads: list[Any], names: tuple[str, ...]) -> list[Any]:
    """The workloads named (all when none is), in the harness' order; ValueError naming unknown ones."""
    if not names:
        return workloads
    unknown = sorted(set(names) - {w.name for w in workloads})
    if unknown:
        known = ", ".join(w.name for w in workloads)
        raise ValueError(f"no workload {', '.join(unknown)}; there are {known}")
    return [w for w in workloads if w.name in names]


def run(args: argparse.Namespace, command: str) -> int:
    from bench.truth.device import environment, read_limits
    from bench.truth.ground_truth import PIPE_TARGETS, run_ncu, run_ncu_pipes
    from bench.truth.unprivileged import run_unprivileged
    from bench.truth.workloads import make_workloads

    from smlens.verdicts.thresholds import load

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        env = environment(args.gpu)
        limits = read_limits(args.gpu)
    except ImportError:
        raise
    except Exception as exc:  # NVML or CUDA cannot start: nothing to test
        print(f"truth harness: cannot read GPU {args.gpu}: {exc}", file=sys.stderr)
        return 2
    say(env.pop("nvidia_smi"))
    say(json.dumps(env, indent=1))
    say(json.dumps(dataclasses.asdict(limits), indent=1))
    try:
        workloads = chosen(make_workloads(limits), args.workloads)
    except ValueError as exc:
        print(f"truth harness: {exc}", file=sys.stderr)
        return 2
    thresholds = load()
    timing = Timing.derive(args.interval, utilization_interval())
    say(f"timing: {timing}")
    raw = _call_cost(out, args.gpu)

    readings: list[WorkloadReading] = []
    latency: list[Outcome] = []
    idle_cost = None
    with Exporter(out / "exporter.log", args.interval, *METRIC_GROUP_ARGS) as exporter:
        exporter.wait_ready()
        time.sleep(timing.warmup)
        first = exporter.scrape()
        gpus = len(first.samples.get("gpu_up", {}))
        root_families = first.families(gpu=str(args.gpu))
        root_state = next(g for g in exporter.gpus()["gpus"] if g["index"] == args.gpu)
        for workload in workloads:
            say(f"== {workload.name}: {workload.description}")
            before = exporter.scrape()
            reading, measured_latency = _measure(workload, exporter, timing, args)
            if not reading.error:
                judged = window_verdict(thresholds, reading.rates, reading.gauges)
                reading = dataclasses.replace(reading, judged=judged)
            if workload.name == "idle":
                idle_cost = sampling_cost(before, exporter.scrape(), gpus)
            latency += measured_latency
            readings.append(reading)
            say(f"   {reading.rates}\n   {reading.judged} {reading.verdicts} {reading.error}")
        last = exporter.scrape()
    run_cost = sampling_cost(first, last, gpus)
    tick = median_gauge([first, last], "smlens_tick_duration_seconds")

    outcomes: list[Outcome] = []
    by_name = {r.name: r for r in readings}
    for reading in readings:
        checks = checks_for(reading.name, limits, reading.achieved, reading.sm_clock_hz)
        outcomes += judge_workload(reading, checks)
    for reading in readings:
        if reading.name in VERDICTS:
            outcomes += judge_verdicts(reading, VERDICTS[reading.name])
            outcomes += judge_accounting(reading, VERDICTS[reading.name], args.interval)
    outcomes += judge_cost(run_cost, idle_cost, raw, args.interval)
    if tick is not None and gpus:
        tick_text = f"{tick / gpus * 1e6:.0f} us (last tick before each of two scrapes, median)"
        outcomes.append(Outcome("cost", "sampling", "whole tick per GPU", "information", tick_text, None))
    outcomes.append(_gpm_request_outcome())
    outcomes += latency
    if not args.no_unprivileged:
        unprivileged = run_unprivileged(
            root_families, args.gpu, out / "exporter-nobody.log", args.interval, timing.warmup
        )
        outcomes += unprivileged_outcomes(unprivileged, root_state.get("missing", {}))
    if not args.no_ncu:
        spins = [name for name in spin_shapes(limits) if name in by_name]
        if spins:
            say("== ncu on the spin kernels")
            ncu = run_ncu(spins, args.gpu)
            (out / "ncu.txt").write_text(ncu.output)
            outcomes += ncu_outcomes(ncu, limits, by_name)
        targets = [name for name in PIPE_TARGETS if name in by_name]
        if targets:
            say("== ncu on the pipe and memory kernels")
            pipes = run_ncu_pipes(targets, args.gpu)
            if pipes.output:
                (out / "ncu_pipes.txt").write_text(pipes.output)
            outcomes += ncu_pipe_outcomes(pipes, limits, by_name)

    (out / "validation.md").write_text(markdown(env, limits, readings, outcomes, command) + "\n")
    results = {
        "command": command,
        "environment": env,
        "limits": dataclasses.asdict(limits),
        "timing": dataclasses.asdict(timing),
        "readings": [dataclasses.asdict(r) for r in readings],
        "outcomes": [dataclasses.asdict(o) for o in outcomes],
    }
    (out / "truth.json").write_text(json.dumps(results, indent=1, default=str))
    say("\n" + summary(readings, markdown=False))
    say("\n" + outcomes_table(outcomes, markdown=False))
    say("\n" + tally(outcomes))
    return 1 if any(o.passed is False for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # Before CUDA starts: the workloads' CUDA device 0 is the GPU of NVML index --gpu (NVML ignores both).
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    command = "python3 -m bench.truth " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        return run(args, command.strip())
    except ImportError as exc:
        print(f"truth harness: {exc.name or exc} is not installed; it runs on a GPU host.", file=sys.stderr)
        return 2
