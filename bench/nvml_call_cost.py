"""Benchmark: what each NVML and GPM call smlens makes costs on this GPU host, what the backends' full
``read()`` costs per GPU, and the ratio read() / sum(raw calls) (the Python overhead).

Runs on a GPU host with nothing but pynvml and smlens (this checkout's source is used):

    python3 bench/nvml_call_cost.py [--repeat 100] [--pause 0.01] [--json results.json]

Every call is made with the backends' arguments. The calls of one tick run back to back, each timed on
its own, and ticks are --pause seconds apart, as when a sampler runs: the first call after a pause pays
for the wake-up, as it does in the exporter. Calls the nvml backend makes only every energy interval
(energy, PCIe replays) or utilization interval (utilization samples) are timed apart, with their cost per
second at the default intervals. GPM metrics are computed between the previous and a new sample each
time, as the backend does. Exits 1 with one sentence when NVML cannot start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporter"))

from smlens.errors import SmlensError
from smlens.model import GpuIdentity
from smlens.sources.nvml.backend import DEFAULT_ENERGY_INTERVAL, DEFAULT_UTILIZATION_INTERVAL, NvmlBackend
from smlens.sources.nvml.calls import nvml_module
from smlens.sources.nvml.gpm import METRICS, GpmBackend, metrics_request
from smlens.sources.nvml.session import NvmlSession


def timed_ticks(calls: dict[str, Callable[[], Any]], repeat: int, pause: float) -> dict[str, list[float]]:
    """Microseconds per call, for calls made back to back once per tick; NVML errors count as calls."""
    nv = nvml_module()
    spent: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        time.sleep(pause)
        for name, fn in calls.items():
            started = time.perf_counter_ns()
            try:  # noqa: SIM105 - contextlib.suppress would add its own cost to what is timed
                fn()
            except nv.NVMLError:
                pass
            spent[name].append((time.perf_counter_ns() - started) / 1000)
    return spent


def timed(fn: Callable[[], Any], repeat: int, pause: float) -> list[float]:
    return timed_ticks({"": fn}, repeat, pause)[""]


def row(name: str, spent: list[float], every: float | None = None) -> dict[str, Any]:
    mean = statistics.fmean(spent)
    result = {"call": name, "mean_us": mean, "p50_us": statistics.median(spent), "max_us": max(spent)}
    if every is not None:
        result["every_s"] = every
        result["us_per_second"] = mean / every
    return result


EVENT_WAIT = "nvmlEventSetWait_v2(set, 0) (once per tick for all GPUs)"


def tick_calls(nv: Any, handle: Any, event_set: Any) -> dict[str, Callable[[], Any]]:
    """The nvml backend's calls for one GPU every tick, with its arguments."""
    sm, mem, volatile = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_VOLATILE_ECC
    corrected, uncorrected = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    return {
        "nvmlDeviceGetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle),
        "nvmlDeviceGetTemperature(GPU)": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetFieldValues([MEMORY_TEMP])": lambda: nv.nvmlDeviceGetFieldValues(
            handle, [nv.NVML_FI_DEV_MEMORY_TEMP]
        ),
        "nvmlDeviceGetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(handle, sm),
        "nvmlDeviceGetClockInfo(MEM)": lambda: nv.nvmlDeviceGetClockInfo(handle, mem),
        "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)": lambda: nv.nvmlDeviceGetTotalEccErrors(
            handle, corrected, volatile
        ),
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)": lambda: nv.nvmlDeviceGetTotalEccErrors(
            handle, uncorrected, volatile
        ),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        EVENT_WAIT: lambda: nv.nvmlEventSetWait_v2(event_set, 0),
    }


def slow_calls(nv: Any, handle: Any) -> list[tuple[str, Callable[[], Any], float]]:
    """The nvml backend's calls it makes only every so many seconds, with that period."""
    newest = [0]

    def samples() -> None:  # from just before the newest sample seen, as the backend asks
        since = newest[0] - 1 if newest[0] else 0
        _, got = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, since)
        newest[0] = max([newest[0], *(int(s.timeStamp) for s in got)])

    return [
        ("nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)", samples, DEFAULT_UTILIZATION_INTERVAL),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
            DEFAULT_ENERGY_INTERVAL,
        ),
        (
            "nvmlDeviceGetPcieReplayCounter",
            lambda: nv.nvmlDeviceGetPcieReplayCounter(handle),
            DEFAULT_ENERGY_INTERVAL,
        ),
    ]


def gpm_rows(nv: Any, handle: Any, repeat: int, pause: float) -> list[dict[str, Any]]:
    """nvmlGpmSampleGet, then nvmlGpmMetricsGet between the previous and the new sample, as the backend."""
    samples = (nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc())
    request = metrics_request(nv)
    taking: list[float] = []
    computing: list[float] = []
    try:
        nv.nvmlGpmSampleGet(handle, samples[0])
        for i in range(repeat):
            time.sleep(pause)
            previous, new = samples[i % 2], samples[(i + 1) % 2]
            started = time.perf_counter_ns()
            nv.nvmlGpmSampleGet(handle, new)
            taken = time.perf_counter_ns()
            request.sample1, request.sample2 = previous, new
            nv.nvmlGpmMetricsGet(request)
            taking.append((taken - started) / 1000)
            computing.append((time.perf_counter_ns() - taken) / 1000)
    finally:
        for sample in samples:
            nv.nvmlGpmSampleFree(sample)
    return [row("nvmlGpmSampleGet", taking), row(f"nvmlGpmMetricsGet ({len(METRICS)} metrics)", computing)]


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'call':<58} {'mean us':>9} {'p50 us':>9} {'max us':>9} {'every s':>8} {'us/s':>8}")
    for r in rows:
        every = f"{r['every_s']:>8g} {r['us_per_second']:>8.1f}" if "every_s" in r else ""
        print(f"{r['call']:<58} {r['mean_us']:>9.1f} {r['p50_us']:>9.1f} {r['max_us']:>9.1f} {every}")


