"""Benchmark (GPU host): where one `Sampler.tick()` (a capture and its publishing at once) spends its time
on GPU 0, against the bare calls.

    python3 bench/tick_breakdown.py [--ticks 40] [--pause 0.5]

The same two sides as ``bench/mig_tick_cost.py --real`` (the slow reads left out of both), each tick after
its own ``--pause``. It prints: the NVML calls each side makes per tick, counted and timed through a wrapper
around every ``nvml*`` function of pynvml (so the two sides' call lists can be compared); then, unwrapped, the
tick split into the nvml backend's capture, the gpm backend's capture and the rest (decoding, fold,
snapshot: the publishing), with the bare
calls' tick beside it; then what `smlens serve`'s per-tick listeners (the /metrics publisher and the status
page's history) add after each tick; then cProfile's 25 heaviest functions over the same number of ticks.
Last, a check on the real driver: the GPM results read in one unpack (``results_layout``) equal what
pynvml's ctypes fields read, over ``--ticks`` pairs of samples.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "exporter"), str(REPO / "bench")]

import pynvml  # noqa: E402
from mig_tick_cost import Bare  # noqa: E402

from smlens.pipeline.sampler import Sampler  # noqa: E402
from smlens.sources.nvml.backend import open_nvml_backends  # noqa: E402
from smlens.sources.nvml.gpm import METRICS, metrics_request, results_layout  # noqa: E402
from smlens.verdicts import thresholds  # noqa: E402
from smlens.web.app import Publisher  # noqa: E402
from smlens.web.status.history import History  # noqa: E402


def count_calls(sides: dict[str, Callable[[], Any]], ticks: int, pause: float) -> None:
    """Each side's NVML calls per tick, by function, with their mean time."""
    calls: dict[str, Counter[str]] = {side: Counter() for side in sides}
    spent: dict[str, Counter[str]] = {side: Counter() for side in sides}
    current = [""]
    originals = {
        name: fn
        for name, fn in vars(pynvml).items()
        if name.startswith("nvml") and callable(fn) and not isinstance(fn, type)
    }

    def wrapped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[current[0]][name] += time.perf_counter() - started
                calls[current[0]][name] += 1

        return call

    for name, fn in originals.items():
        setattr(pynvml, name, wrapped(name, fn))
    try:
        for _ in range(ticks):
            for side, tick in sides.items():
                current[0] = side
                time.sleep(pause)
                tick()
    finally:
        for name, fn in originals.items():
            setattr(pynvml, name, fn)
    for side in sides:
        total = sum(spent[side].values()) / ticks * 1e6
        print(f"{side}: {sum(calls[side].values()) / ticks:.1f} NVML calls per tick, {total:.0f} us in them")
        for name, n in sorted(calls[side].items(), key=lambda item: -spent[side][item[0]]):
            print(f"    {name:48s} {n / ticks:5.2f} per tick {spent[side][name] / n * 1e6:8.1f} us a call")


def split(sampler: Sampler, backends: list[Any], bare: Bare, ticks: int, pause: float) -> None:
    """The tick's wall time in the two backends' captures and in the rest; the bare tick beside it."""
    reads: Counter[str] = Counter()
    for backend in backends:

        def timed_capture(
            gpu: Any, now: float, _capture: Callable[..., Any] = backend.capture, _name: str = backend.name
        ) -> Any:
            started = time.perf_counter()
            try:
                return _capture(gpu, now)
            finally:
                reads[_name] += time.perf_counter() - started

        backend.capture = timed_capture
    whole: list[float] = []
    bare_ticks: list[float] = []
    for _ in range(ticks):
        for tick, into in ((sampler.tick, whole), (bare.tick, bare_ticks)):
            time.sleep(pause)
            started = time.perf_counter()
            tick()
            into.append(time.perf_counter() - started)
    rest = sum(whole) - sum(reads.values())
    parts = ", ".join(f"{name}.capture {spent / ticks * 1e6:.0f}" for name, spent in reads.items())
    print(
        f"tick: mean {statistics.fmean(whole) * 1e6:.0f} us = {parts}, rest {rest / ticks * 1e6:.0f}; "
        f"bare calls' tick: mean {statistics.fmean(bare_ticks) * 1e6:.0f} us"
    )


def listeners(sampler: Sampler, ticks: int, pause: float) -> None:
    """Wall time of serve's listeners (Publisher.publish, History.record) right after each tick."""
    publisher, history = Publisher(), History(thresholds.load(None))
    ticked: list[float] = []
    listened: list[float] = []
    for _ in range(ticks):
        time.sleep(pause)
        started = time.perf_counter()
        snapshot = sampler.tick()
        done = time.perf_counter()
        publisher.publish(snapshot)
        history.record(snapshot)
        ticked.append(done - started)
        listened.append(time.perf_counter() - done)
    print(
        f"serve's listeners after a tick: median {statistics.median(listened) * 1e6:.0f} us "
        f"(tick median {statistics.median(ticked) * 1e6:.0f} us)"
    )


def decode_check(ticks: int) -> None:
    """The one-unpack decode of GPM results against pynvml's ctypes fields, on this host's GPU 0."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    request = metrics_request(pynvml)
    unpack = results_layout(request, len(METRICS)).unpack_from
    pynvml.nvmlGpmSampleGet(handle, samples[0])
    mismatches = 0
    for i in range(ticks):
        time.sleep(0.2)
        pynvml.nvmlGpmSampleGet(handle, samples[(i + 1) % 2])
        request.sample1, request.sample2 = samples[i % 2], samples[(i + 1) % 2]
        pynvml.nvmlGpmMetricsGet(request)
        flat = unpack(request)
        fields = [(request.metrics[m].nvmlReturn, request.metrics[m].value) for m in range(len(METRICS))]
        bits = struct.Struct("=Id").pack  # NaN != NaN: compare the bits
        mismatches += [bits(*p) for p in zip(flat[::2], flat[1::2], strict=True)] != [
            bits(*f) for f in fields
        ]
    for sample in samples:
        pynvml.nvmlGpmSampleFree(sample)
    print(f"GPM decode check: {ticks} reads of {len(METRICS)} metrics, {mismatches} differ from the fields")


def profile(sampler: Sampler, ticks: int, pause: float) -> None:
    profiler = cProfile.Profile()
    for _ in range(ticks):
        time.sleep(pause)
        profiler.enable()
        sampler.tick()
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=40, help="ticks of each side, per part (default 40)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds before each tick (default 0.5)")
    args = parser.parse_args()
    nvml, gpm = open_nvml_backends(energy_interval=1e9, utilization_interval=1e9)
    sampler = Sampler(nvml, [gpm], hostname="bench", interval=args.pause)
    sampler.open(nvml.discover()[:1])  # GPU 0, as the bare side
    try:
        bare = Bare(pynvml, 0, real=True)
        for tick in (sampler.tick, bare.tick):  # primes the GPM chains and the one utilization read
            time.sleep(args.pause)
            tick()
        print(f"GPU 0, whole, {args.ticks} ticks of each side per part, {args.pause} s apart, wall clock")
        count_calls({"smlens": sampler.tick, "bare": bare.tick}, args.ticks // 2, args.pause)
        split(sampler, [nvml, gpm], bare, args.ticks, args.pause)
        listeners(sampler, args.ticks, args.pause)
        profile(sampler, args.ticks, args.pause)
        decode_check(args.ticks)
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
