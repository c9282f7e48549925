"""Benchmark: `smlens serve` beside a peer exporter (nvitop-exporter by default), on one host, in one run:
memory, CPU and scrape latency.

Starts both exporters on 127.0.0.1 (random free ports, 1 s interval each) and waits until each answers
/metrics. Then, in three phases, scraping as Prometheus does (OpenMetrics accepted, gzip):
1. once a second each for ``--duration`` seconds; then it reads from /proc for both processes VmRSS and
   VmHWM (status), Rss, Anonymous and file-backed pages (smaps_rollup, file-backed = Rss - Anonymous) and
   the CPU seconds they used in that window (stat: utime + stime);
2. ``--scrapes`` back-to-back scrapes each, interleaved: the p50 and p99 of the time to the whole body;
3. ``--idle-rounds`` rounds of ``--idle`` seconds in which nothing scrapes either exporter, then one
   scrape each: the median of those "first" scrapes over the back-to-back median (Prometheus only ever
   makes such first scrapes).
It prints a table with the ratio smlens/other and writes the same as JSON (``--json``).

    python3 bench/peer_compare.py --json $OUT/peer.json          # a GPU host: auto backend (nvml + gpm)
    python3 bench/peer_compare.py --smlens-only -- --backend sim  # anywhere: smlens alone, sim node

Good results (smlens' targets): CPU and scrape p50/p99 at most 0.5x the peer's, a first scrape after 30 s
idle within 1.5x of the back-to-back median, RSS under 100 MiB.

Both exporters run with the interpreter running this script, so that `PYTHONPATH` picks smlens' tree and
where nvitop-exporter is installed. smlens runs with everything its auto backend finds (NVML, GPM on
Hopper+, the XID event watch) plus the flags after ``--``; ``--other`` replaces the command of the
exporter compared with (``{port}`` is its port), e.g. a second smlens to test this script without a GPU.
Exit status 1, with one sentence and the log's tail, when an exporter does not start or dies.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
NVITOP = "{python} -m nvitop_exporter --interval 1.0 --bind-address 127.0.0.1 --port {port}"
START_TIMEOUT = 90.0  # seconds until /metrics answers 200 (smlens: after its first complete interval)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kib_fields(text: str) -> dict[str, int]:
    """``Name:  123 kB`` lines as {name: KiB}."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB$", text, re.M)}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat (fields 14 and 15; the name may hold spaces)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / CLOCK_TICKS


def memory(pid: int) -> dict[str, float]:
    """MiB: VmRSS and VmHWM, and smaps_rollup's Rss split into anonymous and file-backed pages."""
    status = kib_fields(Path(f"/proc/{pid}/status").read_text())
    rollup = kib_fields(Path(f"/proc/{pid}/smaps_rollup").read_text())
    return {
        "vm_rss_mib": status["VmRSS"] / 1024,
        "vm_hwm_mib": status["VmHWM"] / 1024,
        "rss_mib": rollup["Rss"] / 1024,
        "anonymous_mib": rollup["Anonymous"] / 1024,
        "file_backed_mib": (rollup["Rss"] - rollup["Anonymous"]) / 1024,
    }


@dataclass
class Exporter:
    name: str
    argv: list[str]
    port: int
    log: TextIO
    process: subprocess.Popen[bytes] | None = None
    scrapes: int = 0
    failed_scrapes: int = 0
    scrape_bytes: int = 0
    rss_mib: list[float] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def scrape(self) -> bool:
        request = urllib.request.Request(self.url, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                self.scrape_bytes = len(reply.read())
                return bool(reply.status == 200)
        except OSError:
            return False

    def timed_scrape(self) -> float:
        """Seconds to the whole body of one scrape; a failed scrape ends the run."""
        began = time.perf_counter()
        if not self.scrape():
            raise OSError(f"{self.name} did not answer /metrics")
        return time.perf_counter() - began

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-2000:]


def fail(sentence: str, exporters: list[Exporter]) -> None:
    for exporter in exporters:
        exporter.stop()
    details = "\n".join(f"--- {e.name} log (tail) ---\n{e.log_tail()}" for e in exporters)
    sys.exit(f"peer_compare: {sentence}\n{details}")


