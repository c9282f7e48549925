"""The truth test of `smlens profile`'s verdict classes: known workloads under a capture, each sample's class
(smlens.profile.analysis.classify) counted per workload, the pipe counters' passes, peaks and normalisation
read from CUPTI itself, and the typical step of a small training loop.

    PYTHONPATH=exporter python3 -m bench.truth.profile_verdicts run --out DIR [--interval-us 100]
        [--sections facts,known,pct,cli]

(on the H200 machine, with the wheels in /tmp/site and their libcupti loaded first, as docs/profile.md says:
``L=/tmp/site/nvidia/cu13/lib LD_PRELOAD=$L/libcupti.so.13:$L/libnvperf_host.so:$L/libnvperf_target.so``).
Sections, each recorded in DIR/profile_verdicts.json (a failing one is recorded and the rest still run):

* ``facts``: which libcupti the process loaded; CUPTI's properties and sub-metrics of the pipe counters;
  how many passes PM sampling needs for smlens' counters with and without each pipe counter (CUPTI's host
  API, no GPU work);
* ``known``: a workload process (``child rounds``, its own process, as a user's job would be) runs, each
  phase stamped on the GPU by a ``%globaltimer`` kernel: an idle gap, bf16 8192^3 GEMMs, a 1 GiB
  device-to-device copy, a pointer chase over 1 GiB, a spin kernel filling every SM, a one-warp spin, FP32
  FMA chains, FP64 FMA chains, integer chains, a second idle gap, then a small training loop (host gap, a
  memory-bound pass over 1 GiB, a bf16 MLP forward and backward, a fused AdamW step). smlens' capture session
  records it; per workload the share of samples in each class (checked against EXPECTED, or unknown where the
  recording lacks the pipe counter the class needs), the mean ratios, and what the workload did over its
  stamped time beside the pipe's peak at the measured SM clock; the training loop's detected step and
  breakdown next to its stamps. The capture goes to DIR/known.json.gz (``smlens profile --from-json`` reads
  its ``capture``);
* ``pct``: a bare cupti-python Collector with each pipe counter alone beside the elapsed cycles, its
  ``.peak_sustained`` and its ``.pct_of_peak_sustained_elapsed``, over a shorter schedule: smlens'
  normalisation beside CUPTI's own; then, if some set of every pipe counter and most required ones fits in
  a pass, one ``known`` round with it, saved raw to DIR/alt.json.gz;
* ``cli``: ``smlens profile`` itself over the training loop; its printed summary.

Needs cupti-python 13.4, CuPy, PyTorch and a GPU; exits 1 if a check fails or a section breaks, 2 if it
cannot start.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

KNOWN_BUSY = (
    "gemm_bf16",
    "copy_d2d",
    "pointer_chase",
    "spin_full_occupancy",
    "spin_one_warp",
    "fp32_fma",
    "fp64_fma",
    "int_alu",
)
TRAIN_PHASES = ("data", "augment", "fwd_bwd", "optimizer")
# What each workload's samples must mostly be (the class of most of its samples); the pipe a compute-bound
# one names over its samples.
EXPECTED = {
    "idle": ("idle", None),
    "gemm_bf16": ("compute_bound", "tensor"),
    "copy_d2d": ("memory_bound", None),
    "pointer_chase": ("stalled", None),
    "spin_full_occupancy": ("stalled", None),
    "spin_one_warp": ("hollow", None),
    "fp32_fma": ("compute_bound", "fp32"),
    "fp64_fma": ("compute_bound", "fp64"),
    "int_alu": ("compute_bound", "integer"),
    "idle_gap": ("idle", None),
}
PHASE_SECONDS = 0.4
KNOWN_GUARD_NS = 2_000_000
TRAIN_GUARD_NS = 300_000
TRAIN_STEPS = 60
AUGMENT_PASSES = 6
MLP_WIDTH, MLP_BATCH, MLP_LAYERS = 4096, 8192, 3

FP64_KERNEL = "smlens_truth_dfma"
# As the FP32 kernel of workloads.py, in double: 8 independent DFMA chains a thread.
_FP64_SOURCE = r"""
extern "C" __global__ void smlens_truth_dfma(double* sink, int iterations, double a, double b) {
    double x0 = threadIdx.x * 1e-9, x1 = x0 + 0.1, x2 = x0 + 0.2, x3 = x0 + 0.3;
    double x4 = x0 + 0.4, x5 = x0 + 0.5, x6 = x0 + 0.6, x7 = x0 + 0.7;
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            x0 = fma(x0, a, b); x1 = fma(x1, a, b); x2 = fma(x2, a, b); x3 = fma(x3, a, b);
            x4 = fma(x4, a, b); x5 = fma(x5, a, b); x6 = fma(x6, a, b); x7 = fma(x7, a, b);
        }
    }
    double sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    if (sum == -1.0) sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""
