"""/proc/PID/cgroup parsing on fixture files of cgroup v1, v2 and hybrid hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from smlens.attribution import cgroups
from smlens.attribution.cgroups import CgroupIdentity
from smlens.attribution.podnames import PodNames
from smlens.model import UNATTRIBUTED, Workload

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
C1 = "3f1b5e0c9a7d4e2b8c6f0a1d2e3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"
C2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a2918f0e1d2c3b4"
C3 = "0a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223242526272829"
POD_A = "1f8c0d2e-4b3a-4c5d-9e8f-0a1b2c3d4e5f"
POD_B = "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
POD_C = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
POD_D = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"

EXPECTED = {
    "v2_containerd_systemd.txt": CgroupIdentity(POD_A, C1, "containerd"),
    "v2_crio_systemd.txt": CgroupIdentity(POD_B, C2, "cri-o"),
    "v2_crio_conmon.txt": CgroupIdentity(POD_B),  # conmon belongs to the pod, not to a container
    "v1_containerd_cgroupfs.txt": CgroupIdentity(POD_C, C1),
    "v1_guaranteed_cgroupfs.txt": CgroupIdentity(POD_D, C3),
    "v1_docker_systemd.txt": CgroupIdentity(POD_D, C3, "docker"),
    "v2_docker_standalone.txt": CgroupIdentity(container_id=C2, runtime="docker"),
    "v1_docker_standalone.txt": CgroupIdentity(container_id=C2, runtime="docker"),
    "v2_slurm.txt": CgroupIdentity(slurm_job="4242"),
    "v1_slurm.txt": CgroupIdentity(slurm_job="1337"),
    "v2_host_process.txt": CgroupIdentity(),
    "hybrid_v1_kubepods.txt": CgroupIdentity(POD_A, C1, "containerd"),
    "v2_private_cgroupns.txt": CgroupIdentity(POD_B, C1, "containerd"),
    "v2_static_pod.txt": CgroupIdentity("6e1d2c3b4a5f69788796a5b4c3d2e1f0", C3, "containerd"),
    "v2_podman.txt": CgroupIdentity(container_id=C3, runtime="podman"),
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    assert cgroups.parse((FIXTURES / name).read_text()) == EXPECTED[name]


def test_malformed_lines_are_ignored() -> None:
    text = "garbage\n\n0::/kubepods/pod" + POD_A + "/" + C1 + "\nnot:a\n"
    assert cgroups.parse(text) == CgroupIdentity(POD_A, C1)
    assert cgroups.parse("") == CgroupIdentity()


def test_slurm_needs_a_slurm_path() -> None:
    assert cgroups.parse("0::/user.slice/job_12/step_0\n") == CgroupIdentity()


def test_read_from_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text((FIXTURES / "v2_slurm.txt").read_text())
    assert cgroups.read(4242, tmp_path) == CgroupIdentity(slurm_job="4242")
    assert cgroups.read(4343, tmp_path) is None  # exited


def kubelet_logs(root: Path) -> Path:
    (root / "containers").mkdir(parents=True)
    (root / "pods").mkdir()
    (root / "containers" / f"trainer-0_ml-train_pytorch-{C1}.log").symlink_to("/nonexistent")
    (root / "containers" / "broken.log").touch()
    (root / "pods" / f"ml-infer_vllm-7f9c_{POD_B}").mkdir()
    (root / "pods" / "not-a-pod-dir").mkdir()
    return root


def test_pod_names_from_the_kubelet_log_directories(tmp_path: Path) -> None:
    names = PodNames.scan(kubelet_logs(tmp_path))
    assert names.workload(CgroupIdentity(POD_A, C1)) == Workload("ml-train", "trainer-0", "pytorch")
    # The container's log link is not there (yet): the pod is still known by its directory.
    assert names.workload(CgroupIdentity(POD_B, C2)) == Workload("ml-infer", "vllm-7f9c", "")
    # Nothing known about the pod: its UID stands in for the name, so two pods never merge.
    assert names.workload(CgroupIdentity(POD_C, C3)) == Workload("", POD_C, "")
    assert names.workload(CgroupIdentity(container_id=C2)) == Workload(container=C2[:12])
    assert names.workload(CgroupIdentity(slurm_job="7")) == Workload(slurm_job="7")
    assert names.workload(CgroupIdentity()) == UNATTRIBUTED


def test_pod_names_without_the_directories(tmp_path: Path) -> None:
    names = PodNames.scan(tmp_path / "absent")
    assert names.workload(CgroupIdentity(POD_A, C1)) == Workload("", POD_A, "")
