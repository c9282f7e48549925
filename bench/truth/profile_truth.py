"""The truth test of ``smlens profile``: known phases on the GPU, captured by smlens' PM sampling session
from another process, each phase's mean checked against physics, Nsight Compute and NVML GPM.

    PYTHONPATH=exporter python3 -m bench.truth.profile_truth --out DIR [--interval-us 100] [--no-ncu]

Steps: GPU memory of the capture (NVML, before any workload); the phase schedule (bench/truth/phases.py
``schedule``) under capture; the first probe's cold layout under capture; every workload steady under capture
with GPM read beside it; bf16 GEMM throughput with the capture on and off; a second ``smlens profile`` and an
``ncu`` run while a capture is on; ncu on the spin kernels. Writes DIR/profile_truth.json, DIR/*.json
recordings and DIR/profile_validation.md; exits 1 if a check fails, 2 if it cannot start.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smlens.profile import analysis
from smlens.profile.recording import Recording
from smlens.verdicts import thresholds

POINTS = 0.02  # SM active and occupancy within 2 points of the reference
PERIOD_SHARE = 0.05  # step period within 5 %
GUARD_NS = 1_000_000  # excluded at each edge of a phase (edges are where two phases share a sample)
SCHEDULE_BUSY = {"spin_one_warp", "spin_half_sms", "spin_warp_per_sm", "spin_full_occupancy", "gemm_bf16"}


def say(text: str) -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class Check:
    section: str
    subject: str
    metric: str
    reference: str
    expected: float | None
    measured: float | None
    tolerance: float | None  # absolute; None: information
    note: str = ""
    skipped: bool = False  # the reference was left out on request (--no-ncu, --no-steady)

    @property
    def passed(self) -> bool | None:
        """None for information or a reference skipped on request; a reference that is missing fails."""
        if self.tolerance is None or self.skipped:
            return None
        return (
            self.expected is not None
            and self.measured is not None
            and abs(self.measured - self.expected) <= self.tolerance
        )


class Child:
    """A bench.truth.phases process that waits for ``go``."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.truth.phases", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.process.kill()
            raise RuntimeError(f"bench.truth.phases {' '.join(args)} did not start: {line!r}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def result(self) -> Any:
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        self.process.wait(timeout=120)
        return json.loads(out.strip().splitlines()[-1])


def capture_child(
    gpu: Any, interval_ns: int, args: Sequence[str], during: Callable[[], Any] | None = None
) -> tuple[Recording, Any, Any]:
    """Run one child under a capture; ``during`` runs (in this thread) right after the child starts."""
    from smlens.profile.cupti_session import Session

    child = Child(*args)
    extra: dict[str, Any] = {}
    helper = None
    if during is not None:  # beside the capture, which keeps decoding meanwhile
        helper = threading.Thread(target=lambda: extra.update(during()), daemon=True)
    with Session(gpu, interval_ns) as session:
        session.start()
        child.go()
        if helper is not None:
            helper.start()
        while child.process.poll() is None or (helper is not None and helper.is_alive()):
            time.sleep(0.1)
            session.poll()
        session.stop()
        recording = session.recording()
    return recording, child.result(), extra


def align(
    s: analysis.Series,
    names: Sequence[str],
    stamps: Sequence[int],
    busy_phases: set[str] = SCHEDULE_BUSY,
    unknown: frozenset[str] = frozenset({"launch_bound"}),
) -> tuple[int, float]:
    """The shift d (ns) such that a sample stamped t by PM sampling shows what the GPU did at t + d on
    the %globaltimer clock: least squares between measured busy and the busy the phases imply."""
    edges = np.asarray(stamps, dtype=np.float64)
    busy = np.asarray([1.0 if n in busy_phases else 0.0 for n in names[:-1]])
    known = np.asarray([0.0 if n in unknown else 1.0 for n in names[:-1]])
    cum_busy = np.concatenate([[0.0], np.cumsum(busy * np.diff(edges))])
    cum_known = np.concatenate([[0.0], np.cumsum(known * np.diff(edges))])
    start = s.start_ns.astype(np.float64)
    end = start + s.seconds * 1e9
    inside = (start > edges[0] - 1e7) & (end < edges[-1] + 1e7)
    best = (0, float("inf"))
    for shift in range(-5_000_000, 5_000_001, 10_000):
        a, b = start[inside] + shift, end[inside] + shift
        length = b - a
        expected = (np.interp(b, edges, cum_busy) - np.interp(a, edges, cum_busy)) / length
        certain = (np.interp(b, edges, cum_known) - np.interp(a, edges, cum_known)) / length > 0.999
        err = float(np.mean((s.busy[inside][certain] - expected[certain]) ** 2))
        if err < best[1]:
            best = (shift, err)
    return best


def phase_means(
    s: analysis.Series, names: Sequence[str], stamps: Sequence[int], shift: int, guard: int = GUARD_NS
) -> dict[str, dict[str, Any]]:
    """Per phase name: mean of each ratio over its samples (edges excluded), overall and per repetition."""
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names[:-1]):
        lo, hi = stamps[i] - shift + guard, stamps[i + 1] - shift - guard
        entry = out.setdefault(name, {"windows": []})
        means = {
            k: analysis.window_mean(s, k, lo, hi)[0]
            for k in ("busy", "sm_active", "occupancy", "tensor", "dram")
        }
        entry["windows"].append(
            {
                "ms": (stamps[i + 1] - stamps[i]) / 1e6,
                "n": analysis.window_mean(s, "busy", lo, hi)[1],
                **means,
            }
        )
    for entry in out.values():
        ws = [w for w in entry["windows"] if w["n"]]
        total = sum(w["n"] for w in ws)
        entry["n"] = total
        for k in ("busy", "sm_active", "occupancy", "tensor", "dram"):
            entry[k] = sum(w[k] * w["n"] for w in ws) / total if total else None
    return out


