"""Benchmark (GPU host): how much slower smlens' Python runs on a cold CPU (after a sleep, as at every tick
of a sampler that sleeps between ticks, or right after NVML calls) than in a loop.

    python3 bench/cold_cost.py [--times 30] [--pause 0.5]

One fold (``smlens.pipeline.fold``) of the readings of a real tick on GPU 0 is timed three ways: hot (2000
times in a row), after ``--pause`` seconds of sleep, and right after the bare NVML/GPM calls of one tick
(``Bare`` of bench/mig_tick_cost.py), each ``--times`` times; the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "exporter"), str(REPO / "bench")]

import pynvml  # noqa: E402
from mig_tick_cost import Bare  # noqa: E402

from smlens.pipeline import sampler as sampler_module  # noqa: E402
from smlens.pipeline.fold import fold  # noqa: E402
from smlens.pipeline.sampler import Sampler  # noqa: E402
from smlens.sources.nvml.backend import open_nvml_backends  # noqa: E402


def timed(run: Any) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--times", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.5)
    args = parser.parse_args()
    nvml, gpm = open_nvml_backends(energy_interval=1e9, utilization_interval=1e9)
    sampler = Sampler(nvml, [gpm], hostname="bench", interval=args.pause)
    sampler.open(nvml.discover()[:1])  # GPU 0, as the bare side
    captured: list[tuple[Any, ...]] = []

    def capture(*fold_args: Any) -> Any:
        captured.append(fold_args)
        return fold(*fold_args)

    try:
        bare = Bare(pynvml, 0, real=True)
        for _ in range(2):  # the second tick has GPM activity to fold
            time.sleep(0.2)
            sampler_module.fold = capture
            sampler.tick()
        sampler_module.fold = fold
        fold_args = captured[-1]
        hot = [timed(lambda: fold(*fold_args)) for _ in range(2000)]
        slept: list[float] = []
        after_calls: list[float] = []
        for _ in range(args.times):
            time.sleep(args.pause)
            slept.append(timed(lambda: fold(*fold_args)))
            time.sleep(args.pause)
            bare.tick()
            after_calls.append(timed(lambda: fold(*fold_args)))
    finally:
        sampler_module.fold = fold
        sampler.close()
    print(
        f"one fold of a real tick's readings, medians: hot {statistics.median(hot):.1f} us, "
        f"after {args.pause} s of sleep {statistics.median(slept):.1f} us, "
        f"right after one tick's bare calls {statistics.median(after_calls):.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
