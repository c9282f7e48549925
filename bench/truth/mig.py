"""The truth harness on a GPU already in MIG mode: spin kernels on one MIG device while smlens watches,
and checks of the per-instance series against what the kernels did.

    PYTHONPATH=exporter python3 -m bench.truth.mig [--gpu 0] [--instance GI] [--window 8] [--out truth-mig]
        [--backend auto|dcgm]

``--backend dcgm`` reads the instances through DCGM's GPU-instance entities (A100 and other pre-Hopper
GPUs in MIG mode, nv-hostengine running); ``auto`` takes GPM where the GPU has it, else DCGM.

It never reconfigures a GPU: create the instances first (for example ``nvidia-smi mig -cgi 19,19,19 -C``
as root on an idle GPU) and destroy them yourself afterwards. Needs CuPy. Each phase runs the spin kernel
of bench.truth.workloads in a child process whose CUDA_VISIBLE_DEVICES names the target MIG device:
idle; one warp on one SM; every SM of the instance full. For each phase it reads the exact window means
from ``gpu_mig_sm_active_seconds_total`` / ``gpu_mig_profiled_seconds_total`` of every instance and checks:

- idle: every instance below 0.01;
- one warp: the target near 1 / (its SMs), the instance-relative reading docs/metrics.md states; the
  report also prints 1 / (the GPU's SMs), the whole-GPU reading, so a mismatch says which one NVML uses;
- all SMs: the target at least 0.9 and every other instance below 0.01 (isolation);
- memory: the target's ``gpu_mig_memory_used_bytes`` higher during the spin than idle;
- every instance of the layout has its series with a non-empty ``mig_profile``, and the GPU has no
  ``gpu_utilization_ratio`` (NVML gives none in MIG mode).

Prints one line per check and writes them to --out/mig.json; exits 1 if a check fails, 2 if it cannot
start (no NVML, GPU not in MIG mode, no CuPy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.truth.expect import Band, at_least, at_most, near, sm_active_tolerance
from bench.truth.exporter import REPO, Exporter, smlens_env
from bench.truth.metrics import Scrape

from smlens.model import MigInstance

WARMUP_SECONDS = 4.0  # the child compiles the kernel and a tick or two passes before the window opens
IDLE = 0.01

# The child: spins blocks x threads on the one MIG device CUDA_VISIBLE_DEVICES names, for N seconds.
_SPIN_CHILD = """
import sys, time, cupy
from bench.truth.workloads import SPIN_KERNEL, _SPIN_SOURCE
blocks, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
kernel = cupy.RawKernel(_SPIN_SOURCE, SPIN_KERNEL)
memory = cupy.zeros(256 << 20, dtype=cupy.uint8)  # 256 MiB, so the instance's memory use moves
end = time.monotonic() + seconds
while time.monotonic() < end:
    kernel((blocks,), (threads,), (cupy.uint64(100_000_000),))
    cupy.cuda.Device().synchronize()
"""


@dataclass(frozen=True)
class Outcome:
    check: str
    value: float | None
    band: str
    ok: bool


def instance_mean(first: Scrape, last: Scrape, instance: MigInstance) -> float | None:
    """Exact mean SM activity of one GPU instance between two scrapes, from its counters."""
    gi = str(instance.gpu_instance)
    active = [s.value("gpu_mig_sm_active_seconds_total", gpu_instance=gi) for s in (first, last)]
    covered = [s.value("gpu_mig_profiled_seconds_total", gpu_instance=gi) for s in (first, last)]
    if None in active or None in covered:
        return None
    seconds = covered[1] - covered[0]  # type: ignore[operator]
    return None if seconds <= 0 else (active[1] - active[0]) / seconds  # type: ignore[operator]


def judge(
    phase: str,
    means: dict[int, float | None],
    target: MigInstance,
    gpu_sm_count: int,
) -> list[Outcome]:
    """The checks of one phase, from every instance's window mean (by GPU instance id)."""
    checks: list[tuple[str, float | None, Band]] = []
    own = means.get(target.gpu_instance)
    others = {gi: v for gi, v in means.items() if gi != target.gpu_instance}
    if phase == "idle":
        checks += [(f"idle: GI {gi} SM active", v, at_most(IDLE)) for gi, v in means.items()]
    elif phase == "one_warp" and not target.sm_count:
        checks.append((f"one warp: GI {target.gpu_instance} SM count known", None, at_least(1)))
    elif phase == "one_warp" and target.sm_count:
        relative = 1 / target.sm_count
        checks.append(
            (
                f"one warp: GI {target.gpu_instance} SM active, instance-relative 1/{target.sm_count} "
                f"(whole-GPU would be 1/{gpu_sm_count} = {1 / gpu_sm_count:.4f})",
                own,
                near(relative, sm_active_tolerance(relative)),
            )
        )
    elif phase == "all_sms":
        checks.append((f"all SMs: GI {target.gpu_instance} SM active", own, at_least(0.9)))
        checks += [
            (f"all SMs on GI {target.gpu_instance}: GI {gi} stays idle", v, at_most(IDLE))
            for gi, v in others.items()
        ]
    return [Outcome(name, value, band.text, band.holds(value)) for name, value, band in checks]


