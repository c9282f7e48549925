"""Benchmark: /metrics vs /-/healthy latency, and the sampler's CPU cost per tick per GPU.

Starts the real exporter (``python -m smlens serve``) on the simulated node and measures, in one run:
median and p99 latency of /metrics (plain and gzip, as Prometheus asks) and of /-/healthy over
keep-alive HTTP on loopback, their ratio (target: /metrics median within 3x of /-/healthy), the
exporter's CPU seconds per sampling tick per GPU while nobody scrapes, and its RSS.

    python3 bench/metrics_latency.py [--gpus 8] [--requests 2000] [--interval 1.0] [--idle 20]
    python3 bench/metrics_latency.py --other-tree OLD/exporter [--requests 2000] [--pace 0]

With ``--other-tree``, it serves this tree and the other side by side and times the same requests on both,
alternating which goes first, then prints each endpoint's medians and their ratio (this tree to the other).
``--pace`` waits that long before each timed round, so that each round is a first scrape after a pause, as
Prometheus makes them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def latencies(client: httpx.Client, path: str, n: int, headers: dict[str, str]) -> list[float]:
    for _ in range(50):
        client.get(path, headers=headers)
    out = []
    for _ in range(n):
        start = time.perf_counter()
        response = client.get(path, headers=headers)
        out.append(time.perf_counter() - start)
        response.raise_for_status()
    return out


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def scalar(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def start(tree: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    """``smlens serve`` from ``tree`` (an exporter folder) and its base URL, once it is ready."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smlens",
            "serve",
            "--backend",
            "sim",
            "--sim-gpus",
            str(args.gpus),
            "--interval",
            str(args.interval),
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(base + "/-/ready", timeout=1).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the exporter of {tree} did not become ready")
        time.sleep(0.1)


ENDPOINTS = (
    ("/metrics (plain)", "/metrics", {"Accept-Encoding": "identity"}),
    ("/metrics (gzip)", "/metrics", {"Accept-Encoding": "gzip"}),
    ("/metrics (OpenMetrics+gzip)", "/metrics", {"Accept-Encoding": "gzip", "Accept": PROMETHEUS_ACCEPT}),
    ("/-/healthy", "/-/healthy", {"Accept-Encoding": "identity"}),
)


def compare(args: argparse.Namespace) -> int:
    """Both trees served at once; each request goes to both, in alternating order."""
    servers = [start(REPO / "exporter", args)]
    try:
        servers.append(start(args.other_tree, args))
        clients = [httpx.Client(base_url=base, timeout=10) for _, base in servers]
        time.sleep(2 * args.interval)
        print(f"this tree against {args.other_tree}, {args.requests} requests per endpoint each")
        print(f"{'endpoint':<28}{'this ms':>10}{'other ms':>10}{'ratio':>8}")
        # and the two JSON pages: /api/v1/history's handler runs on a thread pool, /api/v1/gpus' on the loop
        for label, path, headers in (*ENDPOINTS, *((p, p, {}) for p in ("/api/v1/history", "/api/v1/gpus"))):
            timed: list[list[float]] = [[], []]
            for i in range(50 + args.requests):
                if i >= 50:
                    time.sleep(args.pace)
                for side in (i % 2, 1 - i % 2):
                    began = time.perf_counter()
                    clients[side].get(path, headers=headers).raise_for_status()
                    if i >= 50:
                        timed[side].append(time.perf_counter() - began)
            this, other = (statistics.median(t) for t in timed)
            print(f"{label:<28}{this * 1e3:>10.3f}{other * 1e3:>10.3f}{this / other:>8.3f}")
        return 0
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds without scrapes for the CPU figure")
    parser.add_argument("--other-tree", type=Path, help="another exporter folder, timed side by side")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="--other-tree: seconds before each timed round (a pause, as between Prometheus' scrapes)",
    )
    args = parser.parse_args()
    if args.other_tree is not None:
        return compare(args)

    process, base = start(REPO / "exporter", args)
    try:
        time.sleep(2 * args.interval)
        # The tick count comes from /api/v1/gpus, which renders no metrics, so the idle CPU figure
        # holds the sampler (and the idle server) alone. /proc's CPU clock ticks at 10 ms: keep --idle long.
        ticks0, cpu0 = httpx.get(base + "/api/v1/gpus").json()["sequence"], cpu_seconds(process.pid)
        time.sleep(args.idle)
        cpu1, ticks1 = cpu_seconds(process.pid), httpx.get(base + "/api/v1/gpus").json()["sequence"]
        cpu_per_tick_gpu = (cpu1 - cpu0) / (ticks1 - ticks0) / args.gpus
        text = httpx.get(base + "/metrics").text
        ticks = scalar(text, "smlens_backend_samples_total")
        sample_wall = scalar(text, "smlens_backend_sample_seconds_total") / ticks
        sampler_cpu = scalar(text, "smlens_sampler_cpu_seconds_total") / ticks

        rss_before = rss_mib(process.pid)
        with httpx.Client(base_url=base, timeout=10) as client:
            timed = {
                label: latencies(client, path, args.requests, headers) for label, path, headers in ENDPOINTS
            }
            size = len(client.get("/metrics", headers={"Accept-Encoding": "identity"}).content)
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))

        print(
            f"exporter: sim node, {args.gpus} GPUs, interval {args.interval} s, "
            f"{series} series, {size / 1024:.1f} KiB per plain scrape"
        )
        print(
            f"RSS {rss_before:.1f} MiB before the {len(ENDPOINTS) * args.requests} timed requests, "
            f"{rss_mib(process.pid):.1f} MiB after"
        )
        print(f"{'endpoint':<28}{'median ms':>10}{'p99 ms':>10}")
        for label, values in timed.items():
            median, p99 = summary(values)
            print(f"{label:<28}{median * 1e3:>10.3f}{p99 * 1e3:>10.3f}")
        plain, gz, om, healthy = (summary(values)[0] for values in timed.values())
        ratio_plain, ratio_gzip, ratio_om = plain / healthy, gz / healthy, om / healthy
        print(
            f"ratio /metrics median / /-/healthy median: plain {ratio_plain:.2f}x, gzip {ratio_gzip:.2f}x, "
            f"OpenMetrics+gzip {ratio_om:.2f}x "
            f"(target <= 3x)"
        )
        print(
            f"sampling: {sampler_cpu / args.gpus * 1e6:.0f} us CPU per tick per GPU; backend reads "
            f"{sample_wall / args.gpus * 1e6:.0f} us wall per tick per GPU"
        )
        print(
            f"whole process while nobody scrapes: {cpu_per_tick_gpu * 1e6:.0f} us CPU per tick per GPU "
            f"({(cpu1 - cpu0) / args.idle * 1e3:.1f} ms CPU per second, HTTP server idle loop included; "
            f"{ticks1 - ticks0} ticks)"
        )
        return 0 if max(ratio_plain, ratio_gzip, ratio_om) <= 3 else 2
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