def probe_method(s: analysis.Series, names: Sequence[str], stamps: Sequence[int]) -> dict[str, float]:
    """The first probe's attribution: sample midpoints inside [stamp + 200 us, next - 200 us], no shift."""
    mid = s.start_ns + (s.seconds * 5e8).astype(np.int64)
    per: dict[str, list[float]] = {}
    for i, name in enumerate(names[:-1]):
        inside = (mid >= stamps[i] + 200_000) & (mid < stamps[i + 1] - 200_000)
        per.setdefault(name, []).extend(s.sm_active[inside].tolist())
    return {k: float(np.mean(v)) for k, v in per.items() if v}


def write_gz(path: Path, data: Any) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(data, f)


def memory_used(index: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
    finally:
        pynvml.nvmlShutdown()


def gpu_memory(gpu: Any, interval_ns: int) -> dict[str, int]:
    """NVML memory used: before, with the CUDA context, after enable+configure, while sampling."""
    from smlens.profile.cuda import retain_primary_context
    from smlens.profile.cupti_session import Session

    steps = {"before": memory_used(gpu.index)}
    retain_primary_context(gpu.cuda_ordinal)
    steps["context"] = memory_used(gpu.index)
    with Session(gpu, interval_ns) as session:
        steps["configured"] = memory_used(gpu.index)
        session.start()
        time.sleep(0.5)
        steps["sampling"] = memory_used(gpu.index)
        session.stop()
    steps["released"] = memory_used(gpu.index)
    return steps


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def second_profile() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "smlens", "profile", "--gpu", "0", "--seconds", "1", "--out", os.devnull],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {"rc": done.returncode, "stderr": done.stderr[-600:]}


def ncu_during() -> dict[str, Any]:
    from bench.truth.ground_truth import run_ncu

    run = run_ncu(["spin_one_warp"], 0, timeout=120)
    return {"available": run.available, "reason": run.reason, "tail": run.output[-800:]}


