"""MIG enumeration in the NVML layer, through the fake pynvml (tests/fakes/fake_pynvml.py)."""

from __future__ import annotations

import pynvml as real
import pytest

from fakes.fake_pynvml import FakeGpu, FakeGpuInstance, FakeMigDevice, FakeNode, install
from smlens.model import GpuIdentity, MigInstance
from smlens.sources.nvml.calls import Absent
from smlens.sources.nvml.mig import MigDevice, scan
from smlens.sources.nvml.session import MIG_RESCAN_INTERVAL, NvmlSession

PLAIN, SPLIT = "GPU-00000000-1111-2222-3333-444444444444", "GPU-11111111-1111-2222-3333-444444444444"
GPUS = [GpuIdentity(0, PLAIN, "NVIDIA H200"), GpuIdentity(1, SPLIT, "NVIDIA H200")]


def small(gi: int, uuid: str) -> FakeGpuInstance:
    return FakeGpuInstance(gi, [FakeMigDevice(uuid)])


def mig_node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    big = FakeGpuInstance(
        1,
        [FakeMigDevice("MIG-c1", 0, 32), FakeMigDevice("MIG-c0", 1, 28)],
        profile_id=9,
        profile_name="MIG 4g.71gb",
        slice_count=4,
    )
    return install(
        monkeypatch,
        FakeGpu(PLAIN),
        FakeGpu(
            SPLIT,
            mig_mode=real.NVML_DEVICE_MIG_ENABLE,
            gpu_instances=[small(13, "MIG-a"), big, small(11, "MIG-b")],
        ),
    )


def acquired() -> NvmlSession:
    session = NvmlSession()
    session.acquire(object())
    return session


def layout(session: NvmlSession, gpu: GpuIdentity, now: float = 0.0, max_age: float = 10.0) -> object:
    found = session.mig_layout(gpu, now, max_age)
    return found if found is None or isinstance(found, Absent) else [f.instance for f in found]


def test_gpu_instances_with_their_profile_devices_and_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    node.privileged = True
    session = NvmlSession()
    session.acquire(object())
    assert layout(session, GPUS[0]) is None
    assert layout(session, GPUS[1]) == [
        MigInstance(1, "4g.71gb", ("MIG-c1", "MIG-c0"), 60),
        MigInstance(11, "1g.18gb", ("MIG-b",), 16),
        MigInstance(13, "1g.18gb", ("MIG-a",), 16),
    ]


def test_unprivileged_the_profile_comes_from_the_mig_device_name(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)  # nvmlDeviceGetGpuInstanceById: NO_PERMISSION
    session = NvmlSession()
    session.acquire(object())
    assert [i.profile for i in layout(session, GPUS[1])] == ["4g.71gb", "1g.18gb", "1g.18gb"]  # type: ignore[attr-defined]
    assert node.gpu(SPLIT).calls["nvmlDeviceGetGpuInstanceById"] == 4  # once per MIG device


def test_a_rescan_asks_only_for_handles_and_uuids_of_devices_it_knows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = mig_node(monkeypatch)
    session = NvmlSession()
    session.acquire(object())
    first = layout(session, GPUS[1], now=0.0)
    calls = node.gpu(SPLIT).calls
    before = calls.copy()
    assert layout(session, GPUS[1], now=0.0, max_age=0.0) == first
    asked = {name for name, count in calls.items() if count != before[name]}
    assert asked == {
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetUUID",
    }


def test_a_gpu_without_mig_support_has_no_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeGpu(PLAIN, name="NVIDIA L40S", mig_mode=None))
    session = NvmlSession()
    session.acquire(object())
    assert layout(session, GPUS[0]) is None