def wait_ready(exporters: list[Exporter]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    waiting = list(exporters)
    while waiting:
        for exporter in list(waiting):
            if not exporter.alive():
                fail(f"{exporter.name} exited before it served /metrics.", exporters)
            if exporter.scrape():
                waiting.remove(exporter)
        if time.monotonic() > deadline:
            fail(
                f"{', '.join(e.name for e in waiting)} did not serve /metrics within {START_TIMEOUT:.0f} s.",
                exporters,
            )
        time.sleep(0.2)


def measure(exporters: list[Exporter], duration: float) -> dict[str, Any]:
    pids = {e.name: e.process.pid for e in exporters if e.process is not None}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    rounds = 0
    while (elapsed := time.monotonic() - started) < duration:
        rounds += 1
        for exporter in exporters if rounds % 2 else exporters[::-1]:  # neither is always scraped first
            if not exporter.alive():
                fail(f"{exporter.name} exited during the run.", exporters)
            ok = exporter.scrape()
            exporter.scrapes += ok
            exporter.failed_scrapes += not ok
            exporter.rss_mib.append(memory(pids[exporter.name])["vm_rss_mib"])
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started - elapsed)))
    window = time.monotonic() - started
    results: dict[str, Any] = {}
    for exporter in exporters:
        pid = pids[exporter.name]
        used = cpu_seconds(pid) - cpu_before[exporter.name]
        results[exporter.name] = {
            "command": shlex.join(exporter.argv),
            **memory(pid),
            "rss_max_during_run_mib": max(exporter.rss_mib),
            "cpu_seconds": used,
            "cpu_cores": used / window,
            "scrapes": exporter.scrapes,
            "failed_scrapes": exporter.failed_scrapes,
            "metrics_bytes": exporter.scrape_bytes,
        }
    return {"window_seconds": window, "exporters": results}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def latency(exporters: list[Exporter], scrapes: int, idle: float, idle_rounds: int) -> dict[str, Any]:
    """Back-to-back p50/p99, and the first scrape after ``idle`` seconds without any, in ms."""
    back_to_back: dict[str, list[float]] = {e.name: [] for e in exporters}
    first: dict[str, list[float]] = {e.name: [] for e in exporters}
    try:
        for i in range(scrapes):
            for exporter in exporters if i % 2 else exporters[::-1]:
                back_to_back[exporter.name].append(exporter.timed_scrape())
        for i in range(idle_rounds):
            time.sleep(idle)
            for exporter in exporters if i % 2 else exporters[::-1]:
                first[exporter.name].append(exporter.timed_scrape())
    except OSError as exc:
        fail(f"{exc} during the latency phase.", exporters)
    rows: dict[str, Any] = {}
    for name in back_to_back:
        median = percentile(back_to_back[name], 0.5)
        rows[name] = {
            "scrape_p50_ms": median * 1000,
            "scrape_p99_ms": percentile(back_to_back[name], 0.99) * 1000,
            "first_after_idle_ms": percentile(first[name], 0.5) * 1000 if first[name] else None,
            "first_after_idle_over_p50": percentile(first[name], 0.5) / median if first[name] else None,
        }
    return rows


KEYS = (
    "vm_rss_mib",
    "vm_hwm_mib",
    "rss_mib",
    "anonymous_mib",
    "file_backed_mib",
    "rss_max_during_run_mib",
    "cpu_seconds",
    "cpu_cores",
    "scrape_p50_ms",
    "scrape_p99_ms",
    "first_after_idle_ms",
    "first_after_idle_over_p50",
)


def add_ratios(report: dict[str, Any]) -> None:
    rows = report["exporters"]
    if len(rows) == 2:
        mine, other = rows.values()
        report["ratio_smlens_over_other"] = {
            key: (mine[key] / other[key] if mine.get(key) is not None and other.get(key) else None)
            for key in KEYS
        }


def render(report: dict[str, Any]) -> str:
    rows = report["exporters"]
    names = list(rows)
    ratios = report.get("ratio_smlens_over_other")
    head = f"{'':24}" + "".join(f"{n:>14}" for n in names) + ("   smlens/other" if ratios else "")
    lines = [
        f"window {report['window_seconds']:.1f} s; " + "; ".join(f"{n}: {rows[n]['command']}" for n in names),
        head,
    ]
    for key in (*KEYS, "scrapes", "failed_scrapes", "metrics_bytes"):
        cells = "".join(
            f"{rows[n].get(key):>14.4f}"
            if isinstance(rows[n].get(key), float)
            else f"{rows[n].get(key)!s:>14}"
            for n in names
        )
        ratio = ratios.get(key) if ratios else None
        lines.append(f"{key:24}{cells}" + (f"   {ratio:13.3f}" if ratio is not None else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of scraping (default 60)")
    parser.add_argument("--scrapes", type=int, default=200, help="back-to-back scrapes each (default 200)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds without scrapes (default 30)")
    parser.add_argument("--idle-rounds", type=int, default=3, help="idle spells (default 3)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument(
        "--logs", type=Path, help="directory for the exporters' logs (default: a temporary one)"
    )
    parser.add_argument("--smlens-only", action="store_true", help="run smlens alone (no nvitop-exporter)")
    parser.add_argument(
        "--other", default=NVITOP, help="command of the exporter to compare with ({port}, {python})"
    )
    parser.add_argument("flags", nargs="*", help="extra `smlens serve` flags, after --")
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="peer_compare-"))
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mine = [
        sys.executable,
        "-m",
        "smlens",
        "serve",
        "--interval",
        "1",
        "--listen",
        f"127.0.0.1:{port}",
        *args.flags,
    ]
    exporters = [Exporter("smlens", mine, port, (logs / "smlens.log").open("w"))]
    if not args.smlens_only:
        port = free_port()
        other = shlex.split(args.other.format(port=port, python=shlex.quote(sys.executable)))
        name = "nvitop-exporter" if args.other == NVITOP else "other"
        exporters.append(Exporter(name, other, port, (logs / f"{name}.log").open("w")))
    try:
        for exporter in exporters:
            exporter.start()
        wait_ready(exporters)
        report = measure(exporters, args.duration)
        for name, row in latency(exporters, args.scrapes, args.idle, args.idle_rounds).items():
            report["exporters"][name].update(row)
    finally:
        for exporter in exporters:
            exporter.stop()
    add_ratios(report)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