def skipped_references(args: argparse.Namespace) -> frozenset[str]:
    """The references the command line asked to leave out."""
    skipped = {"ncu"} if args.no_ncu else set()
    if args.no_steady:
        skipped |= {"GPM steady", "PM steady"}
    return frozenset(skipped)


def judge_schedule(
    phases: Mapping[str, Any],
    child: Mapping[str, Any],
    ncu: Mapping[str, Any],
    steady: Mapping[str, Any],
    skipped: frozenset[str] = frozenset(),
) -> list[Check]:
    """Every phase check against every reference not skipped on request; a missing reference fails."""
    s, w = child["sm_count"], child["max_warps_per_sm"]
    checks: list[Check] = []

    def phase(
        name: str, metric: str, reference: str, expected: float | None, tolerance: float | None
    ) -> None:
        measured = phases.get(name, {}).get(metric)
        skip = reference in skipped
        checks.append(Check("phase", name, metric, reference, expected, measured, tolerance, skipped=skip))

    for name in ("spin_one_warp", "spin_half_sms", "spin_warp_per_sm", "spin_full_occupancy"):
        sms, per_sm, threads = child["shapes"][name]
        physics = {"sm_active": sms / s, "occupancy": sms * per_sm * threads / 32 / (s * w)}
        for metric, value in physics.items():
            phase(name, metric, "physics", value, POINTS)
            phase(name, metric, "ncu", ncu.get(name, {}).get(metric), POINTS)
            phase(name, metric, "GPM steady", steady.get(name, {}).get("gpm", {}).get(metric), POINTS)
        phase(name, "tensor", "physics", 0.0, POINTS)
    for name, steady_name in (("gemm_bf16", "gemm_bf16"), ("launch_bound", "gemm_tiny_launch_bound")):
        ref = steady.get(steady_name)
        for metric in ("sm_active", "occupancy", "tensor"):
            tolerance = POINTS if metric != "tensor" else None
            phase(name, metric, "GPM steady", ref["gpm"][metric] if ref else None, tolerance)
            phase(name, metric, "PM steady", ref["pm"][metric] if ref else None, tolerance)
    phase("idle", "sm_active", "physics", 0.0, POINTS)
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval-us", type=int, default=100)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--steady-interval-us", type=int, default=1000)
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--no-steady", action="store_true", help="skip the steady workloads and GPM")
    parser.add_argument("--no-gemm-rate", action="store_true", help="skip GEMM throughput on/off")
    args = parser.parse_args(argv)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    from smlens.profile.cupti_session import ProfileError, resolve_gpu

    try:
        gpu = resolve_gpu("0")
    except ProfileError as exc:
        print(f"profile truth: {exc}", file=sys.stderr)
        return 2
    interval = args.interval_us * 1000
    results: dict[str, Any] = {
        "command": "python3 -m bench.truth.profile_truth " + " ".join(argv or sys.argv[1:]),
        "gpu": asdict(gpu),
    }

    def save() -> None:
        (out / "profile_truth.json").write_text(json.dumps(results, indent=1, default=str))

    say("== GPU memory of a capture")
    results["memory"] = gpu_memory(gpu, interval)
    say(json.dumps(results["memory"]))
    save()

    say("== phase schedule")
    rss0 = rss_mib()
    t = time.perf_counter()
    rec, child, _ = capture_child(gpu, interval, ["schedule", "--reps", str(args.reps)])
    results["schedule_wall_s"] = time.perf_counter() - t
    results["decode"] = {**rec.notes, "samples": len(rec), "rss_growth_mib": rss_mib() - rss0}
    write_gz(out / "schedule.json.gz", ({"capture": rec.to_json(), "phases": child}))
    s = analysis.series(rec)
    t = time.perf_counter()
    s = analysis.series(rec)
    results["decode"]["series_s"] = time.perf_counter() - t
    shift, err = align(s, child["names"], child["stamps"])
    results["shift_ns"], results["shift_err"] = shift, err
    phases = phase_means(s, child["names"], child["stamps"], shift)
    results["schedule"] = {k: {m: v for m, v in e.items() if m != "windows"} for k, e in phases.items()}
    results["schedule_windows"] = {k: e["windows"] for k, e in phases.items()}
    results["schedule_unshifted"] = {
        k: {m: v for m, v in e.items() if m != "windows"}
        for k, e in phase_means(s, child["names"], child["stamps"], 0).items()
    }
    idle_marks = [st for n, st in zip(child["names"], child["stamps"], strict=True) if n == "idle"]
    steps = np.diff(idle_marks) / 1e9
    lo, hi = idle_marks[0] - shift, child["stamps"][-1] - shift
    keep = (s.start_ns >= lo) & (s.start_ns < hi)
    part = analysis.Series(**{k: getattr(s, k)[keep] for k in analysis.Series.__dataclass_fields__})
    period = analysis.step_period(part)
    results["step"] = {
        "stamped_s": steps.tolist(),
        "stamped_mean_s": float(steps.mean()),
        "detected": asdict(period) if period else None,
    }
    if period:
        results["step"]["breakdown"] = asdict(analysis.breakdown(part, period, thresholds.load()))
    say(json.dumps({k: results[k] for k in ("shift_ns", "schedule", "step")}, default=str)[:3000])
    save()

    section(results, "cold", lambda: cold_section(gpu, interval, out, results))
    if not args.no_steady:
        section(results, "steady", lambda: steady_section(gpu, args, out, results, shift))
    ncu: dict[str, Any] = {}
    if not args.no_ncu:
        section(results, "ncu", lambda: ncu.update(ncu_section(results)))
    save()
    if not args.no_gemm_rate:
        section(results, "gemm_tflops", lambda: gemm_section(gpu, interval, results))
    save()
    steady = results.get("steady", {})
    return judge_all(results, child, ncu, steady, out, skipped_references(args))