def bench_gpu(
    gpu: GpuIdentity,
    session: NvmlSession,
    nvml: NvmlBackend,
    gpm: GpmBackend | None,
    repeat: int,
    pause: float,
) -> dict[str, Any]:
    nv = nvml_module()
    handle = session.handle(gpu)
    # Like the backend's on a healthy node: the GPU registered for XID events, none queued.
    event_set = nv.nvmlEventSetCreate()
    unwatched = nv.nvmlEventSetCreate()
    try:
        calls = tick_calls(nv, handle, event_set)
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as exc:  # smlens then watches no XIDs on this GPU and drains no set for it
            print(f"GPU {gpu.index}: XID events cannot be watched ({exc}); no event-set drain is timed.")
            del calls[EVENT_WAIT]
        # Timed in the same ticks, left out of the sum: a set with no GPU registered, which the backend
        # never drains, for comparison with benches that drained one.
        not_made = "nvmlEventSetWait_v2(set, 0), no GPU registered (not made)"
        calls[not_made] = lambda: nv.nvmlEventSetWait_v2(unwatched, 0)
        spent = timed_ticks(calls, repeat, pause)
        empty = row(not_made, spent.pop(not_made))
        raw = [row(name, times) for name, times in spent.items()]
    finally:
        nv.nvmlEventSetFree(event_set)
        nv.nvmlEventSetFree(unwatched)
    slow = [
        row(name, timed(fn, max(5, repeat // 10), pause), every) for name, fn, every in slow_calls(nv, handle)
    ]
    nvml.read(gpu, time.monotonic())  # makes the slow reads once; the timed reads below make none
    read = row(
        "NvmlBackend.read() (a tick without the slow reads)",
        timed(lambda: nvml.read(gpu, time.monotonic()), repeat, pause),
    )
    raw_sum = sum(r["mean_us"] for r in raw)
    result: dict[str, Any] = {
        "gpu": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "nvml_calls": raw,
        "nvml_calls_sum_us": raw_sum,
        "event_wait_no_gpu_registered": empty,
        "nvml_read": read,
        "nvml_read_over_calls": read["mean_us"] / raw_sum,
        "nvml_slow_calls": slow,
        "nvml_slow_us_per_second": sum(r["us_per_second"] for r in slow),
    }
    print_table(f"GPU {gpu.index} {gpu.name} ({gpu.uuid}): nvml backend", [*raw, read, *slow, empty])
    print(f"{'sum of the per-tick nvml calls':<58} {raw_sum:>9.1f}")
    print(f"{'NvmlBackend.read() / sum(per-tick calls)':<58} {result['nvml_read_over_calls']:>9.2f}")
    slow_per_second = result["nvml_slow_us_per_second"]
    print(f"{'slow reads, us per second at the default intervals':<58} {slow_per_second:>9.1f}")
    if gpm is None:
        print("GPM: not served on this GPU")
        return result
    gpm_raw = gpm_rows(nv, handle, repeat, pause)
    gpm.read(gpu, time.monotonic())
    gpm_read = row("GpmBackend.read()", timed(lambda: gpm.read(gpu, time.monotonic()), repeat, pause))
    gpm_sum = sum(r["mean_us"] for r in gpm_raw)
    result.update(
        gpm_calls=gpm_raw,
        gpm_calls_sum_us=gpm_sum,
        gpm_read=gpm_read,
        gpm_read_over_calls=gpm_read["mean_us"] / gpm_sum,
    )
    print_table(f"GPU {gpu.index}: gpm backend", [*gpm_raw, gpm_read])
    print(f"{'sum of the gpm calls':<58} {gpm_sum:>9.1f}")
    print(f"{'GpmBackend.read() / sum(calls)':<58} {result['gpm_read_over_calls']:>9.2f}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=100, help="calls timed per row (default 100)")
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between two calls (default 0.01)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.repeat < 1 or args.pause < 0:
        print("--repeat must be at least 1 and --pause at least 0.", file=sys.stderr)
        return 2
    session = NvmlSession()
    nvml = NvmlBackend(session, energy_interval=1e9, utilization_interval=1e9)  # slow reads timed apart
    gpm = GpmBackend(session)
    try:
        gpus = nvml.discover()
        if not gpus:
            print("NVML found no GPU on this machine.", file=sys.stderr)
            return 1
        served = nvml.attach(gpus)
        gpm_served = gpm.attach(gpus)
        print(f"driver {gpus[0].driver_version}, {len(gpus)} GPU(s), {args.repeat} calls per row, ", end="")
        print(f"{args.pause} s apart")
        results = [
            bench_gpu(
                gpu, session, nvml, gpm if gpm_served[gpu.uuid] is None else None, args.repeat, args.pause
            )
            for gpu in gpus
            if served[gpu.uuid] is None
        ]
    except SmlensError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        gpm.close()
        nvml.close()
    if args.json:
        args.json.write_text(
            json.dumps({"repeat": args.repeat, "pause": args.pause, "gpus": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
