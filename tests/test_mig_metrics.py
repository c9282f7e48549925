"""MIG GPU instances at /metrics: the sampler on the nvml and gpm backends over the fake pynvml
(tests/fakes/fake_pynvml.py), pods from the fake kubelet, and MIG reconfigured while it runs; and pods on
a node whose lost GPU was left out of discovery."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conftest import ExporterFactory
from fakes.fake_kubelet import FakeKubelet, pod
from fakes.fake_pynvml import FakeGpu, FakeGpuInstance, FakeMigDevice, FakeNode, install
from smlens.attribution.devices import DeviceMap
from smlens.attribution.podresources import PodResourcesClient, PodResourcesSource
from smlens.attribution.refresher import AttributionRefresher
from smlens.exposition.rendered import Publisher
from smlens.pipeline.attribution import build_refresher
from smlens.pipeline.sampler import Sampler
from smlens.settings import resolve
from smlens.sources.nvml.backend import open_nvml_backends
from smlens.sources.nvml.session import MIG_RESCAN_INTERVAL, NvmlSession
from smlens.verdicts import thresholds
from smlens.web.app import create_app

SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
PLAIN = "GPU-00000000-1111-2222-3333-444444444444"
SPLIT = "GPU-11111111-1111-2222-3333-444444444444"
GIB = 1 << 30

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def gi(number: int, uuid: str, sm: float) -> FakeGpuInstance:
    return FakeGpuInstance(
        number, [FakeMigDevice(uuid)], memory_used=GIB, gpm_rates={SM: sm, OCCUPANCY: sm / 4}
    )


class Exporter:
    """The sampler over both NVML backends with a clock the test moves, and the app serving it."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.now = 0.0
        nvml, gpm = open_nvml_backends()
        self.sampler = Sampler(nvml, [gpm], hostname="node-a", interval=1.0, clock=lambda: self.now)
        self.gpus = self.sampler.open()
        self.publisher = Publisher()
        self.sampler.subscribe(self.publisher.publish)
        self.client = TestClient(create_app(self.publisher, thresholds.load(), lambda: True))

    def tick(self, seconds: float = 1.0) -> Series:
        self.node.advance(seconds)
        self.now += seconds
        self.sampler.tick()
        return self.series()

    def series(self) -> Series:
        text = self.client.get("/metrics", headers={"Accept-Encoding": "identity"}).text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def labels(gpu_instance: str, profile: str, mig_uuid: str, **extra: str) -> frozenset[tuple[str, str]]:
    base = {"gpu": "1", "uuid": SPLIT, "hostname": "node-a", "gpu_instance": gpu_instance}
    return frozenset({**base, "mig_profile": profile, "mig_uuid": mig_uuid, **extra}.items())


def instances_of(series: Series, name: str) -> set[str]:
    return {dict(lbl)["gpu_instance"] for n, lbl in series if n == name}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    return install(
        monkeypatch,
        FakeGpu(PLAIN, gpm_rates={SM: 60.0}),
        FakeGpu(
            SPLIT,
            mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
            gpm_rates={SM: 30.0},
            gpu_instances=[gi(7, "MIG-busy", 90.0), gi(9, "MIG-hollow", 2.0)],
        ),
    )


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(tmp_path / "kubelet.sock") as server:
        yield server


def test_each_instance_has_its_series_beside_the_unchanged_whole_gpu(node: FakeNode) -> None:
    exporter = Exporter(node)
    exporter.tick()
    series = exporter.tick(2.0)
    busy, hollow = labels("7", "1g.18gb", "MIG-busy"), labels("9", "1g.18gb", "MIG-hollow")
    assert series[("gpu_mig_sm_active_ratio", busy)] == pytest.approx(0.9)
    assert series[("gpu_mig_sm_active_ratio", hollow)] == pytest.approx(0.02)
    assert series[("gpu_mig_sm_occupancy_ratio", hollow)] == pytest.approx(0.005)
    assert series[("gpu_mig_sm_active_seconds_total", busy)] == pytest.approx(1.8)
    assert series[("gpu_mig_profiled_seconds_total", busy)] == pytest.approx(2.0)
    assert series[("gpu_mig_memory_used_bytes", hollow)] == GIB
    assert series[("gpu_mig_info", frozenset({*busy, ("sm_count", "16")}))] == 1
    whole = frozenset({"gpu": "1", "uuid": SPLIT, "hostname": "node-a"}.items())
    assert series[("gpu_sm_active_ratio", whole)] == pytest.approx(0.3)
    # NVML gives no utilization in MIG mode: absent for the GPU and for every instance, never 0.
    assert not any(n.startswith("gpu_mig_utilization") or n.startswith("gpu_mig_busy") for n, _ in series)
    assert not any(n == "gpu_utilization_ratio" and ("uuid", SPLIT) in lbl for n, lbl in series)
    # The whole GPU's memory in MIG mode needs privilege (nvml.h): absent here, never 0.
    assert not any(n == "gpu_memory_used_bytes" and ("uuid", SPLIT) in lbl for n, lbl in series)
    # A GPU without MIG has no instance series at all.
    assert not any(n.startswith("gpu_mig_") and ("uuid", PLAIN) in lbl for n, lbl in series)
    api = exporter.client.get("/api/v1/gpus").json()
    split = next(g for g in api["gpus"] if g["uuid"] == SPLIT)
    assert [(i["gpu_instance"], i["mig_profile"], i["mig_uuids"]) for i in split["instances"]] == [
        (7, "1g.18gb", ["MIG-busy"]),
        (9, "1g.18gb", ["MIG-hollow"]),
    ]
    assert split["instances"][0]["values"]["sm_active"] == pytest.approx(0.9)