def _layout(gpu_index: int) -> tuple[str, int, tuple[MigInstance, ...]]:
    """The GPU's UUID, SM count and MIG instances, through smlens' own NVML layer."""
    from smlens.errors import BackendUnavailable
    from smlens.sources.nvml.backend import NvmlBackend
    from smlens.sources.nvml.calls import Absent
    from smlens.sources.nvml.session import NvmlSession

    session = NvmlSession()
    backend = NvmlBackend(session)
    try:
        gpus = {g.index: g for g in backend.discover()}
        if gpu_index not in gpus:
            print(f"NVML has no GPU {gpu_index} (GPUs: {sorted(gpus)}).", file=sys.stderr)
            sys.exit(2)
        gpu = gpus[gpu_index]
        layout = session.mig_layout(gpu, time.monotonic(), max_age=0.0)
    except BackendUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    finally:
        backend.close()
    if layout is None or isinstance(layout, Absent) or not layout:
        print(
            f"GPU {gpu_index} is not in MIG mode or has no GPU instance; create them first "
            "(e.g. nvidia-smi mig -cgi 19,19,19 -C): this harness never reconfigures a GPU.",
            file=sys.stderr,
        )
        sys.exit(2)
    return gpu.uuid, gpu.sm_count or 0, tuple(found.instance for found in layout)


def _spin(target: MigInstance, blocks: int, threads: int, seconds: float) -> subprocess.Popen[bytes]:
    env = smlens_env(CUDA_VISIBLE_DEVICES=target.mig_uuids[0])
    env["PYTHONPATH"] = os.pathsep.join((str(REPO), env["PYTHONPATH"]))
    code = [sys.executable, "-c", _SPIN_CHILD, str(blocks), str(threads), str(seconds)]
    return subprocess.Popen(code, env=env, cwd=REPO)


def _window(exporter: Exporter, seconds: float) -> tuple[Scrape, Scrape]:
    first = exporter.scrape()
    time.sleep(seconds)
    return first, exporter.scrape()


def run(args: argparse.Namespace) -> int:
    uuid, gpu_sms, instances = _layout(args.gpu)
    target = next((i for i in instances if i.gpu_instance == args.instance), instances[0])
    print(f"GPU {args.gpu} ({uuid}, {gpu_sms} SMs): instances {[i.gpu_instance for i in instances]}")
    print(f"target GI {target.gpu_instance} ({target.profile}, {target.sm_count} SMs, {target.mig_uuid})")
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    phases = (("idle", 0, 0), ("one_warp", 1, 32), ("all_sms", 4 * (target.sm_count or 1), 1024))
    with Exporter(args.out / "smlens.log", 1.0, backend=args.backend) as exporter:
        exporter.wait_ready()
        memory: dict[str, float | None] = {}
        for phase, blocks, threads in phases:
            child = None if not blocks else _spin(target, blocks, threads, WARMUP_SECONDS + args.window + 2)
            time.sleep(WARMUP_SECONDS)
            first, last = _window(exporter, args.window)
            if child is not None:
                child.wait(timeout=60)
            means = {i.gpu_instance: instance_mean(first, last, i) for i in instances}
            memory[phase] = last.value("gpu_mig_memory_used_bytes", gpu_instance=str(target.gpu_instance))
            print(f"{phase}: window means {means}")
            outcomes += judge(phase, means, target, gpu_sms)
        outcomes.append(
            Outcome(
                "memory: target's gpu_mig_memory_used_bytes higher while spinning",
                memory["all_sms"],
                f"> {memory['idle']}",
                None not in memory.values() and memory["all_sms"] > memory["idle"],  # type: ignore[operator]
            )
        )
        scrape = exporter.scrape()
    outcomes += series_outcomes(scrape, uuid, instances)
    for outcome in outcomes:
        print(f"{'PASS' if outcome.ok else 'FAIL'}  {outcome.check}: {outcome.value} (wanted {outcome.band})")
    (args.out / "mig.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0 if all(o.ok for o in outcomes) else 1


def series_outcomes(scrape: Scrape, uuid: str, instances: Sequence[MigInstance]) -> list[Outcome]:
    """Every instance has its gpu_mig_info with a profile; the GPU has no NVML utilization."""
    outcomes = []
    for instance in instances:
        info = scrape.value("gpu_mig_info", uuid=uuid, gpu_instance=str(instance.gpu_instance))
        named = any(
            ("mig_profile", "") not in labels and ("gpu_instance", str(instance.gpu_instance)) in labels
            for labels in scrape.samples.get("gpu_mig_info", {})
        )
        outcomes.append(
            Outcome(
                f"GI {instance.gpu_instance} has gpu_mig_info with a profile", info, "1", info == 1 and named
            )
        )
    utilization = scrape.value("gpu_utilization_ratio", uuid=uuid)
    outcomes.append(
        Outcome("no gpu_utilization_ratio for a GPU in MIG mode", utilization, "absent", utilization is None)
    )
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU in MIG mode (default 0)")
    parser.add_argument("--instance", type=int, default=None, help="GPU instance id to load (default: first)")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of each measured window")
    parser.add_argument("--out", type=Path, default=Path("truth-mig"), help="results folder")
    parser.add_argument(
        "--backend",
        choices=("auto", "dcgm"),
        default="auto",
        help="smlens' backend (dcgm: DCGM's GPU instances)",
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