def test_the_layout_is_cached_until_old_or_rescanned(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    session = NvmlSession()
    session.acquire(object())
    assert len(layout(session, GPUS[1], now=0.0)) == 3  # type: ignore[arg-type]
    node.destroy_instance(SPLIT, 13)
    node.create_instance(SPLIT, small(12, "MIG-new"))
    assert len(layout(session, GPUS[1], now=5.0)) == 3  # type: ignore[arg-type]
    session.rescan_mig(GPUS[1])
    assert [i.gpu_instance for i in layout(session, GPUS[1], now=5.0)] == [1, 11, 12]  # type: ignore[attr-defined]
    node.destroy_instance(SPLIT, 12)
    assert [i.gpu_instance for i in layout(session, GPUS[1], now=15.1)] == [1, 11]  # type: ignore[attr-defined]


def test_placements_map_every_mig_device_to_its_gpu_and_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    node.gpu(PLAIN).errors["nvmlDeviceGetMigMode"] = real.NVML_ERROR_UNKNOWN
    session = NvmlSession()
    session.acquire(object())
    assert session.mig_placements(GPUS, now=0.0) == {
        "MIG-a": (SPLIT, 13),
        "MIG-b": (SPLIT, 11),
        "MIG-c0": (SPLIT, 1),
        "MIG-c1": (SPLIT, 1),
    }
    node.gpu(SPLIT).lost = True
    assert session.mig_placements(GPUS, now=1.0 + MIG_RESCAN_INTERVAL) == {}


def test_mig_handles_of_a_destroyed_instance_stop_working(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    nv = node.module
    nv.nvmlInit()
    parent = nv.nvmlDeviceGetHandleByIndex(1)
    handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    assert nv.nvmlDeviceGetUUID(handle) == "MIG-a"
    assert nv.nvmlDeviceIsMigDeviceHandle(handle).value == 1
    node.destroy_instance(SPLIT, 13)
    with pytest.raises(real.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetUUID(handle)
    with pytest.raises(real.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    with pytest.raises(real.NVMLError_NotSupported):
        nv.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(AssertionError, match="not scripted for MIG device handles"):
        nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0))


def test_a_failed_scan_keeps_the_last_layout_and_is_retried_at_the_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = mig_node(monkeypatch)
    session = acquired()
    good = layout(session, GPUS[1], now=0.0)
    node.gpu(SPLIT).errors["nvmlDeviceGetMaxMigDeviceCount"] = real.NVML_ERROR_UNKNOWN
    session.rescan_mig(GPUS[1])  # as a failed instance call asks
    assert layout(session, GPUS[1], now=1.0) == good
    del node.gpu(SPLIT).errors["nvmlDeviceGetMaxMigDeviceCount"]
    node.destroy_instance(SPLIT, 13)
    assert [i.gpu_instance for i in layout(session, GPUS[1], now=2.0)] == [1, 11]  # type: ignore[attr-defined]


@pytest.mark.parametrize("function", ["nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetUUID"])
def test_only_not_found_means_no_mig_device_at_an_index(
    monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    node = mig_node(monkeypatch)
    node.gpu(SPLIT).errors[function] = real.NVML_ERROR_UNKNOWN
    session = acquired()
    assert layout(session, GPUS[1]) == Absent("unknown")


def test_the_known_devices_forget_a_destroyed_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    nv = node.module
    nv.nvmlInit()
    parent = nv.nvmlDeviceGetHandleByIndex(1)
    known: dict[str, MigDevice] = {}
    scan(nv, parent, "GPU 1", known)
    assert set(known) == {"MIG-a", "MIG-b", "MIG-c0", "MIG-c1"}
    node.destroy_instance(SPLIT, 13)
    scan(nv, parent, "GPU 1", known)
    assert set(known) == {"MIG-b", "MIG-c0", "MIG-c1"}  # the cache does not grow with reconfigurations


def test_placements_read_the_layout_the_sampler_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(monkeypatch)
    session = acquired()
    layout(session, GPUS[1], now=0.0)  # the sampler's tick
    asked = node.gpu(SPLIT).calls["nvmlDeviceGetMigMode"]
    assert session.mig_placements(GPUS[1:], now=1.0)["MIG-a"] == (SPLIT, 13)
    assert node.gpu(SPLIT).calls["nvmlDeviceGetMigMode"] == asked  # no second scan within the interval
    session.mig_placements(GPUS[1:], now=10.5)
    assert node.gpu(SPLIT).calls["nvmlDeviceGetMigMode"] == asked + 1
