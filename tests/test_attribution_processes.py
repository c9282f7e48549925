"""Per-process attribution: NVML process lists (a scripted stand-in for pynvml) through a fake /proc
and kubelet log tree to per-workload memory and time-based utilization."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as real
import pytest

from smlens.attribution.processes import ProcessSource
from smlens.errors import BackendError
from smlens.model import UNATTRIBUTED, GpuIdentity, Workload, WorkloadUsage
from smlens.sources.nvml.session import NvmlSession

NOW = 1_800_000_000.0
NOW_US = int(NOW * 1e6)
GPUS = [GpuIdentity(i, f"GPU-{i:08x}-1111-2222-3333-444444444444", "NVIDIA H200") for i in range(2)]
POD = "1f8c0d2e-4b3a-4c5d-9e8f-0a1b2c3d4e5f"
CID = "3f1b5e0c9a7d4e2b8c6f0a1d2e3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"
GIB = 1024**3


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None


@dataclass
class Sample:
    pid: int
    timeStamp: int
    smUtil: int


@dataclass
class Gpu:
    processes: list[Proc] = field(default_factory=list)
    mps: list[Proc] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


def fake_nvml(gpus: dict[str, Gpu]) -> types.ModuleType:
    """A pynvml stand-in with the real constants and error classes and the functions attribution calls."""
    module = types.ModuleType("pynvml")
    for name, value in vars(real).items():
        if name.startswith(("NVML_", "NVMLError")):
            setattr(module, name, value)

    def scripted(name: str, result: Any) -> Any:
        def call(handle: str, *args: Any) -> Any:
            code = gpus[handle].errors.get(name) if handle in gpus else None
            if code is not None:
                raise real.NVMLError(code)
            return result(gpus[handle], *args)

        return call

    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByUUID = lambda uuid: uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetComputeRunningProcesses = scripted("compute", lambda g: g.processes)  # type: ignore[attr-defined]
    module.nvmlDeviceGetMPSComputeRunningProcesses = scripted("mps", lambda g: g.mps)  # type: ignore[attr-defined]

    def samples(gpu: Gpu, since: int) -> list[Sample]:
        fresh = [s for s in gpu.samples if s.timeStamp > since]
        if not fresh:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return fresh

    module.nvmlDeviceGetProcessUtilization = scripted("utilization", samples)  # type: ignore[attr-defined]
    return module


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> dict[str, Gpu]:
    gpus = {g.uuid: Gpu() for g in GPUS}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    return gpus


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, Path]:
    """A /proc with a pod container (100, 101), a Slurm task (200), a host process (300); kubelet logs."""
    proc, logs = tmp_path / "proc", tmp_path / "log"
    cgroup_of = {
        100: f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        101: f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        200: "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0",
        300: "0::/user.slice/user-1000.slice/session-4.scope",
    }
    for pid, line in cgroup_of.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(line + "\n")
    (logs / "containers").mkdir(parents=True)
    (logs / "containers" / f"trainer-0_ml_pytorch-{CID}.log").touch()
    return proc, logs


def source(host: tuple[Path, Path], window: float = 10.0) -> ProcessSource:
    return ProcessSource(NvmlSession(), GPUS, window, proc_root=host[0], log_dir=host[1], wall=lambda: NOW)


def by_workload(usages: tuple[WorkloadUsage, ...], gpu: int) -> dict[Workload, WorkloadUsage]:
    return {u.workload: u for u in usages if u.gpu_uuid == GPUS[gpu].uuid}


def test_processes_are_grouped_by_workload(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    gpu = node[GPUS[0].uuid]
    gpu.processes = [
        Proc(100, 2 * GIB),
        Proc(101, 1 * GIB),
        Proc(200, 4 * GIB),
        Proc(300, GIB),
        Proc(999, GIB),
    ]
    gpu.samples = [
        Sample(100, NOW_US - 1_000_000, 30),
        Sample(101, NOW_US - 500_000, 25),
        Sample(200, NOW_US - 200_000, 90),
        Sample(300, NOW_US - 60_000_000, 80),  # older than the window: not this refresh's
    ]
    got = by_workload(source(host).usage(), 0)
    pod = got[Workload("ml", "trainer-0", "pytorch")]
    assert (pod.processes, pod.memory_used_bytes, pod.utilization) == (2, 3 * GIB, pytest.approx(0.55))
    job = got[Workload(slurm_job="77")]
    assert (job.processes, job.memory_used_bytes, job.utilization) == (1, 4 * GIB, pytest.approx(0.9))
    # The host process and the vanished PID 999 have no workload; they are reported together.
    host_usage = got[UNATTRIBUTED]
    assert (host_usage.processes, host_usage.memory_used_bytes, host_usage.utilization) == (2, 2 * GIB, 0.0)
    assert by_workload(source(host).usage(), 1) == {}


def test_usage_lands_on_the_gpu_of_its_uuid_when_gpus_are_missing(
    node: dict[str, Gpu], host: tuple[Path, Path]
) -> None:
    third = GpuIdentity(3, "GPU-00000003-1111-2222-3333-444444444444", "NVIDIA H200")
    present = [GPUS[0], third]  # GPUs 1 and 2 left out of discovery
    node[third.uuid] = Gpu(processes=[Proc(200, 4 * GIB)], samples=[Sample(200, NOW_US - 10, 50)])
    node[GPUS[0].uuid].processes = [Proc(100, GIB)]
    usages = ProcessSource(
        NvmlSession(), present, 10.0, proc_root=host[0], log_dir=host[1], wall=lambda: NOW
    ).usage()
    assert {(u.gpu_uuid, u.workload, u.memory_used_bytes, u.utilization) for u in usages} == {
        (GPUS[0].uuid, Workload("ml", "trainer-0", "pytorch"), GIB, 0.0),
        (third.uuid, Workload(slurm_job="77"), 4 * GIB, 0.5),
    }


def test_mps_clients_count_once(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    gpu = node[GPUS[1].uuid]
    gpu.processes = [Proc(100, GIB)]
    gpu.mps = [Proc(100, GIB), Proc(200, 3 * GIB)]
    got = by_workload(source(host).usage(), 1)
    assert got[Workload("ml", "trainer-0", "pytorch")].processes == 1
    assert got[Workload(slurm_job="77")].memory_used_bytes == 3 * GIB


def test_unknown_values_stay_absent(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    gpu = node[GPUS[0].uuid]
    gpu.processes = [Proc(100, None), Proc(101, GIB), Proc(200, GIB)]
    gpu.errors["utilization"] = real.NVML_ERROR_NOT_SUPPORTED
    node[GPUS[1].uuid].errors["mps"] = real.NVML_ERROR_NOT_SUPPORTED
    got = by_workload(source(host).usage(), 0)
    pod = got[Workload("ml", "trainer-0", "pytorch")]
    assert pod.memory_used_bytes is None  # one of its two processes has no figure: no partial sum
    assert pod.utilization is None
    assert got[Workload(slurm_job="77")].memory_used_bytes == GIB


def test_utilization_is_capped_at_one(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    gpu = node[GPUS[0].uuid]
    gpu.processes = [Proc(100, GIB), Proc(101, GIB)]
    gpu.samples = [Sample(100, NOW_US - 10, 70), Sample(101, NOW_US - 10, 60)]
    assert by_workload(source(host).usage(), 0)[Workload("ml", "trainer-0", "pytorch")].utilization == 1.0


def test_one_failing_gpu_leaves_the_others(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    node[GPUS[0].uuid].errors["compute"] = real.NVML_ERROR_GPU_IS_LOST
    node[GPUS[1].uuid].processes = [Proc(200, GIB)]
    usages = source(host).usage()
    assert [u.gpu_uuid for u in usages] == [GPUS[1].uuid]


def test_all_gpus_failing_is_a_source_failure(node: dict[str, Gpu], host: tuple[Path, Path]) -> None:
    for gpu in node.values():
        gpu.errors["compute"] = real.NVML_ERROR_NO_PERMISSION
    with pytest.raises(BackendError) as failure:
        source(host).usage()
    assert failure.value.reason == "no_permission"
