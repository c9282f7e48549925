"""Known GPU phases for the profile truth test, run in their own process (as a user's job would be).

    python3 -m bench.truth.phases schedule|cold|steady|gemm-rate [--reps N] [--seconds S]

After compiling and warming up every kernel (except in ``cold`` mode) it prints ``ready`` and waits for a
line on stdin, then runs and prints one JSON line:

* ``schedule``: N repetitions of idle gap, spin kernels on 1, S/2 and S blocks, all SMs full, a bf16 GEMM
  stretch and a launch-bound stretch; each phase's start is stamped on the GPU by a kernel that writes
  ``%globaltimer`` (in stream order, so the stamp is when the GPU reached the phase);
* ``cold``: the first probe's layout, with nothing warmed up (kernels compile and cuBLAS loads inside it);
* ``steady``: each workload of the truth harness for a while, with an NVML GPM reading over its middle second;
* ``gemm-rate``: bf16 8192^3 GEMMs for S seconds, TFLOP/s;
* ``gemm-blocks``: one JSON line per line read on stdin (until ``quit``): a block of the same number of
  bf16 8192^3 GEMMs (about S seconds), timed with CUDA events, TFLOP/s; a ``probe`` line runs the block
  under a PM sampling capture of this process's own (needs cupti-python).
Needs CuPy, PyTorch and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from typing import Any

from bench.truth.device import read_limits
from bench.truth.expect import spin_shapes
from bench.truth.workloads import Copy, Gemm, Running, SpinWorkload, Workload, spin_kernel

_MARK_SOURCE = r"""
extern "C" __global__ void smlens_truth_mark(unsigned long long* stamps, int index) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    stamps[index] = now;
}
"""
PHASE_NS = 40_000_000
GEMM_SIZE = 8192
LAUNCH_BOUND_SIZE = 256
LAUNCH_BOUND_LAUNCHES = 1500
SCHEDULE_SPINS = ("spin_one_warp", "spin_half_sms", "spin_warp_per_sm", "spin_full_occupancy")


class Gpu:
    def __init__(self) -> None:
        import cupy  # type: ignore[import-not-found,unused-ignore]
        import torch  # type: ignore[import-not-found,unused-ignore]

        self.cp, self.torch = cupy, torch
        self.limits = read_limits(0)
        self.shapes = spin_shapes(self.limits)
        self.kernels: dict[str, Any] = {}
        self.mark_kernel = cupy.RawKernel(_MARK_SOURCE, "smlens_truth_mark")
        self.stamps = cupy.zeros(8192, dtype=cupy.uint64)
        self.count = 0
        self.names: list[str] = []
        self.host_ns: list[int] = []
        self.tensors: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        self.host_ns.append(time.time_ns())
        self.mark_kernel((1,), (1,), (self.stamps, self.cp.int32(self.count)))
        self.names.append(name)
        self.count += 1

    def spin(self, name: str, nanoseconds: int) -> None:
        shape = self.shapes[name]
        if name not in self.kernels:
            kernel = spin_kernel(shape, self.limits)
            # every shape compiles to one CUDA function: allow the largest shared memory any shape asks for
            kernel.max_dynamic_shared_size_bytes = max(
                x.shared_bytes(self.limits) for x in self.shapes.values()
            )
            self.kernels[name] = kernel
        self.kernels[name](
            (shape.blocks,),
            (shape.threads,),
            (self.cp.uint64(nanoseconds),),
            shared_mem=shape.shared_bytes(self.limits),
        )

    def allocate(self, size: int) -> None:
        torch = self.torch
        if size not in self.tensors:
            a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
            self.tensors[size] = (a, torch.randn_like(a), torch.empty_like(a))

    def gemm(self, size: int, times: int) -> None:
        self.allocate(size)
        a, b, c = self.tensors[size]
        for _ in range(times):
            self.torch.matmul(a, b, out=c)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def idle(self, seconds: float) -> None:
        self.sync()
        time.sleep(seconds)

    def result(self, **extra: Any) -> dict[str, Any]:
        self.sync()
        return {
            "names": self.names,
            "stamps": [int(x) for x in self.stamps[: self.count].get().tolist()],
            "host_ns": self.host_ns,
            "sm_count": self.limits.sm_count,
            "max_warps_per_sm": self.limits.max_warps_per_sm,
            "shapes": {k: [v.sms, v.blocks_per_sm, v.threads] for k, v in self.shapes.items()},
            **extra,
        }


def gemm_launches_for(gpu: Gpu, seconds: float) -> int:
    """How many 8192^3 GEMMs take about ``seconds`` (timed after warm-up)."""
    gpu.gemm(GEMM_SIZE, 3)
    gpu.sync()
    t = time.perf_counter()
    gpu.gemm(GEMM_SIZE, 10)
    gpu.sync()
    return max(1, round(seconds / ((time.perf_counter() - t) / 10)))


def schedule(gpu: Gpu, reps: int, warm: bool) -> dict[str, Any]:
    gemms = gemm_launches_for(gpu, PHASE_NS / 1e9) if warm else 24
    if warm:
        for name in SCHEDULE_SPINS:
            gpu.spin(name, 1000)
        gpu.gemm(LAUNCH_BOUND_SIZE, 10)
        gpu.sync()
    ready()
    for _ in range(reps):
        gpu.mark("idle")
        gpu.idle(0.03)
        for name in SCHEDULE_SPINS:
            gpu.mark(name)
            gpu.spin(name, PHASE_NS)
        gpu.mark("gemm_bf16")
        gpu.gemm(GEMM_SIZE, gemms)
        gpu.mark("launch_bound")
        gpu.sync()
        gpu.gemm(LAUNCH_BOUND_SIZE, LAUNCH_BOUND_LAUNCHES)
    gpu.mark("end")
    return gpu.result(gemms_per_phase=gemms)


def cold(gpu: Gpu, reps: int) -> dict[str, Any]:
    """The first probe's phase layout, nothing warmed: spin 1 block, S/2 blocks x 1 warp, S x 8 warps,
    30 GEMMs, 50 ms idle; each spin 50 ms."""
    import cupy  # type: ignore[import-not-found,unused-ignore]

    spin = cupy.RawKernel(
        r"""extern "C" __global__ void probe_spin(long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long t = t0;
  while (t - t0 < (unsigned long long)ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }""",
        "probe_spin",
    )
    s = gpu.limits.sm_count
    gpu.allocate(GEMM_SIZE)
    ready()
    for _ in range(reps):
        for name, grid in (("spin_1", (1, 32)), ("spin_half", (s // 2, 32)), ("spin_all_8w", (s, 256))):
            gpu.mark(name)
            spin((grid[0],), (grid[1],), (cupy.int64(50_000_000),))
        gpu.mark("gemm")
        gpu.gemm(GEMM_SIZE, 30)
        gpu.mark("idle")
        gpu.idle(0.05)
    gpu.mark("end")
    return gpu.result()


def _gpm() -> tuple[Any, Any, Any]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def sample() -> Any:
        s = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, s)
        return s

    ids = (
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    )

    def metrics(a: Any, b: Any) -> list[float]:
        g = pynvml.c_nvmlGpmMetricsGet_t()
        g.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        g.numMetrics = len(ids)
        g.sample1, g.sample2 = a, b
        for i, metric in enumerate(ids):
            g.metrics[i].metricId = metric
        pynvml.nvmlGpmMetricsGet(g)
        return [g.metrics[i].value / 100 for i in range(len(ids))]

    return pynvml, sample, metrics


def steady(gpu: Gpu, seconds: float) -> dict[str, Any]:
    """Each workload alone for ``seconds``; GPM over [0.3 s, seconds - 0.3 s]; host clock windows."""
    _, sample, metrics = _gpm()
    limits = gpu.limits
    workloads: list[Workload] = [
        Workload(),
        *(SpinWorkload(n, spin_shapes(limits)[n], limits) for n in SCHEDULE_SPINS),
        Gemm("gemm_bf16", GEMM_SIZE, 64, "bf16 GEMM"),
        Gemm("gemm_tiny_launch_bound", LAUNCH_BOUND_SIZE, LAUNCH_BOUND_LAUNCHES, "launch-bound"),
        Copy(max(2**31, 16 * limits.l2_bytes)),
    ]
    ready()
    windows = []
    for w in workloads:
        w.prepare()  # here, not ahead: every spin shape shares one CUDA function and its shared-memory limit
        running = Running(w)
        time.sleep(0.3)
        a, t0 = sample(), time.time_ns()
        time.sleep(seconds - 0.6)
        b, t1 = sample(), time.time_ns()
        running.stop()
        windows.append({"name": w.name, "host_ns": [t0, t1], "gpm": metrics(a, b)})
        time.sleep(0.05)
        w.release()
    return {"windows": windows, "gpm_keys": ["sm_active", "occupancy", "tensor", "dram"], **clock_offset(gpu)}


def clock_offset(gpu: Gpu) -> dict[str, Any]:
    """%globaltimer minus the host's CLOCK_REALTIME, from marks on an idle GPU (median of 20)."""
    offsets = []
    for _ in range(20):
        gpu.sync()
        before = time.time_ns()
        gpu.mark("clock")
        gpu.sync()
        after = time.time_ns()
        offsets.append(int(gpu.stamps[gpu.count - 1].get()) - (before + after) // 2)
    offsets.sort()
    return {"globaltimer_minus_host_ns": offsets[len(offsets) // 2], "spread_ns": offsets[-1] - offsets[0]}


def gemm_rate(gpu: Gpu, seconds: float) -> dict[str, Any]:
    gpu.gemm(GEMM_SIZE, 3)
    gpu.sync()
    ready()
    done, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        gpu.gemm(GEMM_SIZE, 10)
        gpu.sync()
        done += 10
    return {"tflops": 2 * GEMM_SIZE**3 * done / (time.perf_counter() - t) / 1e12}


def gemm_blocks(gpu: Gpu, seconds: float) -> dict[str, Any]:
    """One block per stdin line: ``go``, or ``probe`` for a block under a PM sampling capture made by this
    process itself (the first probe's layout: its four metrics, 100 us, decoded after the block)."""
    from bench.truth.pm_quiet import PROBE_METRICS, QuietCapture, QuietSpec

    launches = gemm_launches_for(gpu, seconds)
    start, end = gpu.torch.cuda.Event(enable_timing=True), gpu.torch.cuda.Event(enable_timing=True)

    def block() -> float:
        start.record()
        gpu.gemm(GEMM_SIZE, launches)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    print("ready", flush=True)
    blocks = 0
    while (command := sys.stdin.readline().strip()) not in ("quit", ""):
        extra: dict[str, Any] = {}
        if command == "probe":
            with ExitStack() as stack:
                try:
                    capture = stack.enter_context(QuietCapture(QuietSpec(PROBE_METRICS, 100_000)))
                    capture.start()
                except Exception as exc:  # no block then: the bench records the arm's failure and goes on
                    print(json.dumps({"error": f"the capture did not start: {exc}"}), flush=True)
                    continue
                ms = block()
                try:
                    extra["capture"] = capture.finish(ms / 1000)
                except Exception as exc:  # it sampled during the block, so the timing stands
                    extra["capture"] = {"error": str(exc)}
        else:
            ms = block()
        print(json.dumps({"tflops": 2 * GEMM_SIZE**3 * launches / ms / 1e9, "ms": ms, **extra}), flush=True)
        blocks += 1
    return {"blocks": blocks, "launches": launches}


def ready() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("mode", choices=("schedule", "cold", "steady", "gemm-rate", "gemm-blocks"))
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.6)
    args = parser.parse_args()
    gpu = Gpu()
    if args.mode == "schedule":
        result = schedule(gpu, args.reps, warm=True)
    elif args.mode == "cold":
        result = cold(gpu, args.reps)
    elif args.mode == "steady":
        result = steady(gpu, args.seconds)
    elif args.mode == "gemm-blocks":
        result = gemm_blocks(gpu, args.seconds)
    else:
        result = gemm_rate(gpu, args.seconds)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
