"""The PodResources client and refresher against a real gRPC server on a unix socket."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from conftest import REPO
from fakes.fake_kubelet import FakeKubelet, dra_pod, pod
from smlens.attribution.devices import DEFAULT_RESOURCE_NAMES, DeviceMap
from smlens.attribution.podresources import PodResourcesClient, PodResourcesSource
from smlens.attribution.refresher import AttributionRefresher
from smlens.model import Attribution, GpuIdentity, Workload

GPUS = [GpuIdentity(i, f"GPU-{i:08x}-1111-2222-3333-444444444444", "NVIDIA H200") for i in range(8)]
UUID = [g.uuid for g in GPUS]
MIG_A = "MIG-aaaaaaaa-0000-0000-0000-000000000001"
MIG_B = "MIG-aaaaaaaa-0000-0000-0000-000000000002"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(tmp_path / "kubelet.sock") as server:
        yield server


def refresher_for(
    kubelet: FakeKubelet,
    timeout: float = 2.0,
    mig: dict[str, tuple[str, int]] | None = None,
    resource_names: Sequence[str] = DEFAULT_RESOURCE_NAMES,
    gpus: Sequence[GpuIdentity] = GPUS,
) -> AttributionRefresher:
    source = PodResourcesSource(
        PodResourcesClient(kubelet.socket, timeout),
        DeviceMap(gpus),
        resource_names,
        mig_devices=None if mig is None else (lambda: mig),
    )
    return AttributionRefresher(source, interval=0.05)


def table(attribution: Attribution) -> set[tuple[str | None, str, str, str]]:
    return {(a.gpu_uuid, a.owner.namespace, a.owner.pod, a.owner.container) for a in attribution.allocations}


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_uuid_device_ids_map_to_their_gpus(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("train", "llm-0", {"trainer": {"nvidia.com/gpu": [UUID[0], UUID[1]], "cpu": ["3"]}}),
            pod("infer", "vllm-0", {"server": {"nvidia.com/gpu": [UUID[4].lower()]}, "sidecar": {}}),
            pod("web", "nginx", {"nginx": {"example.com/nic": ["eth9"]}}),
        ]
    )
    got = refresher_for(kubelet).refresh()
    assert table(got) == {
        (UUID[0], "train", "llm-0", "trainer"),
        (UUID[1], "train", "llm-0", "trainer"),
        (UUID[4], "infer", "vllm-0", "server"),
    }
    assert got.sole_owner(UUID[4]) == Workload("infer", "vllm-0", "server")
    assert got.sole_owner(UUID[2]) is None
    assert [(s.name, s.up) for s in got.sources] == [("podresources", True)]


def test_index_device_ids_map_to_their_gpus(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("a", "p", {"c": {"nvidia.com/gpu": ["2", "7"]}}),
            pod("b", "q", {"c": {"nvidia.com/gpu": ["9"]}}),
        ]
    )
    got = refresher_for(kubelet).refresh()
    assert table(got) == {(UUID[2], "a", "p", "c"), (UUID[7], "a", "p", "c"), (None, "b", "q", "c")}
    unplaced = next(a for a in got.allocations if a.gpu_uuid is None)
    assert unplaced.device == "9"


def test_index_ids_name_the_gpu_of_that_index_when_one_is_missing_and_the_order_differs(
    kubelet: FakeKubelet,
) -> None:
    # GPU 2 was lost before discovery, and the GPUs come in another order than their indices:
    # an index id names the GPU of that NVML index, never the one at that position.
    gpus = [GPUS[3], GPUS[0], GPUS[1]]
    kubelet.set_pods(
        [
            pod("a", "on-3", {"c": {"nvidia.com/gpu": ["3"]}}),
            pod("a", "on-1", {"c": {"nvidia.com/gpu.shared": ["1::0"]}}),
            pod("a", "on-lost", {"c": {"nvidia.com/gpu": ["2"]}}),
            pod("a", "slice-of-3", {"c": {"nvidia.com/mig-1g.18gb": ["3:1"]}}),
            dra_pod("dra", "claim-0", "c", "gpu.nvidia.com", [("gpu-0", [])]),
            dra_pod("dra", "claim-3", "c", "gpu.nvidia.com", [("gpu-3-mig-1g18gb-0", [])]),
        ]
    )
    got = refresher_for(kubelet, gpus=gpus).refresh()
    assert table(got) == {
        (UUID[3], "a", "on-3", "c"),
        (UUID[1], "a", "on-1", "c"),
        (None, "a", "on-lost", "c"),
        (UUID[3], "a", "slice-of-3", "c"),
        (UUID[0], "dra", "claim-0", "c"),
        (UUID[3], "dra", "claim-3", "c"),
    }
    assert got.sole_owner(UUID[1]) == Workload("a", "on-1", "c")
    assert got.sole_owner(UUID[0]) == Workload("dra", "claim-0", "c")
    assert got.sole_owner(UUID[3]) is None  # the whole GPU and two slices of it: no single owner
    assert [(s.name, s.up) for s in got.sources] == [("podresources", True)]


def test_mig_devices_land_on_their_parent_gpu_or_stay_unplaced(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("a", "small-1", {"c": {"nvidia.com/mig-1g.18gb": [MIG_A]}}),
            pod("a", "small-2", {"c": {"nvidia.com/mig-1g.18gb": [f"MIG-{UUID[6]}/7/0"]}}),
            pod("a", "small-3", {"c": {"nvidia.com/mig-3g.71gb": ["5:1"]}}),
            pod("a", "small-4", {"c": {"nvidia.com/mig-1g.18gb": [MIG_B]}}),
        ]
    )
    got = refresher_for(kubelet, mig={MIG_A: (UUID[3], 13)}).refresh()
    assert table(got) == {
        (UUID[3], "a", "small-1", "c"),
        (UUID[6], "a", "small-2", "c"),
        (UUID[5], "a", "small-3", "c"),
        (None, "a", "small-4", "c"),
    }
    assert all(a.partition for a in got.allocations)
    # One container on one MIG slice does not own the whole GPU, but it owns its GPU instance.
    assert got.sole_owner(UUID[3]) is None
    assert got.instance_owner(UUID[3], 13) == Workload("a", "small-1", "c")
    assert got.instance_owner(UUID[6], 7) == Workload("a", "small-2", "c")  # legacy id names its GI
    assert got.instance_owner(UUID[3], 14) is None


def test_single_strategy_mig_devices_under_nvidia_com_gpu_get_their_instance(kubelet: FakeKubelet) -> None:
    # The device plugin's single strategy hands out MIG devices as nvidia.com/gpu.
    kubelet.set_pods(
        [
            pod("a", "one", {"c": {"nvidia.com/gpu": [MIG_A]}}),
            pod("b", "two", {"c": {"nvidia.com/gpu": [MIG_B]}}),
        ]
    )
    got = refresher_for(kubelet, mig={MIG_A: (UUID[2], 1), MIG_B: (UUID[2], 2)}).refresh()
    assert {(a.gpu_uuid, a.gpu_instance, a.owner.pod) for a in got.allocations} == {
        (UUID[2], 1, "one"),
        (UUID[2], 2, "two"),
    }
    assert got.owners(UUID[2]) == (Workload("a", "one", "c"), Workload("b", "two", "c"))
    assert got.instance_owner(UUID[2], 1) == Workload("a", "one", "c")
    assert got.instance_owner(UUID[2], 2) == Workload("b", "two", "c")


def test_shared_gpu_has_every_holder_and_no_sole_owner(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("ml", "embed-a", {"server": {"nvidia.com/gpu.shared": [f"{UUID[3]}::0"]}}),
            pod("ml", "embed-b", {"server": {"nvidia.com/gpu.shared": [f"{UUID[3]}::1"]}}),
            pod("ml", "embed-c", {"server": {"nvidia.com/gpu.shared": ["3::2", "3::3"]}}),
        ]
    )
    got = refresher_for(kubelet).refresh()
    assert got.owners(UUID[3]) == (
        Workload("ml", "embed-a", "server"),
        Workload("ml", "embed-b", "server"),
        Workload("ml", "embed-c", "server"),
    )
    assert got.sole_owner(UUID[3]) is None
    assert len(got.allocations) == 4


def test_replicas_held_by_one_container_keep_it_the_sole_owner(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [pod("ml", "big", {"server": {"nvidia.com/gpu.shared": [f"{UUID[1]}::0", f"{UUID[1]}::3"]}})]
    )
    assert refresher_for(kubelet).refresh().sole_owner(UUID[1]) == Workload("ml", "big", "server")


def test_dra_claims_of_the_gpu_driver_are_mapped(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            dra_pod("dra", "whole", "c", "gpu.nvidia.com", [("gpu-2", ["k8s.gpu.nvidia.com/device=gpu-2"])]),
            dra_pod("dra", "slice", "c", "gpu.nvidia.com", [("gpu-4-mig-1g18gb-0", [])]),
            dra_pod("dra", "by-cdi", "c", "gpu.nvidia.com", [("", [f"nvidia.com/gpu={UUID[5]}"])]),
            dra_pod("dra", "nic", "c", "net.example.com", [("gpu-1", [])]),
        ]
    )
    got = refresher_for(kubelet).refresh()
    assert table(got) == {
        (UUID[2], "dra", "whole", "c"),
        (UUID[4], "dra", "slice", "c"),
        (UUID[5], "dra", "by-cdi", "c"),
    }
    assert got.sole_owner(UUID[2]) == Workload("dra", "whole", "c")
    assert got.sole_owner(UUID[4]) is None  # a MIG slice


def test_resource_names_are_configurable_with_globs(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", "p", {"c": {"example.com/gpu": ["0"], "nvidia.com/gpu": ["1"]}})])
    got = refresher_for(kubelet, resource_names=("example.com/*",)).refresh()
    assert table(got) == {(UUID[0], "a", "p", "c")}


def test_pods_that_end_disappear_within_one_refresh(kubelet: FakeKubelet) -> None:
    refresher = refresher_for(kubelet)
    kubelet.set_pods(
        [pod("a", "p1", {"c": {"nvidia.com/gpu": ["0"]}}), pod("a", "p2", {"c": {"nvidia.com/gpu": ["1"]}})]
    )
    assert {a.owner.pod for a in refresher.refresh().allocations} == {"p1", "p2"}
    kubelet.set_pods([pod("a", "p3", {"c": {"nvidia.com/gpu": ["0"]}})])
    after = refresher.refresh()
    assert table(after) == {(UUID[0], "a", "p3", "c")}
    assert after.sole_owner(UUID[1]) is None


def test_slow_kubelet_times_out_and_drops_labels(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", "p", {"c": {"nvidia.com/gpu": ["0"]}})])
    refresher = refresher_for(kubelet, timeout=0.3)
    assert refresher.refresh().allocations
    kubelet.delay = 1.5
    started = time.monotonic()
    got = refresher.refresh()
    assert time.monotonic() - started < 1.0
    assert got.allocations == ()
    assert [(s.up, s.reason) for s in got.sources] == [(False, "timeout")]


def test_current_never_waits_for_a_slow_refresh(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", "p", {"c": {"nvidia.com/gpu": ["0"]}})])
    refresher = refresher_for(kubelet, timeout=2.0)
    refresher.refresh()
    kubelet.delay = 1.0
    refresher.start()
    try:
        wait_for(lambda: kubelet.calls >= 2)  # the thread is now stuck in a slow call
        started = time.perf_counter()
        current = refresher.current()
        assert time.perf_counter() - started < 0.01
        assert current.allocations
    finally:
        kubelet.delay = 0.0
        refresher.close()


def test_garbage_reply_marks_the_source_down(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", "p", {"c": {"nvidia.com/gpu": ["0"]}})])
    kubelet.garbage = True
    got = refresher_for(kubelet).refresh()
    assert got.allocations == ()
    assert [(s.up, s.reason) for s in got.sources] == [(False, "bad_reply")]


def test_socket_vanishing_and_coming_back(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("a", "before", {"c": {"nvidia.com/gpu": ["0"]}})])
    refresher = refresher_for(kubelet)
    refresher.start()
    try:
        wait_for(lambda: bool(refresher.current().allocations))
        kubelet.stop()
        wait_for(lambda: [s.reason for s in refresher.current().sources] == ["socket_missing"])
        assert refresher.current().allocations == ()
        kubelet.set_pods([pod("a", "after", {"c": {"nvidia.com/gpu": ["1"]}})])
        kubelet.start()
        wait_for(lambda: table(refresher.current()) == {(UUID[1], "a", "after", "c")})
        assert refresher.current().sources[0].up
    finally:
        refresher.close()


def test_stale_socket_file_without_a_listener(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))  # the file stays, nobody listens: a kubelet that died
    got = refresher_for(FakeKubelet(path)).refresh()
    assert [(s.up, s.reason) for s in got.sources] == [(False, "unavailable")]


def test_permission_denied() -> None:
    # A world-readable directory of its own, so that only the socket's mode stands in the way.
    directory = Path(tempfile.mkdtemp(prefix="smlens-perm-"))
    directory.chmod(0o755)
    try:
        with FakeKubelet(directory / "kubelet.sock") as server:
            server.socket.chmod(0o600 if os.getuid() == 0 else 0)
            script = (
                "import os, sys; from pathlib import Path\n"
                "from smlens.attribution.podresources import PodResourcesClient\n"
                "from smlens.errors import BackendError\n"
                "if os.getuid() == 0: os.setgid(65534); os.setuid(65534)\n"
                "try: PodResourcesClient(Path(sys.argv[1]), 2.0).list()\n"
                "except BackendError as e: print(e.reason)\n"
            )
            result = subprocess.run(
                [sys.executable, "-c", script, str(server.socket)],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
            )
    finally:
        shutil.rmtree(directory)
    assert result.stdout.strip() == "permission_denied", result.stderr


def test_one_log_line_per_state_change(kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smlens.attribution")
    kubelet.set_pods([pod("a", "p", {"c": {"nvidia.com/gpu": ["0"]}})])
    refresher = refresher_for(kubelet)
    for _ in range(3):
        refresher.refresh()
    kubelet.garbage = True
    for _ in range(3):
        refresher.refresh()
    kubelet.garbage = False
    for _ in range(3):
        refresher.refresh()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "is up" in lines[0] and "bad_reply" in lines[1] and "is up" in lines[2]
    assert all("\n" not in line for line in lines)
