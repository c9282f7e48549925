"""What CUPTI's PM sampling offers on this GPU, read from CUPTI itself (no figure is assumed).

    python3 -m bench.truth.cupti_facts --out DIR

Writes DIR/cupti_facts.json: chip name, the base metrics whose names matter to ``smlens profile``, each one's
properties and sub-metrics, which metric lists PM sampling accepts in one pass, the peak values
(``<metric>.peak_sustained``) evaluated on a real sample, the ``pct_of_peak_sustained_elapsed`` CUPTI computes
next to our own normalisation, and whether work launched by another process shows in the samples.
Needs cupti-python 13.4, CuPy and a GPU; run as root or with profiling permission.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PREFIXES = (
    "sm__cycles",
    "sm__warps_active",
    "sm__pipe_tensor",
    "sm__inst_executed_pipe_tensor",
    "dram__",
    "gr__",
    "gpu__",
    "gpc__cycles",
    "sm__maximum_warps",
    "sm__throughput",
)
CANDIDATES = [
    "sm__cycles_active.avg",
    "sm__cycles_elapsed.avg",
    "sm__warps_active.avg",
    "sm__pipe_tensor_cycles_active.avg",
    "sm__pipe_tensor_op_hmma_cycles_active.avg",
    "sm__pipe_tensor_op_gmma_cycles_active.avg",
    "dram__bytes.sum",
    "dram__cycles_elapsed.avg",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gr__cycles_active.avg",
    "gr__cycles_elapsed.avg",
    "gpu__time_active.avg",
    "gpc__cycles_elapsed.avg",
]
CHILD = r"""
import json, sys, time
import cupy as cp, torch
MARK = cp.RawKernel(r'''extern "C" __global__ void mark(unsigned long long* t, int i) {
  unsigned long long g; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)); t[i] = g; }''', "mark")
SPIN = cp.RawKernel(r'''extern "C" __global__ void spin(long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long t = t0;
  while (t - t0 < (unsigned long long)ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }''', "spin")