def test_reconfiguration_drops_and_adds_instances_without_stale_series(node: FakeNode) -> None:
    exporter = Exporter(node)
    exporter.tick()
    exporter.tick()
    node.destroy_instance(SPLIT, 9)
    series = exporter.tick()
    assert instances_of(series, "gpu_mig_sm_active_ratio") == {"7"}
    assert instances_of(series, "gpu_mig_info") == instances_of(series, "gpu_mig_memory_used_bytes") == {"7"}
    node.create_instance(SPLIT, gi(9, "MIG-again", 50.0))  # the same GI id, a new MIG device
    series = exporter.tick(MIG_RESCAN_INTERVAL)
    assert instances_of(series, "gpu_mig_info") == {"7", "9"}
    series = exporter.tick()
    again = labels("9", "1g.18gb", "MIG-again")
    assert series[("gpu_mig_sm_active_ratio", again)] == pytest.approx(0.5)
    assert series[("gpu_mig_profiled_seconds_total", again)] == pytest.approx(1.0)  # counted afresh
    assert not any(("mig_uuid", "MIG-hollow") in lbl for _, lbl in series)
    assert exporter.sampler.latest is not None and all(g.up for g in exporter.sampler.latest.gpus)
    backends = {dict(lbl)["backend"]: v for (n, lbl), v in series.items() if n == "smlens_backend_up"}
    assert backends == {"nvml": 1.0, "gpm": 1.0}


def test_each_instance_carries_the_pod_that_holds_its_mig_device(
    node: FakeNode, kubelet: FakeKubelet
) -> None:
    kubelet.set_pods(
        [
            pod("serve", "llm-0", {"server": {"nvidia.com/mig-1g.18gb": ["MIG-busy"]}}),
            pod("batch", "etl-3", {"worker": {"nvidia.com/mig-1g.18gb": ["MIG-hollow"]}}),
        ]
    )
    exporter = Exporter(node)
    session = NvmlSession()  # attribution's own, as smlens.pipeline.attribution makes it
    session.acquire(kubelet)
    source = PodResourcesSource(
        PodResourcesClient(kubelet.socket, 2.0),
        DeviceMap(exporter.gpus),
        mig_devices=lambda: session.mig_placements(exporter.gpus, 0.0),
    )
    refresher = AttributionRefresher(source, interval=60.0)
    exporter.sampler.attach_attribution(refresher)
    refresher.refresh()
    exporter.tick()
    series = exporter.tick()
    busy = labels("7", "1g.18gb", "MIG-busy", namespace="serve", pod="llm-0", container="server")
    hollow = labels("9", "1g.18gb", "MIG-hollow", namespace="batch", pod="etl-3", container="worker")
    assert series[("gpu_mig_sm_active_ratio", busy)] == pytest.approx(0.9)
    assert series[("gpu_mig_sm_active_ratio", hollow)] == pytest.approx(0.02)
    # The whole GPU is split between two pods: its own series carry no pod.
    whole = [lbl for n, lbl in series if n == "gpu_sm_active_ratio" and ("uuid", SPLIT) in lbl]
    assert whole == [frozenset({"gpu": "1", "uuid": SPLIT, "hostname": "node-a"}.items())]
    session.release(kubelet)


