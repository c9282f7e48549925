"""Benchmark: memory and CPU of the status page's history ring (smlens.web.status.history).

Measures, in one run, on the simulated node:
- bytes the ring holds (tracemalloc, allocations made in history.py that stay reachable) once it has
  wrapped, for 8 and 64 GPUs, and from their difference the bytes per GPU per minute of history;
- the time ``History.record`` (the sampler's listener) takes per tick, as a share of a sampling tick
  (sim backend: the cheapest tick there is, so the share is an upper bound), and the time of one full
  ``/api/v1/history`` answer's window copy (off the sampler thread; the listener waits only for the
  array slices taken under the lock);
- the whole ``/api/v1/history`` answer (window, JSON, HTTP through the application in process) for 8
  and 64 GPUs with a full ring: bytes and milliseconds of the first answer, and how many answers a
  client needs for the full window, capped (``MAX_VALUES_PER_ANSWER``) and, for comparison, uncapped.

    PYTHONPATH=exporter python3 bench/status_history.py [--interval 1.0] [--ticks 1000]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend
from smlens.verdicts import thresholds
from smlens.web.status import history as history_module
from smlens.web.status.history import WINDOW_SECONDS, History


def node(gpus: int, interval: float) -> tuple[Sampler, History, list[float]]:
    now = [1_800_000_000.0]
    sampler = Sampler(
        SimBackend(Scenario.steady(gpus)), [], "bench", interval, clock=lambda: now[0], wall=lambda: now[0]
    )
    sampler.open()
    history = History(thresholds.load())
    sampler.subscribe(history.record)
    return sampler, history, now


def tick(sampler: Sampler, now: list[float], count: int) -> None:
    for _ in range(count):
        sampler.tick()
        now[0] += sampler.interval


def ring_bytes(gpus: int, interval: float) -> tuple[int, int]:
    """(bytes held by the ring after it wrapped once, its capacity in ticks)."""
    sampler, history, now = node(gpus, interval)
    tracemalloc.start()
    tick(sampler, now, round(WINDOW_SECONDS / interval) + 10)
    gc.collect()
    traces = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, history_module.__file__)])
    tracemalloc.stop()
    return sum(s.size for s in traces.statistics("filename")), history.capacity


def listener_share(gpus: int, interval: float, ticks: int) -> tuple[float, float, float]:
    """(seconds per sim tick, per History.record of a tick, per full window copy)."""
    sampler, _, now = node(gpus, interval)
    history = History(thresholds.load())
    snapshots = []
    started = time.perf_counter()
    for _ in range(ticks):
        snapshots.append(sampler.tick())
        now[0] += interval
    tick_seconds = (time.perf_counter() - started) / ticks
    for snapshot in snapshots[: round(WINDOW_SECONDS / interval)]:  # a full ring, as after 15 minutes
        history.record(snapshot)
    started = time.perf_counter()
    for snapshot in snapshots:
        history.record(snapshot)
    record_seconds = (time.perf_counter() - started) / ticks
    copies = 20
    started = time.perf_counter()
    for _ in range(copies):
        history.window()
    return tick_seconds, record_seconds, (time.perf_counter() - started) / copies


def answer_cost(gpus: int, interval: float, cap: int) -> tuple[int, float, int]:
    """(bytes of the first answer, seconds per answer, answers for the full window) with ``cap``."""
    from starlette.testclient import TestClient

    from smlens.web.app import Publisher, create_app
    from smlens.web.status import page

    sampler, history, now = node(gpus, interval)
    tick(sampler, now, round(WINDOW_SECONDS / interval) + 10)
    client = TestClient(create_app(Publisher(), thresholds.load(), lambda: True, history))
    page.MAX_VALUES_PER_ANSWER = cap  # type: ignore[misc]  # the handler reads it per request
    client.get("/-/healthy")  # warm up: the first request sets up the client
    try:
        answers, params, first, started = 0, {}, 0, time.perf_counter()
        while True:
            response = client.get("/api/v1/history", params=params)
            body = response.json()
            first = first or len(response.content)
            answers += 1
            if not body["more"]:
                break
            params = {"after": body["sequences"][-1]}
        return first, (time.perf_counter() - started) / answers, answers
    finally:
        page.MAX_VALUES_PER_ANSWER = history_module.MAX_VALUES_PER_ANSWER  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--ticks", type=int, default=1000)
    args = parser.parse_args()
    minutes = WINDOW_SECONDS / 60
    small, capacity = ring_bytes(8, args.interval)
    large, _ = ring_bytes(64, args.interval)
    per_gpu_minute = (large - small) / (64 - 8) / minutes
    print(f"interval {args.interval:g} s: ring of {capacity} ticks ({minutes:g} min)")
    for gpus, held in ((8, small), (64, large)):
        share = held / gpus / minutes
        print(
            f"  ring bytes, {gpus:>2} GPUs: {held:>9,} ({share:,.0f} per GPU per minute with the shared part)"
        )
    print(f"  per GPU per minute (64 - 8 GPUs difference): {per_gpu_minute:,.0f} bytes")
    tick, record, window = listener_share(8, args.interval, args.ticks)
    print(
        f"8 GPUs: sim tick {tick * 1e6:,.0f} us; History.record {record * 1e6:,.1f} us ({record / tick:.1%})"
    )
    print(
        f"  one full-window copy for /api/v1/history: {window * 1e3:,.1f} ms = {window / tick:,.1f} sim ticks"
    )
    for label, cap in (("capped", history_module.MAX_VALUES_PER_ANSWER), ("uncapped", 10**12)):
        for gpus in (8, 64):
            size, seconds, answers = answer_cost(gpus, args.interval, cap)
            print(
                f"/api/v1/history {label}, {gpus:>2} GPUs, full ring: first answer {size:,} bytes, "
                f"{seconds * 1e3:,.1f} ms per answer, {answers} answer(s) for the window"
            )


if __name__ == "__main__":
    main()