ALU_KERNEL = "smlens_truth_alu"
# 8 independent chains of xor then add (LOP3, IADD3 in the source's count: 2 integer operations a link).
_ALU_SOURCE = r"""
extern "C" __global__ void smlens_truth_alu(unsigned int* sink, int iterations, unsigned int a,
                                            unsigned int b) {
    unsigned int x0 = threadIdx.x, x1 = x0 ^ 0x1111u, x2 = x0 ^ 0x2222u, x3 = x0 ^ 0x3333u;
    unsigned int x4 = x0 ^ 0x4444u, x5 = x0 ^ 0x5555u, x6 = x0 ^ 0x6666u, x7 = x0 ^ 0x7777u;
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            x0 = (x0 ^ a) + b; x1 = (x1 ^ a) + b; x2 = (x2 ^ a) + b; x3 = (x3 ^ a) + b;
            x4 = (x4 ^ a) + b; x5 = (x5 ^ a) + b; x6 = (x6 ^ a) + b; x7 = (x7 ^ a) + b;
        }
    }
    unsigned int sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    if (sum == 0xffffffffu) sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""
OPS_PER_ITERATION = 128  # chain links a thread does per iteration: 8 chains x 16 unrolled


def say(text: str) -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------------------------------------
# The workload process


def _raw_workloads(limits: Any) -> dict[str, Any]:
    """The FP32, FP64 and integer chain workloads and the pointer chase, each launch ~0.1 s."""
    from bench.truth.expect import pipe_shape
    from bench.truth.workloads import Fp32Fma, PointerChase, RawKernelWorkload

    class Fp64Fma(RawKernelWorkload):
        source, kernel_name, probe = _FP64_SOURCE, FP64_KERNEL, 64

        def allocate(self) -> list[Any]:
            import cupy  # type: ignore[import-not-found,unused-ignore]

            return [cupy.zeros(self.threads, dtype=cupy.float64)]

        def arguments(self, count: int) -> tuple[Any, ...]:
            import cupy  # type: ignore[import-not-found,unused-ignore]

            return (self._buffers[0], cupy.int32(count), cupy.float64(0.999), cupy.float64(0.001))

        def done(self, count: int) -> float:
            return 2.0 * OPS_PER_ITERATION * count * self.threads

    class IntAlu(RawKernelWorkload):
        source, kernel_name, probe = _ALU_SOURCE, ALU_KERNEL, 256

        def allocate(self) -> list[Any]:
            import cupy  # type: ignore[import-not-found,unused-ignore]

            return [cupy.zeros(self.threads, dtype=cupy.uint32)]

        def arguments(self, count: int) -> tuple[Any, ...]:
            import cupy  # type: ignore[import-not-found,unused-ignore]

            return (self._buffers[0], cupy.int32(count), cupy.uint32(0x9E3779B9), cupy.uint32(0x7F4A7C15))

        def done(self, count: int) -> float:
            return 2.0 * OPS_PER_ITERATION * count * self.threads  # integer operations, by the source

    shape = pipe_shape(limits)
    return {
        "fp32_fma": Fp32Fma(limits, 0.1),
        "fp64_fma": Fp64Fma("fp64_fma", "FP64 FMA chains", "flop", shape, 0.1),
        "int_alu": IntAlu("int_alu", "integer xor-add chains", "ops", shape, 0.1),
        "pointer_chase": PointerChase(limits, 0.1),
    }


class Trainer:
    """A small training loop whose phases are stamped: a host gap (data loading), a memory-bound pass over
    1 GiB (augmentation), a bf16 MLP forward and backward, a fused AdamW step."""

    def __init__(self, gpu: Any) -> None:
        torch = gpu.torch
        self.gpu = gpu
        torch.manual_seed(0)
        layers: list[Any] = []
        for _ in range(MLP_LAYERS):
            layers += [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH, bias=False), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*layers).to("cuda", torch.bfloat16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.x = torch.randn(MLP_BATCH, MLP_WIDTH, device="cuda", dtype=torch.bfloat16)
        self.augment = torch.ones(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
        for _ in range(3):
            self.step(marks=False)
        gpu.sync()

    def step(self, marks: bool = True) -> None:
        mark = self.gpu.mark if marks else (lambda _: None)
        mark("data")
        self.gpu.sync()
        time.sleep(0.004)
        mark("augment")
        for _ in range(AUGMENT_PASSES):
            self.augment.mul_(0.999)
        mark("fwd_bwd")
        loss = self.model(self.x).float().square().mean()
        loss.backward()
        mark("optimizer")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def flop(self) -> float:
        """Forward and backward matrix FLOP of one step."""
        return 3 * MLP_LAYERS * 2.0 * MLP_BATCH * MLP_WIDTH * MLP_WIDTH


def child(mode: str, seconds: float) -> int:
    """``train``: the training loop, unstamped, for ``seconds``. ``rounds``: after ``ready``, one schedule per
    line read (``known``: every workload and the training loop; ``pipes``: the compute and copy workloads,
    shorter), each answered with one JSON line; any other line ends it."""
    from bench.truth.expect import spin_shapes
    from bench.truth.phases import GEMM_SIZE, Gpu, gemm_launches_for
    from bench.truth.workloads import copy_bytes

    gpu = Gpu()
    torch = gpu.torch
    limits = gpu.limits
    if mode == "train":
        trainer = Trainer(gpu)
        print("ready", flush=True)
        sys.stdin.readline()
        began = time.monotonic()
        steps = 0
        while time.monotonic() - began < seconds:
            trainer.step(marks=False)
            steps += 1
        gpu.sync()
        print(json.dumps({"steps": steps}), flush=True)
        return 0
    gemms = gemm_launches_for(gpu, PHASE_SECONDS)
    size = copy_bytes(limits)
    source = torch.randint(0, 255, (size,), device="cuda", dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)
    gpu.sync()
    t = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    gpu.sync()
    copy_s = (time.perf_counter() - t) / 10
    raws = _raw_workloads(limits)
    for w in raws.values():
        w.prepare()
    shapes = spin_shapes(limits)
    for name in ("spin_one_warp", "spin_full_occupancy"):
        gpu.spin(name, 1000)
    trainer = Trainer(gpu)
    gpu.sync()
    print("ready", flush=True)
    while (command := sys.stdin.readline().strip()) in ("known", "pipes"):
        full = command == "known"
        phase_s = PHASE_SECONDS if full else 0.2
        gpu.count, gpu.names, gpu.host_ns = 0, [], []
        work: dict[str, float] = {}
        gpu.mark("idle")
        gpu.idle(0.3 if full else 0.1)
        gpu.mark("gemm_bf16")
        launches = max(1, round(gemms * phase_s / PHASE_SECONDS))
        gpu.gemm(GEMM_SIZE, launches)
        work["gemm_bf16"] = 2.0 * GEMM_SIZE**3 * launches
        gpu.mark("copy_d2d")
        copies = max(1, round(phase_s / copy_s))
        for _ in range(copies):
            target.copy_(source)
        work["copy_d2d"] = 2.0 * size * copies
        launches = max(1, round(phase_s / 0.1))
        for name in (
            "pointer_chase",
            "spin_full_occupancy",
            "spin_one_warp",
            "fp32_fma",
            "fp64_fma",
            "int_alu",
        ):
            if name.startswith("spin"):
                gpu.mark(name)
                gpu.spin(name, int((phase_s if name == "spin_full_occupancy" else phase_s / 2) * 1e9))
                continue
            if name == "pointer_chase" and not full:
                continue
            w = raws[name]
            gpu.mark(name)
            for _ in range(launches):
                w.launch(w.count)
            work[name] = launches * w.done(w.count)
        gpu.mark("idle_gap")
        gpu.idle(0.2 if full else 0.1)
        if full:
            for _ in range(TRAIN_STEPS):
                trainer.step()
        gpu.mark("end")
        result = gpu.result(
            work=work,
            train_flop_per_step=trainer.flop(),
            augment_bytes_per_step=2.0 * 4 * 2**28 * AUGMENT_PASSES,
            launches=launches,
            counts={k: w.count for k, w in raws.items()},
            compute_capability=list(limits.compute_capability or ()),
            peak_dram_bytes_per_second=limits.peak_dram_bytes_per_second,
            spin_shapes={k: [v.sms, v.blocks_per_sm, v.threads] for k, v in shapes.items()},
        )
        print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------
# The harness process


class Child:
    """A ``child MODE`` process, once it has printed ``ready``."""

    def __init__(self, mode: str, seconds: float = 0.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.truth.profile_verdicts", "child", mode, "--seconds", str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self._line()
        if line != "ready":
            self.process.kill()
            raise RuntimeError(f"child {mode} did not start: {line!r}")

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def ask(self, command: str) -> Any:
        """Run one schedule; its JSON line."""
        self.send(command)
        line = self._line()
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"child answered {line[-300:]!r} to {command}") from None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


def loaded_libraries(*names: str) -> list[str]:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if any(n in os.path.basename(p) for n in names))


def facts_section(results: dict[str, Any]) -> None:
    import cupti.cupti as cu  # type: ignore[import-not-found,import-untyped,unused-ignore]
    from cupti import profiler_host as ph  # type: ignore[import-not-found,import-untyped,unused-ignore]

    from smlens.profile.counters import COUNTERS, PEAK_OF, PIPE_COUNTERS

    chip_params = cu.DeviceGetChipNameParams()
    chip_params.struct_size = cu.DEVICE_GET_CHIP_NAME_PARAMS_STRUCT_SIZE
    chip_params.device_index = 0
    cu.device_get_chip_name(chip_params.ptr)
    chip = chip_params.p_chip_name
    facts: dict[str, Any] = {"chip": chip, "libraries": loaded_libraries("libcupti", "libnvperf")}
    host = ph.ProfilerHost(chip, ph.ProfilerType.PM_SAMPLING)
    host.initialize()
    props: dict[str, Any] = {}
    for counter in (*PIPE_COUNTERS, "sm__pipe_tensor_cycles_active.avg"):
        base = counter.split(".")[0]
        try:
            p = host.get_metric_properties(base)
            subs = host.get_sub_metrics(base, p.metric_type)
            props[base] = {
                "description": p.description,
                "hw_unit": p.hw_unit,
                "dim_unit": p.dim_unit,
                "type": getattr(p.metric_type, "name", str(p.metric_type)),
                "scope": getattr(p.metric_collection_scope, "name", str(p.metric_collection_scope)),
                "sub_metrics": list(subs)[:200],
                "sub_metric_count": len(subs),
            }
        except Exception as exc:
            props[base] = repr(exc)[:300]
    facts["properties"] = props
    host.deinitialize()
    facts["session_metrics_passes"] = passes(chip, [*COUNTERS, *(PEAK_OF[c] for c in PEAK_OF)])
    try:
        facts["max_hardware_metrics_per_pass"] = ph.get_max_num_hardware_metrics_per_pass(
            chip, ph.ProfilerType.PM_SAMPLING
        )
    except Exception as exc:
        facts["max_hardware_metrics_per_pass"] = repr(exc)[:200]
    try:
        sets = ph.get_single_pass_sets(chip)
        facts["single_pass_sets"] = {}
        for name in sets:
            members = ph.get_metrics_in_single_pass_set(chip, name)
            facts["single_pass_sets"][name] = {
                "count": len(members),
                "of_interest": [m for m in members if m.startswith(("sm__pipe", "sm__cycles", "sm__warps"))]
                + [m for m in members if m.startswith(("dram__bytes", "gr__", "sm__inst_executed_pipe"))],
            }
    except Exception as exc:
        facts["single_pass_sets"] = repr(exc)[:200]
    results["facts"] = facts
    say(json.dumps(facts, indent=1)[:6000])
    results["passes"] = explore_passes(chip)
    say(json.dumps(results["passes"], indent=0)[:8000])


EXTRA_CANDIDATES = (
    "sm__pipe_fmaheavy_cycles_active.avg",
    "sm__pipe_fmalite_cycles_active.avg",
    "sm__pipe_shared_cycles_active.avg",
    "sm__inst_executed_pipe_fma.avg",
    "sm__inst_executed_pipe_alu.avg",
    "sm__inst_executed_pipe_fp64.avg",
    "sm__inst_executed.avg",
    "smsp__pipe_fma_cycles_active.avg",
    "sm__pipe_fma_cycles_active.sum",
)


def passes(chip: str, metrics: Sequence[str]) -> int | str:
    """How many passes PM sampling needs for ``metrics`` (CUPTI's host API; no GPU work)."""
    from cupti import profiler_host as ph  # type: ignore[import-not-found,import-untyped,unused-ignore]

    host = ph.ProfilerHost(chip, ph.ProfilerType.PM_SAMPLING)
    host.initialize()
    try:
        return int(ph.get_num_of_passes(host.create_config_image(list(metrics))))
    except Exception as exc:
        return repr(exc)[:120]
    finally:
        host.deinitialize()


def explore_passes(chip: str) -> dict[str, Any]:
    """Which sets of smlens' counters and the pipe counters fit in one pass."""
    from itertools import combinations

    from smlens.profile.counters import PIPE_COUNTERS, REQUIRED

    def short(names: Sequence[str]) -> str:
        return "+".join(x.split(".")[0] for x in names) or "-"

    out: dict[str, Any] = {"single": {}, "required_plus": {}, "required_minus_plus_pipes": {}, "other": {}}
    for m in (*REQUIRED, *PIPE_COUNTERS, *EXTRA_CANDIDATES):
        out["single"][m] = passes(chip, [m])
    out["required"] = passes(chip, REQUIRED)
    for k in (1, 2, 3):
        for extra in combinations(PIPE_COUNTERS, k):
            out["required_plus"][short(extra)] = passes(chip, [*REQUIRED, *extra])
    for k in (1, 2):
        for gone in combinations(REQUIRED, k):
            kept = [m for m in REQUIRED if m not in gone]
            out["required_minus_plus_pipes"][short(gone)] = passes(chip, [*kept, *PIPE_COUNTERS])
    out["required_minus_plus_one"] = {
        f"{short([gone])} for {short([pipe])}": passes(chip, [*(m for m in REQUIRED if m != gone), pipe])
        for gone in REQUIRED
        for pipe in PIPE_COUNTERS
    }
    elapsed, tensor, active = (
        "sm__cycles_elapsed.avg",
        "sm__pipe_tensor_cycles_active.avg",
        "sm__cycles_active.avg",
    )
    for name, metrics in {
        "pipes": PIPE_COUNTERS,
        "elapsed+pipes": (elapsed, *PIPE_COUNTERS),
        "elapsed+tensor+pipes": (elapsed, tensor, *PIPE_COUNTERS),
        "elapsed+active+pipes": (elapsed, active, *PIPE_COUNTERS),
        "elapsed+fmaheavy+fmalite": (elapsed, *EXTRA_CANDIDATES[:2]),
        "elapsed+shared+fma+alu": (elapsed, EXTRA_CANDIDATES[2], PIPE_COUNTERS[0], PIPE_COUNTERS[2]),
        "required+inst_fma+inst_alu+inst_fp64": (*REQUIRED, *EXTRA_CANDIDATES[3:6]),
        **{
            f"elapsed+{short([p])}+pct": (elapsed, p, f"{p}.pct_of_peak_sustained_elapsed")
            for p in PIPE_COUNTERS
        },
    }.items():
        out["other"][name] = passes(chip, metrics)
    return out


def capture(gpu: Any, interval_ns: int, proc: Child, command: str) -> tuple[Any, Any]:
    """smlens' capture session over one schedule of ``proc``, decoding as it runs."""
    import threading

    from smlens.profile.cupti_session import Session

    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["result"] = proc.ask(command)
        except BaseException as exc:
            answer["error"] = exc

    with Session(gpu, interval_ns) as session:
        session.start()
        helper = threading.Thread(target=ask, daemon=True)
        helper.start()
        while helper.is_alive():
            time.sleep(0.05)
            session.poll()
        session.stop()
        recording = session.recording()
    if "error" in answer:
        raise answer["error"]
    return recording, answer["result"]


def windows(names: Sequence[str], stamps: Sequence[int], shift: int, guard: Callable[[str], int]) -> Any:
    """(name, lo, hi) on the PM clock for each phase, its edges left out."""
    for i, name in enumerate(names[:-1]):
        g = guard(name)
        yield name, stamps[i] - shift + g, stamps[i + 1] - shift - g


def known_section(gpu: Any, interval_ns: int, proc: Child, out: Path, results: dict[str, Any]) -> None:
    from bench.truth.profile_truth import align

    from smlens import names as n
    from smlens.profile import analysis, summary
    from smlens.profile.counters import CUPTI_SM_ELAPSED, PIPE_OF
    from smlens.profile.recording import Recording
    from smlens.verdicts import thresholds
    from smlens.verdicts.judge import Means, judge

    rule = thresholds.load()
    rec, phases = capture(gpu, interval_ns, proc, "known")
    with gzip.open(out / "known.json.gz", "wt") as f:
        json.dump({"capture": rec.to_json(), "phases": phases}, f)
    results["known_notes"] = {**rec.notes, "samples": len(rec), "peaks": dict(rec.peaks)}
    results["known_counters"] = list(rec.counters)
    say(json.dumps(results["known_notes"]))
    s = analysis.series(rec)
    classes = analysis.classify(s, rule)
    names, stamps = phases["names"], phases["stamps"]
    shift, err = align(s, names, stamps, set(KNOWN_BUSY), frozenset(TRAIN_PHASES[1:]))
    results["known_shift_ns"], results["known_shift_err"] = shift, err
    end_ns = s.start_ns + (s.seconds * 1e9).astype(np.int64)
    elapsed = rec.column(CUPTI_SM_ELAPSED)
    pipe_keys = {v: k for k, v in PIPE_OF.items()}  # pipe key -> series key
    acc: dict[str, dict[str, Any]] = {}
    train_guard = set(TRAIN_PHASES)
    for name, lo, hi in windows(
        names, stamps, shift, lambda x: TRAIN_GUARD_NS if x in train_guard else KNOWN_GUARD_NS
    ):
        inside = (s.start_ns >= lo) & (end_ns <= hi)
        entry = acc.setdefault(name, {"mask": np.zeros(len(s), dtype=bool), "ns": 0})
        entry["mask"] |= inside
        entry["ns"] += hi - lo + 2 * (TRAIN_GUARD_NS if name in train_guard else KNOWN_GUARD_NS)
    report: dict[str, Any] = {}
    for name, entry in acc.items():
        mask = entry["mask"]
        count = int(mask.sum())
        if count == 0:
            report[name] = {"n": 0}
            continue
        shares = {c: float(np.mean(classes[mask] == i)) for i, c in enumerate(analysis.CLASS_NAMES)}
        means = {k: float(np.mean(s.ratio(k)[mask])) for k in s.ratio_keys()}
        pipes = {p: means[k] for p, k in pipe_keys.items() if k in means}
        compute = [i for i in np.flatnonzero(mask) if classes[i] == analysis.COMPUTE_BOUND]
        busiest: dict[str, int] = {}
        for i in compute:
            values = {p: float(s.ratio(k)[i]) for p, k in pipe_keys.items() if k in means}
            top = n.SOL_PIPE_NAMES[max(values, key=values.__getitem__)]
            busiest[top] = busiest.get(top, 0) + 1
        window = judge(
            rule,
            Means(
                means["busy"],
                means["sm_active"],
                means["occupancy"],
                means["dram"],
                max(pipes.values()) if len(pipes) == 4 else None,
                pipes,
                False,
            ),
        )
        clock = float(np.mean(elapsed[mask] / s.seconds[mask])) / 1e9
        report[name] = {
            "n": count,
            "stamped_ms": entry["ns"] / 1e6,
            "shares": {k: round(v, 4) for k, v in shares.items() if v > 0},
            "majority": max(shares, key=shares.__getitem__),
            "compute_bound_pipes": busiest,
            "means": {k: round(v, 4) for k, v in means.items()},
            "window_verdict": [window.code, window.pipe],
            "sm_clock_ghz": round(clock, 4),
        }
    results["known"] = report
    physics(results, phases, report)
    held = {n.SOL_PIPE_NAMES[pipe] for pipe, key in pipe_keys.items() if key in s.pipes}
    verdict_checks(results, report, held)
    train_section(results, rec, s, names, stamps, shift, phases, rule)
    # the summary `smlens profile` prints, on the training loop alone
    first = names.index("data")
    lo, hi = stamps[first] - shift, stamps[-1] - shift
    keep = (rec.start_ns >= lo) & (rec.end_ns <= hi)
    part = Recording(
        rec.gpu,
        rec.chip,
        rec.interval_ns,
        rec.counters,
        rec.peaks,
        rec.start_ns[keep],
        rec.end_ns[keep],
        rec.values[keep],
        dict(rec.notes),
    )
    text = summary.render_text(summary.summarize(part, rule))
    results["train_summary_text"] = text
    say(text)


def physics(results: dict[str, Any], phases: dict[str, Any], report: dict[str, Any]) -> None:
    """What each workload did over its stamped time, against the pipe's peak at the measured SM clock: an
    estimate of the ratio each pipe counter should read, independent of CUPTI's peaks."""
    sms = phases["sm_count"]
    work = phases["work"]
    out: dict[str, Any] = {}
    # per SM and cycle: dense bf16 tensor FLOP (Hopper 4096); warp instructions of 32 lanes at full rate,
    # FP32 4 (128 lanes), FP64 2 (64 lanes), INT32 2 (64 lanes) (NVIDIA's H100 whitepaper)
    per_cycle = {"gemm_bf16": 4096.0, "fp32_fma": 128.0 * 2, "fp64_fma": 64.0 * 2, "int_alu": 64.0}
    key = {
        "gemm_bf16": "tensor",
        "fp32_fma": "fp32_active",
        "fp64_fma": "fp64_active",
        "int_alu": "integer_active",
    }
    for name, peak in per_cycle.items():
        r = report.get(name)
        if not r or not r.get("n") or name not in work:
            continue
        rate = work[name] / (r["stamped_ms"] / 1e3)
        expected = rate / (peak * sms * r["sm_clock_ghz"] * 1e9)
        out[name] = {
            "achieved_per_s": rate,
            "expected_ratio": round(expected, 4),
            "measured": r["means"].get(key[name]),
        }
    r = report.get("copy_d2d")
    peak_bw = phases.get("peak_dram_bytes_per_second")
    if r and r.get("n") and peak_bw:
        rate = work["copy_d2d"] / (r["stamped_ms"] / 1e3)
        out["copy_d2d"] = {
            "achieved_per_s": rate,
            "expected_ratio": round(rate / peak_bw, 4),
            "measured": r["means"]["dram"],
        }
    results["physics"] = out
    say(json.dumps(out, indent=1))


def verdict_checks(results: dict[str, Any], report: dict[str, Any], held: set[str]) -> None:
    """Each workload's majority class against EXPECTED; where the recording lacks a pipe counter the verdict
    needs (every one for stalled, its own for compute-bound), the class must be unknown instead."""
    checks = []
    for name, (kind, pipe) in EXPECTED.items():
        if (kind == "stalled" and len(held) < 3) or (
            kind == "compute_bound" and pipe not in {"tensor", *held}
        ):
            kind, pipe = "unknown", None
        r = report.get(name, {})
        majority = r.get("majority")
        named = max(
            r.get("compute_bound_pipes", {}) or {"": 0}, key=(r.get("compute_bound_pipes") or {"": 0}).get
        )
        passed = majority == kind and (pipe is None or named == pipe)
        checks.append(
            {
                "workload": name,
                "expected": [kind, pipe],
                "majority": majority,
                "pipe": named or None,
                "share": r.get("shares", {}).get(kind),
                "passed": passed,
            }
        )
    results["verdict_checks"] = checks
    for c in checks:
        say(
            f"{'PASS' if c['passed'] else 'FAIL'} {c['workload']:20} expected {c['expected']} "
            f"majority {c['majority']} ({c['share']}) pipe {c['pipe']}"
        )


def train_section(
    results: dict[str, Any],
    rec: Any,
    s: Any,
    names: Sequence[str],
    stamps: Sequence[int],
    shift: int,
    phases: dict[str, Any],
    rule: Any,
) -> None:
    from smlens.profile import analysis

    first = list(names).index("data")
    lo, hi = stamps[first] - shift, stamps[-1] - shift
    end_ns = s.start_ns + (s.seconds * 1e9).astype(np.int64)
    keep = (s.start_ns >= lo) & (end_ns <= hi)
    part = analysis.Series(
        **{k: getattr(s, k)[keep] for k in analysis.Series.__dataclass_fields__ if k != "pipes"},
        pipes={k: v[keep] for k, v in s.pipes.items()},
    )
    stamped: dict[str, list[float]] = {}
    for i in range(first, len(names) - 1):
        stamped.setdefault(names[i], []).append((stamps[i + 1] - stamps[i]) / 1e6)
    data_marks = [st for nm, st in zip(names, stamps, strict=False) if nm == "data"]
    out: dict[str, Any] = {
        "stamped_ms_mean": {k: round(float(np.mean(v)), 3) for k, v in stamped.items()},
        "stamped_step_ms": round(float(np.mean(np.diff(data_marks))) / 1e6, 3),
    }
    period = analysis.step_period(part)
    out["period"] = (
        None
        if period is None
        else {"seconds": period.seconds, "repeats": period.repeats, "strength": period.strength}
    )
    if period is not None:
        b = analysis.breakdown(part, period, rule)
        out["breakdown_ms"] = {k: round(b.seconds(k) * 1e3, 3) for k in analysis.CLASS_NAMES}
        out["stretches"] = [
            [
                x.kind,
                round(x.start_s * 1e3, 2),
                round(x.seconds * 1e3, 2),
                x.pipe,
                round(x.sm_active, 3),
                round(x.tensor, 3),
                round(x.dram, 3),
            ]
            for x in b.stretches
        ]
    results["train"] = out
    say(json.dumps(out, indent=1))


def raw_round(
    gpu: Any, proc: Child, command: str, metrics: Sequence[str], interval_ns: int, slots: int = 8000
) -> Any:
    """A bare cupti-python Collector with ``metrics`` over one schedule: (rows of start, end and each metric's
    value, the schedule), or the refusal's text."""
    from cupti import pm_sampling  # type: ignore[import-not-found,import-untyped,unused-ignore]

    from smlens.profile.cuda import retain_primary_context

    retain_primary_context(gpu.cuda_ordinal)
    collector = pm_sampling.Collector(device_index=gpu.cuda_ordinal)
    collector.enable()
    try:
        try:
            collector.configure(
                metrics=list(metrics), hardware_buffer_size=1024 << 20, sampling_interval=interval_ns
            )
        except ValueError as exc:
            return str(exc)[:200], None
        collector.start()
        phases = proc.ask(command)
        collector.stop()
        data = collector.decode(max_samples=slots)
        rows = np.array([[smp.start_timestamp, smp.end_timestamp, *smp.metric_values] for smp in data])
    finally:
        collector.disable()
    return rows, phases


def pct_section(gpu: Any, proc: Child, out: Path, results: dict[str, Any]) -> None:
    """Per pipe counter, alone with the elapsed cycles: its peak, smlens' normalisation beside CUPTI's own
    pct_of_peak_sustained_elapsed and _active, over ``pipes`` rounds; then one ``known`` round with the best
    set of every pipe counter and as many required ones as fit in a pass (saved raw for offline analysis)."""
    from smlens.profile.counters import CUPTI_SM_ACTIVE, CUPTI_SM_ELAPSED, CUPTI_TENSOR_ACTIVE, PIPE_COUNTERS

    chip = results.get("facts", {}).get("chip", "GH100")
    report: dict[str, Any] = {}
    for c in (*PIPE_COUNTERS, CUPTI_TENSOR_ACTIVE):
        metrics = [
            CUPTI_SM_ELAPSED,
            CUPTI_SM_ACTIVE,
            c,
            f"{c}.peak_sustained",
            f"{c}.pct_of_peak_sustained_elapsed",
            f"{c}.pct_of_peak_sustained_active",
        ]
        if passes(chip, metrics) != 1:
            metrics = metrics[:1] + metrics[2:5]
        rows, phases = raw_round(gpu, proc, "pipes", metrics, 500_000)
        if phases is None:
            report[c] = {"refused": rows, "passes": passes(chip, metrics)}
            continue
        col = {m: rows[:, 2 + i] for i, m in enumerate(metrics)}
        entry: dict[str, Any] = {
            "metrics": metrics,
            "samples": len(rows),
            "peak": float(col[f"{c}.peak_sustained"][0]),
        }
        names, stamps = phases["names"], phases["stamps"]
        for name, lo, hi in windows(names, stamps, results.get("known_shift_ns", 0), lambda _: 5_000_000):
            inside = (rows[:, 0] >= lo) & (rows[:, 1] <= hi)
            if not inside.any():
                continue
            ours = col[c][inside] / (col[CUPTI_SM_ELAPSED][inside] * col[f"{c}.peak_sustained"][inside])
            entry[name] = {
                "n": int(inside.sum()),
                "smlens": round(float(np.mean(ours)), 4),
                "cupti_elapsed": round(
                    float(np.mean(col[f"{c}.pct_of_peak_sustained_elapsed"][inside])) / 100, 4
                ),
                **(
                    {
                        "cupti_active": round(
                            float(np.mean(col[f"{c}.pct_of_peak_sustained_active"][inside])) / 100, 4
                        ),
                        "sm_active": round(
                            float(np.mean(col[CUPTI_SM_ACTIVE][inside] / col[CUPTI_SM_ELAPSED][inside])), 4
                        ),
                    }
                    if len(metrics) == 6
                    else {}
                ),
            }
        report[c] = entry
        say(json.dumps({c: entry}))
    results["pct"] = report
    # the best set holding every pipe counter: the required counters less the fewest that make it fit
    fits = [
        gone
        for gone, n_passes in results.get("passes", {}).get("required_minus_plus_pipes", {}).items()
        if n_passes == 1
    ]
    results["alt_candidates"] = fits
    if not fits:
        return
    from smlens.profile.counters import PEAK_OF, REQUIRED

    short = {m.split(".")[0]: m for m in REQUIRED}
    # fewest left out; of those, occupancy first (it decides no class), then busy, then SM active
    preference = ["sm__warps_active", "gr__cycles_active", "sm__cycles_active"]

    def cost(gone: str) -> tuple[int, int]:
        parts = gone.split("+")
        return len(parts), sum(preference.index(p) if p in preference else 9 for p in parts)

    chosen = min(fits, key=cost)
    gone = {short[x] for x in chosen.split("+") if x in short}
    metrics = [m for m in REQUIRED if m not in gone] + list(PIPE_COUNTERS)
    metrics += [PEAK_OF[m] for m in metrics if m in PEAK_OF]
    rows, phases = raw_round(gpu, proc, "known", metrics, 200_000, slots=40_000)
    results["alt"] = {"left_out": sorted(gone), "metrics": metrics, "preference": preference}
    if phases is None:
        results["alt"]["refused"] = rows
        return
    results["alt"]["samples"] = len(rows)
    with gzip.open(out / "alt.json.gz", "wt") as f:
        json.dump({"metrics": metrics, "rows": rows.tolist(), "phases": phases}, f)


def cli_section(results: dict[str, Any]) -> None:
    proc = Child("train", 14.0)
    proc.send("go")
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "smlens",
                "profile",
                "--gpu",
                "0",
                "--seconds",
                "3",
                "--interval-us",
                "100",
                "--out",
                "/tmp/smlens-cli.html",
                "--json",
                "/tmp/smlens-cli.json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        proc.close()
    results["cli"] = {"rc": done.returncode, "stdout": done.stdout[-3000:], "stderr": done.stderr[-1500:]}
    say(done.stdout[-3000:] + done.stderr[-1500:])


def section(results: dict[str, Any], name: str, body: Callable[[], Any]) -> None:
    say(f"== {name}")
    t = time.perf_counter()
    try:
        body()
    except Exception:
        results.setdefault("errors", {})[name] = traceback.format_exc()[-2500:]
        say(results["errors"][name])
    results.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--interval-us", type=int, default=100)
    run.add_argument("--sections", default="facts,known,pct,cli")
    kid = sub.add_parser("child")
    kid.add_argument("mode", choices=("rounds", "train"))
    kid.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.command == "child":
        return child(args.mode, args.seconds)
    if args.command != "run":
        parser.error("run or child")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    from smlens.profile.cupti_session import ProfileError, resolve_gpu

    try:
        gpu = resolve_gpu("0")
    except ProfileError as exc:
        print(f"profile verdicts: {exc}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"command": " ".join(sys.argv), "gpu": gpu.__dict__}
    wanted = args.sections.split(",")
    rounds: list[Child] = []

    def child_process() -> Child:
        if not rounds:
            rounds.append(Child("rounds"))
        return rounds[0]

    bodies: dict[str, Callable[[], Any]] = {
        "facts": lambda: facts_section(results),
        "known": lambda: known_section(gpu, args.interval_us * 1000, child_process(), out, results),
        "pct": lambda: pct_section(gpu, child_process(), out, results),
        "cli": lambda: cli_section(results),
    }
    try:
        for name in wanted:
            if name == "cli" and rounds:  # its own workload process: this one's GPU memory goes first
                rounds.pop().close()
            section(results, name, bodies[name])
            (out / "profile_verdicts.json").write_text(json.dumps(results, indent=1, default=str))
    finally:
        for proc in rounds:
            proc.close()
    failed = [c for c in results.get("verdict_checks", []) if not c["passed"]]
    return 1 if failed or results.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