def test_pods_land_on_the_gpus_of_their_index_when_a_lost_gpu_is_left_out(
    monkeypatch: pytest.MonkeyPatch, kubelet: FakeKubelet
) -> None:
    lost, last = "GPU-22222222-1111-2222-3333-444444444444", "GPU-33333333-1111-2222-3333-444444444444"
    node = install(
        monkeypatch,
        FakeGpu(PLAIN, gpm_rates={SM: 60.0}),
        FakeGpu(lost, lost=True),  # left out of discovery: the GPUs are 0, 2 and 3
        FakeGpu(
            SPLIT,
            mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
            gpm_rates={SM: 30.0},
            gpu_instances=[gi(7, "MIG-busy", 90.0)],
        ),
        FakeGpu(last, gpm_rates={SM: 80.0}),
    )
    kubelet.set_pods(
        [
            pod("train", "llm-0", {"trainer": {"nvidia.com/gpu": ["3"]}}),
            pod("serve", "small-0", {"server": {"nvidia.com/mig-1g.18gb": ["MIG-busy"]}}),
            pod("old", "gone-0", {"c": {"nvidia.com/gpu": ["1"]}}),
        ]
    )
    exporter = Exporter(node)
    assert [g.index for g in exporter.gpus] == [0, 2, 3]
    settings = resolve("serve", {"backend": "auto", "pod_resources_socket": str(kubelet.socket)}, environ={})
    refresher = build_refresher(settings, exporter.gpus)
    assert refresher is not None
    try:
        exporter.sampler.attach_attribution(refresher)
        refresher.refresh()
        exporter.tick()
        series = exporter.tick()
    finally:
        refresher.close()

    def gpu(index: str, uuid: str, **extra: str) -> frozenset[tuple[str, str]]:
        return frozenset({"gpu": index, "uuid": uuid, "hostname": "node-a", **extra}.items())

    trainer = {"namespace": "train", "pod": "llm-0", "container": "trainer"}
    assert series[("gpu_sm_active_ratio", gpu("3", last, **trainer))] == pytest.approx(0.8)
    assert series[("gpu_sm_active_ratio", gpu("0", PLAIN))] == pytest.approx(0.6)
    assert series[("gpu_sm_active_ratio", gpu("2", SPLIT))] == pytest.approx(0.3)
    server = {"namespace": "serve", "pod": "small-0", "container": "server"}
    instance = {"gpu_instance": "7", "mig_profile": "1g.18gb", "mig_uuid": "MIG-busy", **server}
    assert series[("gpu_mig_sm_active_ratio", gpu("2", SPLIT, **instance))] == pytest.approx(0.9)
    allocated = {
        (dict(lbl)["gpu"], dict(lbl)["uuid"], dict(lbl)["pod"])
        for n, lbl in series
        if n == "gpu_allocation_info"
    }
    assert allocated == {("3", last, "llm-0"), ("2", SPLIT, "small-0"), ("", "1", "gone-0")}


def test_instances_are_read_when_the_gpu_in_mig_mode_cannot_be_sampled_whole(node: FakeNode) -> None:
    # nvml.h does not say whether nvmlGpmSampleGet works on a GPU in MIG mode: if it does not, the
    # instances must still come, the gpm backend stay up, and the GPU say why it has no profiling.
    node.gpu(SPLIT).errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    exporter = Exporter(node)
    exporter.tick()
    series = exporter.tick()
    assert series[("gpu_mig_sm_active_ratio", labels("7", "1g.18gb", "MIG-busy"))] == pytest.approx(0.9)
    whole = frozenset({"gpu": "1", "uuid": SPLIT, "hostname": "node-a", "source": "gpm"}.items())
    assert series[("gpu_profiling_available", whole)] == 0
    assert not any(n == "gpu_sm_active_ratio" and ("uuid", SPLIT) in lbl for n, lbl in series)
    backends = {dict(lbl)["backend"]: v for (n, lbl), v in series.items() if n == "smlens_backend_up"}
    assert backends == {"nvml": 1.0, "gpm": 1.0}
    exporter.tick()
    assert node.gpu(SPLIT).calls["nvmlGpmSampleGet"] == 1  # asked once, then believed


def test_the_sim_backend_serves_mig_instances_from_a_scenario(
    tmp_path: Path, start_exporter: ExporterFactory
) -> None:
    scenario = tmp_path / "mig.yaml"
    scenario.write_text(
        "gpus:\n  - healthy\n"
        "  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow}]\n"
    )
    base = start_exporter("--backend", "sim", "--sim-scenario", str(scenario), "--interval", "0.2")
    time.sleep(1.0)
    text = httpx.get(base + "/metrics").text
    profiles = {
        (s.labels["gpu"], s.labels["gpu_instance"], s.labels["mig_profile"])
        for family in text_string_to_metric_families(text)
        if family.name == "gpu_mig_sm_active_ratio"
        for s in family.samples
    }
    assert profiles == {("1", "1", "3g.71gb"), ("1", "2", "1g.18gb")}
    utilization = {
        s.labels["gpu"]
        for family in text_string_to_metric_families(text)
        if family.name == "gpu_utilization_ratio"
        for s in family.samples
    }
    assert utilization == {"0"}  # GPU 1 is in MIG mode: no NVML utilization
