"""Benchmark (GPU host): what NVML itself costs in resident memory, and where each exporter's RSS goes.

    PYTHONPATH=exporter python3 bench/nvml_memory.py steps            # smlens' NVML calls, one at a time
    PYTHONPATH=exporter python3 bench/nvml_memory.py side-by-side     # five processes, 40 s, smaps by mapping

``steps`` makes, in this process, the NVML calls smlens makes on GPU 0 (init, identity, utilization and
its samples, process lists, energy, power, clocks, ECC, PCIe, MIG mode, event types, the XID event set and
a wait, GPM support, two GPM samples and a metrics read) and prints VmRSS, RssAnon, RssFile and whether
libcuda is mapped after each. ``side-by-side`` starts nvitop-exporter, smlens (auto, ``--backend nvml``,
``--backend sim``) and two bare interpreters (pynvml initialised; and with prometheus_client serving), scrapes
the exporters once a second for ``--seconds``, then prints each process's status and its 25 largest
mappings (Rss and Anonymous, KiB, grouped by file name). docs/performance.md ("Memory") has the figures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

COMMANDS = {
    "nvitop": "{py} -m nvitop_exporter --interval 1.0 --bind-address 127.0.0.1 --port {port}",
    "smlens": "{py} -m smlens serve --interval 1 --listen 127.0.0.1:{port}",
    "smlens_nvml": "{py} -m smlens serve --backend nvml --interval 1 --listen 127.0.0.1:{port}",
    "smlens_sim": "{py} -m smlens serve --backend sim --interval 1 --listen 127.0.0.1:{port}",
    "bare_nvml": "{py} -c 'import pynvml,time;pynvml.nvmlInit();"
    "pynvml.nvmlDeviceGetHandleByIndex(0);time.sleep(600)'",
    "bare_prom": "{py} -c 'import pynvml,time,prometheus_client as p;pynvml.nvmlInit();"
    'p.start_http_server({port},"127.0.0.1");time.sleep(600)\'',
}
NOT_SCRAPED = ("bare_nvml",)


def status(pid: int | str = "self") -> dict[str, Any]:
    fields: dict[str, Any] = {}
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                fields[key] = int(value.split()[0])
    with open(f"/proc/{pid}/maps") as maps:
        fields["libcuda"] = any("libcuda" in line for line in maps)
    return fields


def mappings(pid: int) -> dict[str, tuple[int, int]]:
    """KiB of Rss and Anonymous per mapped file name ([anon], [heap], ...), the 25 largest."""
    rss: collections.Counter[str] = collections.Counter()
    anonymous: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as lines:
        for line in lines:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else "[anon]"
                name = os.path.basename(path) if path.startswith("/") else path
            elif line.startswith("Rss:"):
                rss[name] += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anonymous[name] += int(line.split()[1])
    return {key: (rss[key], anonymous[key]) for key, _ in rss.most_common(25)}


def steps() -> None:
    import pynvml as nv

    def step(name: str, call: Callable[[], object] = lambda: None) -> None:
        try:
            call()
            error = ""
        except nv.NVMLError as exc:
            error = f" ERR {exc!r}"[:80]
        print(f"{name + error:24s} {status()}", flush=True)

    step("import")
    step("init", nv.nvmlInit)
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("uuid", lambda: nv.nvmlDeviceGetUUID(handle)),
        ("name", lambda: nv.nvmlDeviceGetName(handle)),
        ("mem", lambda: nv.nvmlDeviceGetMemoryInfo(handle)),
        ("util", lambda: nv.nvmlDeviceGetUtilizationRates(handle)),
        ("samples", lambda: nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)),
        ("procutil", lambda: nv.nvmlDeviceGetProcessUtilization(handle, 0)),
        ("procs", lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)),
        ("mps", lambda: nv.nvmlDeviceGetMPSComputeRunningProcesses(handle)),
        ("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle)),
        ("power", lambda: nv.nvmlDeviceGetPowerUsage(handle)),
        ("temp", lambda: nv.nvmlDeviceGetTemperature(handle, 0)),
        ("clock", lambda: nv.nvmlDeviceGetClockInfo(handle, 1)),
        ("maxclock", lambda: nv.nvmlDeviceGetMaxClockInfo(handle, 1)),
        ("ecc", lambda: nv.nvmlDeviceGetTotalEccErrors(handle, 1, 1)),
        ("pcie", lambda: nv.nvmlDeviceGetPcieReplayCounter(handle)),
        ("mig", lambda: nv.nvmlDeviceGetMigMode(handle)),
        ("attrs", lambda: nv.nvmlDeviceGetAttributes(handle)),
        ("cores", lambda: nv.nvmlDeviceGetNumGpuCores(handle)),
        ("pci", lambda: nv.nvmlDeviceGetPciInfo(handle)),
        ("clkreasons", lambda: nv.nvmlDeviceGetSupportedClocksEventReasons(handle)),
        ("evtypes", lambda: nv.nvmlDeviceGetSupportedEventTypes(handle)),
    ]
    for name, call in calls:
        step(name, call)
    events = nv.nvmlEventSetCreate()
    step("eventset")
    step("register", lambda: nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events))
    step("wait", lambda: nv.nvmlEventSetWait(events, 50))  # times out: no XID
    step("gpmsupport", lambda: nv.nvmlGpmQueryDeviceSupport(handle))
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    step("gpmalloc")
    step("gpmget", lambda: nv.nvmlGpmSampleGet(handle, first))
    time.sleep(0.2)  # GPM counters refresh about every 100 ms
    nv.nvmlGpmSampleGet(handle, second)
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
    step("gpmmetrics", lambda: nv.nvmlGpmMetricsGet(request))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def side_by_side(seconds: float) -> None:
    started: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    for name, command in COMMANDS.items():
        port = free_port()
        with open(f"/tmp/nvml_memory-{name}.err", "w") as err:
            process = subprocess.Popen(
                command.format(py=sys.executable, port=port),
                shell=True,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        started[name] = (process, port)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, (_, port) in started.items():
            if name not in NOT_SCRAPED:
                with contextlib.suppress(OSError):  # not serving yet
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        time.sleep(1)
    for name, (process, _) in started.items():
        pid = process.pid  # the shell execs a single command, so this is the process itself
        try:
            print(f"== {name} pid {pid} {status(pid)}")
            for mapped, (rss, anonymous) in mappings(pid).items():
                print(f"   {rss:8d} KiB rss {anonymous:8d} anon  {mapped}")
        except OSError as exc:
            with open(f"/tmp/nvml_memory-{name}.err") as err:
                print(f"== {name}: {exc!r}; stderr: {err.read()[-500:]}")
        process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("mode", choices=("steps", "side-by-side"))
    parser.add_argument("--seconds", type=float, default=40.0, help="side-by-side: scraping time")
    args = parser.parse_args()
    if args.mode == "steps":
        steps()
    else:
        side_by_side(args.seconds)


if __name__ == "__main__":
    main()