def section(results: dict[str, Any], name: str, body: Callable[[], Any]) -> None:
    """Run one part of the test; a failure is recorded and the rest still runs."""
    say(f"== {name}")
    try:
        body()
    except Exception:
        results.setdefault("errors", {})[name] = traceback.format_exc()[-1500:]
        say(results["errors"][name])


def cold_section(gpu: Any, interval: int, out: Path, results: dict[str, Any]) -> None:
    rec_cold, cold, _ = capture_child(gpu, interval, ["cold", "--reps", "4"])
    write_gz(out / "cold.json.gz", ({"capture": rec_cold.to_json(), "phases": cold}))
    sc = analysis.series(rec_cold)
    cshift, _ = align(
        sc, cold["names"], cold["stamps"], {"spin_1", "spin_half", "spin_all_8w"}, frozenset({"gemm"})
    )
    results["cold"] = {
        "shift_ns": cshift,
        "probe_method": probe_method(sc, cold["names"], cold["stamps"]),
        "aligned": {
            k: {m: v for m, v in e.items() if m != "windows"}
            for k, e in phase_means(sc, cold["names"], cold["stamps"], cshift).items()
        },
        "aligned_windows": {
            k: e["windows"] for k, e in phase_means(sc, cold["names"], cold["stamps"], cshift).items()
        },
        "stamps_ms": [(b - a) / 1e6 for a, b in zip(cold["stamps"], cold["stamps"][1:], strict=False)],
    }
    say(json.dumps(results["cold"]["probe_method"]))


