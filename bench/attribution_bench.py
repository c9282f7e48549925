"""Cost of workload attribution: kubelet refresh, rendering, and /metrics latency (8 GPUs, 100 pods).

    PYTHONPATH=exporter python3 bench/attribution_bench.py [--pods 100] [--refreshes 300] [--scrapes 300]
        [--only kubelet|processes]

1. PodResources refresh: the real client against the fake kubelet (a separate process, so that the
   CPU time measured here is the client's) serving ``--pods`` pods, 10 of them on the 8 GPUs.
2. Rendering: one snapshot of the 8-GPU sim node rendered to Prometheus text, without and with
   that attribution (it happens once per tick, at the first scrape, never per scrape).
3. /metrics latency: the real exporter on the sim backend, attribution from the fake kubelet
   versus an empty pod layout, scraped back to back over loopback.
4. Process attribution (only where NVML answers): NVML process lists of this node's GPUs to
   per-workload usage.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "exporter"))

from smlens.attribution.devices import DeviceMap  # noqa: E402
from smlens.attribution.refresher import AttributionRefresher  # noqa: E402
from smlens.exposition.rendered import Rendered  # noqa: E402
from smlens.model import GpuIdentity, Snapshot  # noqa: E402
from smlens.pipeline.sampler import Sampler  # noqa: E402
from smlens.sources.sim import Scenario, SimBackend  # noqa: E402

HOSTNAME = "bench-node"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}


def pods_on(gpus: list[GpuIdentity], count: int) -> list[dict[str, Any]]:
    """6 pods with a GPU each, 4 sharing GPU 6, GPU 7 free; the rest hold no GPU (2 containers each)."""
    pods: list[dict[str, Any]] = [
        {"namespace": "train", "name": f"job-{i}", "containers": {"main": {"nvidia.com/gpu": [gpus[i].uuid]}}}
        for i in range(6)
    ]
    pods += [
        {
            "namespace": "infer",
            "name": f"small-{i}",
            "containers": {"server": {"nvidia.com/gpu.shared": [f"{gpus[6].uuid}::{i}"]}},
        }
        for i in range(4)
    ]
    pods += [
        {"namespace": f"team-{i % 7}", "name": f"web-{i}", "containers": {"app": {}, "sidecar": {}}}
        for i in range(count - len(pods))
    ]
    return pods


@contextmanager
def fake_kubelet(directory: Path, pods: list[dict[str, Any]]) -> Iterator[Path]:
    socket, pods_file = directory / "kubelet.sock", directory / "pods.json"
    pods_file.write_text(json.dumps(pods))
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fakes" / "fake_kubelet.py"), str(socket), str(pods_file)],
        stdout=subprocess.PIPE,
        env={**ENV, "PYTHONPATH": f"{REPO / 'exporter'}:{REPO / 'tests'}"},
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "serving ..."
        yield socket
    finally:
        server.terminate()
        server.wait(10)


def summary(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3),
        "max_ms": round(ordered[-1] * 1e3, 3),
    }


def timed(fn: Callable[[], object], repeat: int) -> tuple[list[float], float]:
    """Wall time of each call, and CPU seconds of this process per call."""
    walls = []
    cpu_start = time.process_time()
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - started)
    return walls, (time.process_time() - cpu_start) / repeat


def sim_snapshot(attribution_source: AttributionRefresher | None) -> Snapshot:
    now = [0.0]
    sampler = Sampler(
        SimBackend(Scenario.steady(8), hostname_hint=HOSTNAME), [], HOSTNAME, 1.0, clock=lambda: now[0]
    )
    sampler.open()
    if attribution_source is not None:
        sampler.attach_attribution(attribution_source)
    sampler.tick()
    now[0] = 1.0
    return sampler.tick()


def render(snapshot: Snapshot) -> bytes:
    return Rendered(snapshot).text.head


def exporter_latency(args: list[str], scrapes: int) -> dict[str, float]:
    port = 20000 + os.getpid() % 20000
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smlens",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--hostname",
            HOSTNAME,
            *args,
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (
                        client.get("/metrics").status_code == 200
                        and b"smlens_attribution_up" in client.get("/metrics").content
                    ):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("exporter did not come up")
                time.sleep(0.1)
            time.sleep(1.5)  # at least one refresh with the kubelet's answer
            walls, _ = timed(lambda: client.get("/metrics").raise_for_status(), scrapes)
            size = len(client.get("/metrics").content)
        return {**summary(walls), "bytes": size}
    finally:
        process.terminate()
        process.wait(10)


def process_refresh(repeat: int) -> dict[str, Any] | None:
    try:
        from smlens.attribution.processes import ProcessSource
        from smlens.sources.nvml.backend import open_nvml_backends
        from smlens.sources.nvml.session import NvmlSession
    except ImportError:
        return None
    try:
        device, _ = open_nvml_backends()
        gpus = device.discover()
    except Exception as exc:
        return {"skipped": f"NVML not usable here ({exc})"}
    source = ProcessSource(NvmlSession(), gpus, window_seconds=10.0)
    try:
        usages = source.usage()
        walls, cpu = timed(source.usage, repeat)
    finally:
        source.close()
        device.close()
    return {
        "gpus": len(gpus),
        "workloads_seen": len(usages),
        **summary(walls),
        "cpu_ms_per_refresh": round(cpu * 1e3, 3),
    }


def kubelet_parts(options: argparse.Namespace, results: dict[str, Any]) -> None:
    from smlens.attribution.podresources import PodResourcesClient, PodResourcesSource

    gpus = SimBackend(Scenario.steady(8), hostname_hint=HOSTNAME).discover()
    results.update(pods=options.pods, gpus=len(gpus))
    with tempfile.TemporaryDirectory() as tmp, fake_kubelet(Path(tmp), pods_on(gpus, options.pods)) as socket:
        client = PodResourcesClient(socket, timeout=5.0)
        refresher = AttributionRefresher(PodResourcesSource(client, DeviceMap(gpus)))
        attribution = refresher.refresh()
        assert attribution.sources[0].up, attribution.sources
        walls, cpu = timed(refresher.refresh, options.refreshes)
        results["podresources_refresh"] = {
            "allocations": len(attribution.allocations),
            "reply_bytes": len(client.list().SerializeToString()),
            **summary(walls),
            "cpu_ms_per_refresh": round(cpu * 1e3, 3),
        }

        plain, attributed = sim_snapshot(None), sim_snapshot(refresher)
        results["render_once_per_tick"] = {
            "without_attribution": summary(timed(lambda: render(plain), 200)[0]),
            "with_attribution": summary(timed(lambda: render(attributed), 200)[0]),
            "bytes_without": len(render(plain)),
            "bytes_with": len(render(attributed)),
        }

        empty_layout = Path(tmp) / "no-pods.yaml"
        empty_layout.write_text("pods: []\n")
        common = [
            "--backend",
            "sim",
            "--interval",
            "1",
            "--attribution-interval",
            "1",
            "--attribution-timeout",
            "0.5",
        ]
        results["metrics_latency"] = {
            "sim_no_pods": exporter_latency([*common, "--sim-pods", str(empty_layout)], options.scrapes),
            "kubelet_100_pods": exporter_latency(
                [*common, "--pod-resources-socket", str(socket)], options.scrapes
            ),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--refreshes", type=int, default=300)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--only", choices=["kubelet", "processes"], help="run parts 1-3 or part 4 only")
    options = parser.parse_args()
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    if options.only != "processes":
        kubelet_parts(options, results)
    if options.only != "kubelet":
        results["process_refresh"] = process_refresh(options.refreshes)
    results["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
