"""Benchmark: is the exporter's resident memory flat over a long run?

Starts ``smlens serve`` (the simulated node unless other flags follow ``--``) at a 1 s interval on a free
loopback port, scrapes /metrics every ``--scrape-every`` seconds as Prometheus would (gzip, OpenMetrics
accepted), and reads the process' RSS (/proc/PID/status VmRSS) after each scrape. Prints RSS at the end of
the warm-up, at the end, its range after the warm-up, and the least-squares slope in MiB per hour.

    python3 bench/soak.py --minutes 60 [--warmup-minutes 5] [--scrape-every 15] [--json FILE] [-- FLAGS]

A good result: the range after the warm-up within 2 MiB, and a slope near zero.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def scrape(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return int(answer.status)


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mean_t) * (r - mean_r) for t, r in points) / var * 3600


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(args_in)
    port = free_port()
    flags = extra or ["--backend", "sim"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
    command = [sys.executable, "-m", "smlens", "serve", "--interval", "1", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen([*command, *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                print("soak: the exporter exited before it answered.", file=sys.stderr)
                return 1
            try:
                if scrape(port) == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print("soak: the exporter did not answer /metrics within 60 s.", file=sys.stderr)
                return 1
            time.sleep(0.2)
        started = time.monotonic()
        points: list[tuple[float, float]] = []
        failures = 0
        while (elapsed := time.monotonic() - started) < args.minutes * 60:
            try:
                failures += scrape(port) != 200
            except OSError:
                failures += 1
            points.append((elapsed, rss_mib(process.pid)))
            time.sleep(max(0.0, args.scrape_every - (time.monotonic() - started - elapsed)))
    finally:
        process.terminate()
        process.wait(timeout=10)
    steady = [(t, r) for t, r in points if t >= args.warmup_minutes * 60] or points
    result = {
        "minutes": args.minutes,
        "scrapes": len(points),
        "failed_scrapes": failures,
        "rss_after_warmup_mib": round(steady[0][1], 2),
        "rss_end_mib": round(steady[-1][1], 2),
        "rss_range_after_warmup_mib": round(max(r for _, r in steady) - min(r for _, r in steady), 2),
        "slope_mib_per_hour": round(slope_per_hour(steady), 3),
    }
    for key, value in result.items():
        print(f"{key:28} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps({**result, "series": points}))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
