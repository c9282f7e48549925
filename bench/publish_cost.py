"""Benchmark: what publishing captured ticks costs the request that triggers it, and what one
``Sampler.tick()`` costs in a tight loop, this tree against another.

    python3 bench/publish_cost.py [--gpus 8] [--times 10]
    python3 bench/publish_cost.py --trees exporter OLD/exporter [--rounds 2] [--ticks 600]

The first form captures 1, 15 and 30 ticks of ``--gpus`` GPUs and times ``Sampler.publish()`` of them
(medians of ``--times``), with the two listeners ``smlens serve`` subscribes (the /metrics publisher and the
status page's history): on the sim backend, whose capture already holds its readings, and on the nvml and
gpm backends over the tests' fake pynvml (tests/fakes/fake_pynvml.py), whose publishing decodes the kept
NVML results. The second form runs ``Sampler.tick()`` (nvml and gpm backends, one GPU of the fake, calls
at the fake's own cost) ``--ticks`` times in each tree in turn, alternating which goes first, and prints
each run's median in thread CPU time: the Python a tick costs when nothing runs cold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import pynvml  # noqa: E402

from fakes.fake_pynvml import FakeGpu, FakeNode  # noqa: E402

SM = pynvml.NVML_GPM_METRIC_SM_UTIL


def fake_node(gpus: int) -> FakeNode:
    node = FakeNode(
        [
            FakeGpu(
                f"GPU-{i:08x}-1111-2222-3333-444444444444",
                pci_bus_id=f"00000000:{i:02x}:00.0",
                gpm_rates={SM: 50.0},
            )
            for i in range(gpus)
        ]
    )
    sys.modules["pynvml"] = node.module
    return node


def publish_cost(gpus: int, times: int) -> None:
    from smlens.pipeline.sampler import Sampler
    from smlens.sources.nvml.backend import open_nvml_backends
    from smlens.sources.sim import Scenario, SimBackend
    from smlens.verdicts import thresholds
    from smlens.web.app import Publisher
    from smlens.web.status.history import History

    now = [0.0]
    node = fake_node(gpus)

    def advance() -> None:
        node.advance(1.0)
        now[0] += 1.0

    nvml, gpm = open_nvml_backends()
    sides: dict[str, tuple[Sampler, Callable[[], None]]] = {
        "sim backend": (
            Sampler(SimBackend(Scenario.steady(gpus)), [], hostname="n", interval=1.0),
            lambda: None,
        ),
        "nvml + gpm on the fake pynvml": (
            Sampler(nvml, [gpm], hostname="n", interval=1.0, clock=lambda: now[0]),
            advance,
        ),
    }
    for name, (sampler, step) in sides.items():
        sampler.open()
        publisher, history = Publisher(), History(thresholds.load())
        sampler.subscribe(publisher.publish)
        sampler.subscribe(history.record)
        for _ in range(3):
            step()
            sampler.tick()
        figures = []
        for ticks in (1, 15, 30):
            spent = []
            for _ in range(times):
                for _ in range(ticks):
                    step()
                    sampler.capture()
                started = time.perf_counter()
                sampler.publish()
                spent.append(time.perf_counter() - started)
            figures.append(f"{ticks} ticks {statistics.median(spent) * 1e3:.2f} ms")
        print(f"publish() of {gpus} GPUs, {name}: {', '.join(figures)}")
        sampler.close()


def tick_cost(ticks: int) -> float:
    """Median thread CPU µs of Sampler.tick() over one GPU of the fake, in whichever smlens is imported."""
    from smlens.pipeline.sampler import Sampler
    from smlens.sources.nvml.backend import open_nvml_backends

    node = fake_node(1)
    now = [0.0]
    nvml, gpm = open_nvml_backends(energy_interval=1e9, utilization_interval=5.0)
    sampler = Sampler(nvml, [gpm], hostname="n", interval=1.0, clock=lambda: now[0])
    sampler.open()
    spent = []
    for i in range(ticks + 5):
        node.advance(1.0)
        now[0] += 1.0
        started = time.thread_time()
        sampler.tick()
        if i >= 5:  # the first ticks prime the GPM chain and the MIG layout
            spent.append(time.thread_time() - started)
    sampler.close()
    return statistics.median(spent) * 1e6


def compare(trees: list[Path], rounds: int, ticks: int) -> None:
    runs: dict[Path, list[float]] = {tree: [] for tree in trees}
    for i in range(rounds):
        for tree in trees[i % 2 :] + trees[: i % 2]:
            env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
            out = subprocess.run(
                [sys.executable, __file__, "--tick-cost", str(ticks)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            runs[tree].append(float(out.stdout))
    for tree, medians in runs.items():
        print(
            f"Sampler.tick(), {tree}: {', '.join(f'{m:.1f}' for m in medians)} us (median of {ticks} per run)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--trees", type=Path, nargs="+", help="exporter folders to time Sampler.tick() in")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ticks", type=int, default=600)
    parser.add_argument("--tick-cost", type=int, help=argparse.SUPPRESS)  # one tree's run, for --trees
    args = parser.parse_args()
    if args.tick_cost:
        print(tick_cost(args.tick_cost))
    elif args.trees:
        compare(args.trees, args.rounds, args.ticks)
    else:
        publish_cost(args.gpus, args.times)


if __name__ == "__main__":
    main()
