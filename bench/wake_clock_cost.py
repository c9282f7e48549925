"""Benchmark: what reading a clock costs as the first thing a thread does after it sleeps, as the sampler's
thread does at each tick, against the same read right after.

    python3 bench/wake_clock_cost.py [--reads 200] [--pause 0.5]

Each round sleeps ``--pause`` seconds, then times (wall clock, ``time.perf_counter``) two reads in a row
of each clock: the thread's CPU clock (``time.thread_time``, a system call on Linux) and the monotonic
clock (``time.monotonic``, answered in user space), in an order that alternates between rounds. The
sampler reads no CPU clock at capture for this reason (smlens/sampler.py): the first read after the
wake-up costs far more than the next on some hosts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

CLOCKS: dict[str, Callable[[], float]] = {"thread_time": time.thread_time, "monotonic": time.monotonic}


def rounds(reads: int, pause: float) -> dict[str, list[float]]:
    """Per clock, the µs of its first and of its second read after each pause."""
    spent: dict[str, list[float]] = {
        f"{name} {which}": [] for name in CLOCKS for which in ("first", "second")
    }
    names = list(CLOCKS)
    timer = time.perf_counter
    for i in range(reads):
        time.sleep(pause)
        for name in names[i % 2 :] + names[: i % 2]:
            read = CLOCKS[name]
            started = timer()
            read()
            between = timer()
            read()
            ended = timer()
            spent[f"{name} first"].append((between - started) * 1e6)
            spent[f"{name} second"].append((ended - between) * 1e6)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200, help="rounds, each after a pause")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds slept before each round")
    args = parser.parse_args()
    if args.reads < 1 or args.pause < 0:
        parser.error("--reads must be at least 1 and --pause at least 0.")
    spent = rounds(args.reads, args.pause)
    print(f"{args.reads} rounds, each after {args.pause} s of sleep; µs per read, wall clock")
    for what, us in spent.items():
        print(f"  {what:20s} median {statistics.median(us):7.2f}   mean {statistics.fmean(us):7.2f}")
    ratio = statistics.median(spent["thread_time first"]) / statistics.median(spent["thread_time second"])
    print(f"thread_time: the first read after a sleep costs {ratio:.1f}x the second (medians)")


if __name__ == "__main__":
    main()