def steady_section(
    gpu: Any, args: argparse.Namespace, out: Path, results: dict[str, Any], shift: int
) -> None:
    """Each workload steady under a capture, GPM beside; a second profile and ncu meanwhile."""

    def during() -> Any:
        time.sleep(2.0)
        return {"second_profile": second_profile(), "ncu": ncu_during()}

    rec_steady, steady_child, coexist = capture_child(
        gpu, args.steady_interval_us * 1000, ["steady", "--seconds", "1.6"], during
    )
    write_gz(out / "steady.json.gz", ({"capture": rec_steady.to_json(), "phases": steady_child}))
    results["coexistence"] = coexist
    ss = analysis.series(rec_steady)
    to_pm = steady_child["globaltimer_minus_host_ns"] - shift
    steady: dict[str, Any] = {}
    for wnd in steady_child["windows"]:
        lo, hi = wnd["host_ns"][0] + to_pm + 50_000_000, wnd["host_ns"][1] + to_pm - 50_000_000
        pm = {
            k: analysis.window_mean(ss, k, lo, hi)[0]
            for k in ("busy", "sm_active", "occupancy", "tensor", "dram")
        }
        steady[wnd["name"]] = {"gpm": dict(zip(steady_child["gpm_keys"], wnd["gpm"], strict=True)), "pm": pm}
    results["steady"] = steady
    results["steady_clock"] = {
        "globaltimer_minus_host_ns": steady_child["globaltimer_minus_host_ns"],
        "spread_ns": steady_child["spread_ns"],
    }
    say(json.dumps(steady)[:3000])


def ncu_section(results: dict[str, Any]) -> dict[str, Any]:
    from bench.truth.ground_truth import run_ncu

    run = run_ncu(["spin_one_warp", "spin_half_sms", "spin_warp_per_sm", "spin_full_occupancy"], 0)
    results["ncu"] = {"available": run.available, "reason": run.reason}
    ncu = {k: {"sm_active": v.sm_active, "occupancy": v.occupancy} for k, v in run.truths.items()}
    results["ncu"]["truths"] = ncu
    return ncu


def gemm_section(gpu: Any, interval: int, results: dict[str, Any]) -> None:
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for on in (True, False, True, False):
        if on:
            _, r, _ = capture_child(gpu, interval, ["gemm-rate", "--seconds", "3"])
        else:
            c = Child("gemm-rate", "--seconds", "3")
            c.go()
            r = c.result()
        rates["on" if on else "off"].append(r["tflops"])
    results["gemm_tflops"] = {**rates, "ratio": sum(rates["on"]) / sum(rates["off"])}
    say(json.dumps(results["gemm_tflops"]))


def judge_all(
    results: dict[str, Any],
    child: Any,
    ncu: Mapping[str, Any],
    steady: Mapping[str, Any],
    out: Path,
    skipped: frozenset[str] = frozenset(),
) -> int:
    checks = judge_schedule(results["schedule"], child, ncu, steady, skipped)
    for name, st in steady.items():
        if st:
            for metric in ("sm_active", "occupancy", "tensor", "dram"):
                tol = POINTS if metric in ("sm_active", "occupancy") else None
                checks.append(
                    Check("steady", name, metric, "GPM same window", st["gpm"][metric], st["pm"][metric], tol)
                )
    stamped = results["step"]["stamped_mean_s"]
    detected = results["step"]["detected"]["seconds"] if results["step"]["detected"] else None
    checks.append(
        Check("step", "schedule", "period s", "stamps (mean)", stamped, detected, PERIOD_SHARE * stamped)
    )
    results["checks"] = [{**asdict(c), "passed": c.passed} for c in checks]
    (out / "profile_truth.json").write_text(json.dumps(results, indent=1, default=str))
    failed = [c for c in checks if c.passed is False]
    for c in checks:
        flag = "skip" if c.skipped else {True: "PASS", False: "FAIL", None: "info"}[c.passed]
        say(
            f"{flag} {c.section:7} {c.subject:22} {c.metric:10} {c.reference:16} "
            f"expected {c.expected} measured {c.measured}"
        )
    left_out = sorted({c.reference for c in checks if c.skipped})
    say(
        f"{sum(c.passed is True for c in checks)} passed, {len(failed)} failed"
        + (f"; references skipped on request: {', '.join(left_out)}" if left_out else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
