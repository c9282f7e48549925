"""The nvml and gpm backends on a GPU in MIG mode, through the fake pynvml (tests/fakes/fake_pynvml.py):
per GPU instance GPM activity and memory, and MIG reconfigured while the backends run."""

from __future__ import annotations

import pynvml
import pytest

from fakes.fake_pynvml import (
    INSTALLED_PYNVML,
    PYNVML_LACKS,
    FakeGpu,
    FakeGpuInstance,
    FakeMigDevice,
    FakeNode,
    install,
)
from smlens import model as m
from smlens import names as n
from smlens.model import GpuIdentity, InstanceReading, Reading
from smlens.pipeline.instance_fold import InstanceTotals, fold_instances
from smlens.sources.nvml.backend import open_nvml_backends
from smlens.sources.nvml.session import MIG_RESCAN_INTERVAL

SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
GPU = "GPU-11111111-1111-2222-3333-444444444444"
GIB = 1 << 30


def instance(gi: int, uuid: str, **rates: float) -> FakeGpuInstance:
    ids = {"sm": SM, "occupancy": OCCUPANCY, "tensor": TENSOR, "dram": DRAM}
    return FakeGpuInstance(
        gi, [FakeMigDevice(uuid)], memory_used=gi * GIB, gpm_rates={ids[k]: v for k, v in rates.items()}
    )


def mig_node(monkeypatch: pytest.MonkeyPatch, pynvml_version: str = INSTALLED_PYNVML) -> FakeNode:
    return install(
        monkeypatch,
        FakeGpu(
            GPU,
            mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
            gpm_rates={SM: 40.0},
            utilization_samples=None,
            gpu_instances=[instance(7, "MIG-busy", sm=90.0, tensor=80.0), instance(9, "MIG-hollow", sm=3.0)],
        ),
        pynvml_version=pynvml_version,
    )


class Node:
    """Both NVML backends attached to the fake node's GPUs, read at the times a test names."""

    def __init__(self, node: FakeNode) -> None:
        self.fake = node
        self.nvml, self.gpm = open_nvml_backends()
        self.gpus: list[GpuIdentity] = self.nvml.discover()
        assert self.nvml.attach(self.gpus) == {GPU: None}
        assert self.gpm.attach(self.gpus) == {GPU: None}

    def read(self, now: float) -> tuple[Reading, Reading]:
        return self.nvml.read(self.gpus[0], now), self.gpm.read(self.gpus[0], now)

    def close(self) -> None:
        self.gpm.close()
        self.nvml.close()


def by_gi(readings: tuple[InstanceReading, ...]) -> dict[int, InstanceReading]:
    return {r.instance.gpu_instance: r for r in readings}


def test_each_gpu_instance_gets_its_own_gpm_activity_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(mig_node(monkeypatch))
    _, first_gpm = node.read(0.0)
    assert [r.activity for r in first_gpm.instances] == [{}, {}]  # the first sample only starts the chain
    node.fake.advance(2.0)
    nvml, gpm = node.read(2.0)
    instances = by_gi(gpm.instances)
    assert instances[7].instance == m.MigInstance(7, "1g.18gb", ("MIG-busy",), 16)
    assert instances[7].activity[n.SM_ACTIVE] == m.Activity(pytest.approx(1.8), 2.0)
    assert instances[7].activity[n.TENSOR_ACTIVE].ratio == pytest.approx(0.8)
    assert instances[9].activity[n.SM_ACTIVE].ratio == pytest.approx(0.03)
    assert n.PCIE_TX_BYTES not in instances[9].activity  # traffic is read for the whole GPU only
    assert gpm.activity[n.SM_ACTIVE].ratio == pytest.approx(0.4)  # the whole GPU as before
    memory = by_gi(nvml.instances)
    assert memory[9].gauges == {n.MEMORY_USED_BYTES: 9 * GIB, n.MEMORY_TOTAL_BYTES: 17_716_740_096}
    assert n.UTILIZATION not in nvml.activity and nvml.missing[n.UTILIZATION] == "not_supported"
    assert all(n.UTILIZATION not in r.activity for r in (*nvml.instances, *gpm.instances))
    node.close()
    assert node.fake.live_gpm_samples == 0


def test_a_destroyed_instance_leaves_and_frees_its_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(mig_node(monkeypatch))
    node.read(0.0)
    assert node.fake.live_gpm_samples == 6  # whole GPU + two instances, two samples each
    node.fake.destroy_instance(GPU, 9)
    node.fake.advance(1.0)
    # The nvml backend's memory read on the stale MIG handle fails first and asks for a rescan, so the
    # gpm backend already reads the new layout in the same tick: the instance leaves at once.
    nvml, gpm = node.read(1.0)
    assert set(by_gi(nvml.instances)) == set(by_gi(gpm.instances)) == {7}
    assert node.fake.live_gpm_samples == 4
    node.fake.advance(0.5)
    node.gpm.read(node.gpus[0], 1.5)  # the gpm backend alone: still only GI 7
    assert node.fake.gpu(GPU).calls["nvmlGpmMigSampleGet"] == 2 + 1 + 1
    node.close()


def test_a_created_instance_appears_at_the_next_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(mig_node(monkeypatch))
    node.read(0.0)
    node.fake.create_instance(GPU, instance(3, "MIG-new", sm=50.0))
    node.fake.advance(1.0)
    assert set(by_gi(node.read(1.0)[1].instances)) == {7, 9}
    later = MIG_RESCAN_INTERVAL + 1
    node.fake.advance(later - 1)
    assert set(by_gi(node.read(later)[1].instances)) == {3, 7, 9}
    node.fake.advance(1.0)
    new = by_gi(node.read(later + 1)[1].instances)[3]
    assert new.activity[n.SM_ACTIVE].ratio == pytest.approx(0.5)
    node.close()


