"""A/B of smlens' sampling cost on a real GPU: two source trees' `smlens serve`, interleaved.

Each run serves on a free loopback port for a window and reads, from its own /metrics, the backend read time
per tick (smlens_backend_sample_seconds_total over smlens_backend_samples_total, all backends). Windows hold
only a few of the slow reads (utilization every 5 s, energy every 15 s), so compare several rounds.

    python3 bench/sampling_ab.py OLD_TREE/exporter exporter --rounds 2 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def totals(url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()

    def values(name: str) -> list[float]:
        return [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)", text, re.M)]

    spent = sum(values("smlens_backend_sample_seconds_total"))
    ticks = max(values("smlens_backend_samples_total"))
    return spent, ticks


def per_tick_us(tree: str, seconds: float) -> float:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "smlens", "serve", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/metrics"
        spent0, ticks0 = totals(url)
        time.sleep(seconds)
        spent1, ticks1 = totals(url)
        return (spent1 - spent0) / (ticks1 - ticks0) * 1e6
    finally:
        process.terminate()
        process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the first tree's exporter folder (put on PYTHONPATH)")
    parser.add_argument("new", help="the second tree's exporter folder")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for name, tree in (("old", args.old), ("new", args.new)):
            results[name].append(per_tick_us(tree, args.seconds))
            print(f"{name} {results[name][-1]:.0f} us of backend reads per tick", flush=True)
    print(f"new/old {sum(results['new']) / sum(results['old']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