sms = torch.cuda.get_device_properties(0).multi_processor_count
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
big = torch.empty(2**31, dtype=torch.uint8, device="cuda"); big2 = torch.empty_like(big)
st = cp.zeros(64, dtype=cp.uint64)
MARK((1,), (1,), (st, cp.int32(0))); SPIN((1,), (32,), (cp.int64(1000),)); a @ b; big2.copy_(big)
torch.cuda.synchronize()
host = []
print("ready", flush=True); sys.stdin.readline()
k = 0
for name in ("idle", "spin_half", "gemm", "copy", "idle2"):
    torch.cuda.synchronize(); host.append(time.time_ns())
    MARK((1,), (1,), (st, cp.int32(k))); k += 1
    if name.startswith("idle"): torch.cuda.synchronize(); time.sleep(0.05)
    elif name == "spin_half": SPIN((sms // 2,), (32,), (cp.int64(50_000_000),))
    elif name == "gemm":
        for _ in range(30): a @ b
    else:
        for _ in range(60): big2.copy_(big)
torch.cuda.synchronize(); host.append(time.time_ns())
MARK((1,), (1,), (st, cp.int32(k))); torch.cuda.synchronize()
names = ["idle", "spin_half", "gemm", "copy", "idle2"]
print(json.dumps({"names": names, "stamps": st[:k + 1].get().tolist(), "host": host}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {}

    def save() -> None:
        (args.out / "cupti_facts.json").write_text(json.dumps(facts, indent=1, default=str))

    import cupy as cp  # type: ignore[import-not-found,unused-ignore]
    import pynvml
    from cupti import pm_sampling  # type: ignore[import-not-found,unused-ignore]
    from cupti import profiler_host as ph  # type: ignore[import-not-found,unused-ignore]

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    facts["mem_used_before_context"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    cp.cuda.Device(0).use()
    cp.zeros(1)
    facts["mem_used_with_context"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    import cupti.cupti as cu  # type: ignore[import-not-found,unused-ignore]

    chip_params = cu.DeviceGetChipNameParams()
    chip_params.struct_size = cu.DEVICE_GET_CHIP_NAME_PARAMS_STRUCT_SIZE
    chip_params.device_index = 0
    cu.device_get_chip_name(chip_params.ptr)
    chip = chip_params.p_chip_name
    facts["chip"] = chip
    host = ph.ProfilerHost(chip, ph.ProfilerType.PM_SAMPLING)
    host.initialize()
    names: list[str] = []
    for mt in ph.MetricType:
        if mt.name.endswith("COUNT"):
            continue
        try:
            names += [f"{n} ({mt.name})" for n in host.get_base_metrics(mt)]
        except Exception as exc:
            facts.setdefault("base_errors", []).append(repr(exc))
    (args.out / "base_metrics.txt").write_text("\n".join(names) + "\n")
    facts["base_metrics"] = len(names)
    facts["matching"] = [n for n in names if n.startswith(PREFIXES)]
    props: dict[str, Any] = {}
    for name in CANDIDATES:
        base = name.split(".")[0]
        try:
            p = host.get_metric_properties(base)
            props[base] = {
                "description": p.description,
                "hw_unit": p.hw_unit,
                "dim_unit": p.dim_unit,
                "type": p.metric_type.name,
                "scope": p.metric_collection_scope.name,
            }
            props[base]["sub_metrics"] = host.get_sub_metrics(base, p.metric_type)
        except Exception as exc:
            props[base] = repr(exc)
    facts["properties"] = props
    save()
    # which metrics make a config image alone
    accepted: dict[str, str] = {}
    for name in CANDIDATES + [c.split(".")[0] + ".avg.peak_sustained" for c in CANDIDATES if ".avg" in c]:
        try:
            one = ph.ProfilerHost(chip, ph.ProfilerType.PM_SAMPLING)
            one.initialize()
            one.create_config_image([name])
            one.deinitialize()
            accepted[name] = "ok"
        except Exception as exc:
            accepted[name] = repr(exc)[:200]
    facts["accepted_alone"] = accepted
    host.deinitialize()
    save()
    col = pm_sampling.Collector(device_index=0)
    col.enable()
    main_set = [
        "sm__cycles_active.avg",
        "sm__cycles_elapsed.avg",
        "sm__warps_active.avg",
        "sm__pipe_tensor_cycles_active.avg",
        "dram__bytes.sum",
        "dram__cycles_elapsed.avg",
        "gr__cycles_active.avg",
        "gr__cycles_elapsed.avg",
    ]
    extras = [
        "sm__warps_active.avg.peak_sustained",
        "sm__pipe_tensor_cycles_active.avg.peak_sustained",
        "sm__cycles_active.avg.peak_sustained",
        "dram__bytes.sum.peak_sustained",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes.sum.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ]
    chosen = None
    for trial in (
        main_set + extras,
        main_set,
        [m for m in main_set if not m.startswith("gr__")] + extras,
        [m for m in main_set if not m.startswith("gr__")],
    ):
        try:
            col.configure(metrics=trial, hardware_buffer_size=256 << 20, sampling_interval=100_000)
            chosen = trial
            break
        except Exception as exc:
            facts.setdefault("configure_failed", []).append([trial, repr(exc)[:300]])
    facts["configured"] = chosen
    facts["mem_used_configured"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    save()
    if chosen is None:
        return 1
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout and child.stdin
    facts["child_ready"] = child.stdout.readline().strip()
    col.start()
    facts["mem_used_sampling"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    child.stdin.write("go\n")
    child.stdin.flush()
    result = json.loads(child.stdout.readline())
    child.wait()
    col.stop()
    t = time.perf_counter()
    data = col.decode(max_samples=100_000)
    facts["decode_s"] = time.perf_counter() - t
    t = time.perf_counter()
    samples = [(s.start_timestamp, s.end_timestamp, s.metric_values) for s in data]
    facts["evaluate_s"] = time.perf_counter() - t
    facts["samples"] = len(samples)
    facts["child"] = result
    facts["first_samples"] = samples[:3]
    stamps = result["stamps"]
    facts["stamp_minus_host_ns"] = [s - h for s, h in zip(stamps, result["host"], strict=True)]
    per: dict[str, list[list[float]]] = {}
    for st, en, v in samples:
        for i, name in enumerate(result["names"]):
            if stamps[i] + 300_000 <= st and en <= stamps[i + 1] - 300_000:
                per.setdefault(name, []).append(v)
    facts["metrics"] = chosen
    facts["by_phase_mean"] = {
        name: [sum(col_) / len(col_) for col_ in zip(*rows, strict=True)] for name, rows in per.items()
    }
    facts["by_phase_n"] = {name: len(rows) for name, rows in per.items()}
    with open(args.out / "samples.jsonl", "w") as f:
        for st, en, v in samples:
            f.write(json.dumps([st, en, v]) + "\n")
    # second capture from another process while this one is enabled
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            "import cupy as cp; cp.zeros(1)\nfrom cupti import pm_sampling\n"
            "c=pm_sampling.Collector(0); c.enable(); print('enabled', flush=True); "
            "c.configure(metrics=['sm__cycles_active.avg'], sampling_interval=100000); "
            "print('configured', flush=True); "
            "c.start(); print('started', flush=True)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    facts["second_capture"] = {"rc": second.returncode, "out": second.stdout, "err": second.stderr[-1500:]}
    col.disable()
    save()
    print(json.dumps(facts, indent=1, default=str)[-6000:])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