def test_mig_turned_off_drops_every_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(mig_node(monkeypatch))
    node.read(0.0)
    fake = node.fake.gpu(GPU)
    fake.mig_mode, fake.gpu_instances = pynvml.NVML_DEVICE_MIG_DISABLE, []
    node.fake.advance(MIG_RESCAN_INTERVAL)
    nvml, gpm = node.read(MIG_RESCAN_INTERVAL)
    assert nvml.instances == gpm.instances == ()
    assert node.fake.live_gpm_samples == 2
    node.close()


def test_nvml_stops_asking_for_utilization_that_mig_mode_does_not_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(mig_node(monkeypatch))
    for now in (0.0, 1.0, 2.0):
        node.fake.advance(1.0)
        nvml, _ = node.read(now)
        assert nvml.missing[n.UTILIZATION] == "not_supported"
    assert node.fake.gpu(GPU).calls["nvmlDeviceGetUtilizationRates"] == 1
    node.close()


@pytest.mark.parametrize(
    ("error", "reason", "samples"),
    [
        # GPM cannot sample instances on this GPU: asked once, then believed.
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "not_supported", 1),
        # Any other refusal: asked again every tick (2 instances x 3 ticks), without rescanning the GPU.
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", 6),
    ],
)
def test_instances_refusing_gpm_keep_their_series_without_activity(
    monkeypatch: pytest.MonkeyPatch, error: int, reason: str, samples: int
) -> None:
    node = Node(mig_node(monkeypatch))
    node.fake.gpu(GPU).errors["nvmlGpmMigSampleGet"] = error
    for now in (0.0, 1.0, 2.0):
        node.fake.advance(1.0)
        _, gpm = node.read(now)
        assert [r.missing for r in gpm.instances] == [{n.SM_ACTIVE: reason}] * 2
    assert node.fake.gpu(GPU).calls["nvmlGpmMigSampleGet"] == samples
    assert node.fake.gpu(GPU).calls["nvmlDeviceGetMigMode"] == 1  # the first scan only
    node.close()


@pytest.mark.parametrize("version", sorted(PYNVML_LACKS))
def test_every_checked_nvidia_ml_py_reads_the_gpu_and_its_instances(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    fake = mig_node(monkeypatch, pynvml_version=version)
    fake.privileged = True  # the path that asks for the GPU instance profile
    node = Node(fake)
    node.read(0.0)
    fake.advance(1.0)
    nvml, gpm = node.read(1.0)
    assert gpm.activity[n.SM_ACTIVE].ratio == pytest.approx(0.4)
    assert [(r.instance.gpu_instance, r.instance.profile) for r in gpm.instances] == [
        (7, "1g.18gb"),
        (9, "1g.18gb"),
    ]
    assert by_gi(nvml.instances)[7].gauges[n.MEMORY_USED_BYTES] == 7 * GIB


def test_a_mig_scan_that_raises_costs_the_instances_not_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = mig_node(monkeypatch)
    node = Node(fake)

    def broken(handle: object) -> int:
        raise ValueError("a binding bug")

    monkeypatch.setattr(fake.module, "nvmlDeviceGetMaxMigDeviceCount", broken)
    node.read(0.0)
    fake.advance(1.0)
    nvml, gpm = node.read(1.0)
    assert gpm.activity[n.SM_ACTIVE].ratio == pytest.approx(0.4)
    assert nvml.instances == gpm.instances == ()


def test_one_failed_scan_neither_hides_an_instance_nor_resets_its_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = mig_node(monkeypatch)
    node = Node(fake)
    totals: InstanceTotals = {}
    seen = []
    for tick in range(4):
        if tick == 2:
            fake.gpu(GPU).errors["nvmlDeviceGetMaxMigDeviceCount"] = pynvml.NVML_ERROR_UNKNOWN
            node.gpm._session.rescan_mig(node.gpus[0])  # as a failed instance call asks
        if tick == 3:
            del fake.gpu(GPU).errors["nvmlDeviceGetMaxMigDeviceCount"]
        totals, states = fold_instances(totals, node.read(float(tick)), lambda r: r.source == "gpm")
        seen.append({s.instance.gpu_instance: s.activity_totals.get(n.SM_ACTIVE) for s in states})
        fake.advance(1.0)
    covered = [{gi: None if a is None else a.covered_seconds for gi, a in tick.items()} for tick in seen]
    assert covered == [{7: None, 9: None}, {7: 1.0, 9: 1.0}, {7: 2.0, 9: 2.0}, {7: 3.0, 9: 3.0}]
    assert fake.gpu(GPU).calls["nvmlDeviceGetMaxMigDeviceCount"] == 3  # scanned again at tick 3


def test_the_gpm_backend_alone_rescans_after_a_failed_instance_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(mig_node(monkeypatch))
    node.gpm.read(node.gpus[0], 0.0)
    node.fake.destroy_instance(GPU, 9)
    node.fake.advance(1.0)
    failed = by_gi(node.gpm.read(node.gpus[0], 1.0).instances)  # the layout still names GI 9
    assert failed[9].missing == {n.SM_ACTIVE: "not_found"}
    node.fake.advance(1.0)
    assert set(by_gi(node.gpm.read(node.gpus[0], 2.0).instances)) == {7}  # long before the rescan interval
    assert node.fake.live_gpm_samples == 4
    node.close()
