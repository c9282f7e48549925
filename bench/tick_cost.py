"""Benchmark: CPU per sampler tick on a simulated node, and the share of it spent in the pure fold.

    python3 bench/tick_cost.py [--gpus 64] [--ticks 2000]

Both figures come from one run (thread CPU time, so other processes on a shared machine do not count):
the whole tick, and the fold calls inside those same ticks, timed by wrapping ``smlens.pipeline.fold.fold``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporter"))

from smlens.pipeline import fold as fold_module
from smlens.pipeline import sampler as sampler_module
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--ticks", type=int, default=2000)
    args = parser.parse_args()

    fold_seconds = 0.0
    fold = fold_module.fold

    def timed_fold(*fold_args: Any) -> Any:
        nonlocal fold_seconds
        started = time.thread_time()
        try:
            return fold(*fold_args)
        finally:
            fold_seconds += time.thread_time() - started

    vars(sampler_module)["fold"] = timed_fold  # the name the sampler calls
    sampler = Sampler(SimBackend(Scenario.steady(args.gpus)), [], hostname="bench", interval=1.0)
    sampler.open()
    for _ in range(20):  # warm-up
        sampler.tick()
    fold_seconds = 0.0
    started = time.thread_time()
    for _ in range(args.ticks):
        sampler.tick()
    tick_ms = (time.thread_time() - started) / args.ticks * 1e3
    fold_ms = fold_seconds / args.ticks * 1e3
    print(f"{args.gpus} sim GPUs, {args.ticks} ticks: {tick_ms:.3f} ms CPU per tick")
    print(f"fold: {fold_ms:.3f} ms per tick, {fold_ms / tick_ms:.0%} of the tick")
    print(f"per GPU: tick {tick_ms / args.gpus * 1e3:.1f} us, fold {fold_ms / args.gpus * 1e3:.1f} us")


if __name__ == "__main__":
    main()
