"""Benchmark: where the exporter's resident memory goes.

Starts ``smlens serve`` (sim backend by default) in a child interpreter with tracemalloc on, scrapes it,
and prints, from inside that process: RSS split into anonymous and file-backed pages
(/proc/self/smaps_rollup), the Python heap tracemalloc saw grouped by the top-level package that
allocated it, the largest mappings of shared libraries, and what importing each big dependency costs on
its own (RSS of a fresh interpreter after ``import X`` minus a bare one).

    python3 bench/memory_breakdown.py [--exporter-path exporter] [--settle 5] [-- extra serve flags]

``--exporter-path`` picks the source tree, so that two checkouts can be compared in one run
(e.g. ``--exporter-path ../other-checkout/exporter``). tracemalloc itself costs memory, so the RSS figure to
quote is the one printed without it (``rss without tracemalloc``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPENDENCIES = (
    "prometheus_client",
    "yaml",
    "pydantic",
    "fastapi, uvicorn",  # what smlens served with until issue 14
    "starlette.applications, starlette.routing, starlette.responses, h11",  # until smlens.routing
    "smlens.routing, h11",  # what it serves with now (asyncio: smlens.web)
    "grpc",  # only with pod attribution on a Kubernetes node
    "pynvml",
)

# Runs in the child: serve on the main thread; another thread waits until the parent has scraped (a line on
# stdin: the child makes no HTTP request, whose client modules smlens serve does not load), then reports on
# the process and exits.
_CHILD = r"""
import json, os, re, sys, threading, time, tracemalloc
traced = os.environ.get("SMLENS_BENCH_TRACE") == "1"
if traced:
    tracemalloc.start(1)
from smlens.cli import main
port, settle, flags = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]

def report():
    sys.stdin.readline()
    time.sleep(settle)

    def kib(field, text):
        found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
        return int(found.group(1)) if found else 0

    rollup = open("/proc/self/smaps_rollup").read()
    libs = {}
    name = None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            name = head[5] if len(head) > 5 else "[anon]"
        elif head[0] == "Rss:":
            libs[name] = libs.get(name, 0) + int(head[1])
    result = {
        "rss_kib": kib("Rss", rollup),
        "anon_kib": kib("Anonymous", rollup),
        "file_kib": kib("Rss", rollup) - kib("Anonymous", rollup),
        "threads": threading.active_count(),
        "modules": len(sys.modules),
        "mappings": sorted(libs.items(), key=lambda kv: -kv[1])[:12],
    }
    if traced:
        by_package = {}
        for stat in tracemalloc.take_snapshot().statistics("filename"):
            path = stat.traceback[0].filename
            package = "<frozen/builtin>" if path.startswith("<") else "other"
            for marker in ("/site-packages/", "/lib/python3", "/exporter/"):
                if marker in path:
                    rest = path.split(marker, 1)[1]
                    if marker == "/lib/python3":
                        rest = "stdlib:" + rest.split("/", 2)[1].removesuffix(".py")
                    package = rest.split("/")[0].removesuffix(".py")
                    break
            by_package[package] = by_package.get(package, 0) + stat.size
        result["traced_kib"] = sum(by_package.values()) // 1024
        largest = sorted(by_package.items(), key=lambda kv: -kv[1])[:20]
        result["by_package_kib"] = [(name, size // 1024) for name, size in largest]
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)

threading.Thread(target=report, daemon=True).start()  # serve must own the main thread (signal handlers)
main(["serve", "--listen", f"127.0.0.1:{port}", *flags])
"""


def pythonpath(exporter_path: str) -> str:
    """The tree first, then what the caller's PYTHONPATH holds (where dependencies may be installed)."""
    return os.pathsep.join(p for p in (exporter_path, os.environ.get("PYTHONPATH", "")) if p)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str, process: subprocess.Popen[str]) -> None:
    """Once ready, 20 scrapes of /metrics, as Prometheus would make."""
    for _ in range(200):
        if process.poll() is not None:
            return
        try:
            if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    for _ in range(20):
        urllib.request.urlopen(url + "/metrics", timeout=5).read()


def child(exporter_path: str, settle: float, flags: list[str], traced: bool) -> dict[str, object]:
    trace = "1" if traced else "0"
    env = {**os.environ, "PYTHONPATH": pythonpath(exporter_path), "SMLENS_BENCH_TRACE": trace}
    port = free_port()
    with (
        tempfile.TemporaryFile("w+") as log,
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(port), str(settle), *flags],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        ) as process,
    ):
        try:
            scrape(f"http://127.0.0.1:{port}", process)
            out, _ = process.communicate("scraped\n", timeout=120)
        finally:
            process.kill()
        log.seek(0)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            sys.exit(f"the exporter did not report (exit {process.returncode}): {log.read().strip()[-500:]}")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def import_cost(module: str, exporter_path: str) -> int | None:
    """RSS in KiB of a fresh interpreter after ``import module`` (nothing for ""); None if not installed."""
    code = f"import re\n{'import ' + module if module else ''}\n" + (
        "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
    )
    env = {**os.environ, "PYTHONPATH": pythonpath(exporter_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0 and "ModuleNotFoundError" in out.stderr:
        return None
    out.check_returncode()
    return int(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exporter-path", default=str(REPO / "exporter"))
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to run after the scrapes")
    parser.add_argument("flags", nargs="*", help="extra smlens serve flags (default: --backend sim)")
    args = parser.parse_args()
    flags = args.flags or ["--backend", "sim"]
    plain = child(args.exporter_path, args.settle, flags, traced=False)
    traced = child(args.exporter_path, args.settle, flags, traced=True)
    mib = 1024
    print(f"exporter tree: {args.exporter_path}; smlens serve {' '.join(flags)}")
    print(
        f"rss without tracemalloc: {plain['rss_kib'] / mib:.1f} MiB "  # type: ignore[operator]
        f"(anonymous {plain['anon_kib'] / mib:.1f}, file-backed {plain['file_kib'] / mib:.1f}); "  # type: ignore[operator]
        f"{plain['threads']} threads, {plain['modules']} modules"
    )
    print("largest mappings (KiB):")
    for name, size in plain["mappings"]:  # type: ignore[attr-defined]
        print(f"  {size:8d}  {name}")
    print(f"python heap seen by tracemalloc: {traced['traced_kib'] / mib:.1f} MiB, by package (KiB):")  # type: ignore[operator]
    for name, size in traced["by_package_kib"]:  # type: ignore[attr-defined]
        print(f"  {size:8d}  {name}")
    bare = import_cost("", args.exporter_path) or 0
    print(f"import cost on its own (RSS over a bare interpreter's {bare / mib:.1f} MiB):")
    # The web config file's schema (pydantic models) is imported only when serve is given such a file.
    serving = ("smlens.web", "smlens.web, smlens.web.webconfig_file")
    for module in (*DEPENDENCIES, "smlens.cli", "smlens.web.app", *serving):
        cost = import_cost(module, args.exporter_path)
        print(f"  {'    absent' if cost is None else f'{(cost - bare) / mib:6.1f} MiB'}  import {module}")


if __name__ == "__main__":
    main()
