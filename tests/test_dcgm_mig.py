"""MIG GPU instances through DCGM (A100-like GPUs, no GPM): the real sampler on the nvml and gpm backends
over the fake pynvml and the DCGM backend over the stub libdcgm, opened through the backend registry as
``--backend dcgm`` opens them, scraped at /metrics of the app. Every test runs with the double of DCGM's
bindings and with each copy of NVIDIA's own (conftest's ``fake_dcgm``)."""

from __future__ import annotations

import logging
from types import ModuleType, SimpleNamespace
from typing import Any

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fakes.fake_pynvml import FakeGpu, FakeGpuInstance, FakeMigDevice, FakeNode, install
from smlens.exposition.rendered import Publisher
from smlens.model import MigInstance
from smlens.pipeline.sampler import Sampler
from smlens.sources.dcgm.backend import DcgmBackend
from smlens.sources.dcgm.mig import GiEntity, match_instances, profile_slices
from smlens.sources.dcgm.watches import WATCH_RETRY_SECONDS
from smlens.sources.nvml.session import MIG_RESCAN_INTERVAL
from smlens.sources.registry import KINDS
from smlens.verdicts import thresholds
from smlens.web.app import create_app

PLAIN = "GPU-0a0a0a0a-0000-0000-0000-000000000000"
SPLIT = "GPU-1b1b1b1b-1111-1111-1111-111111111111"
GIB = 1 << 30
WHOLE = {1002: 0.5, 1003: 0.25, 1004: 0.125, 1005: 0.375, 1009: 1000, 1010: 1000}
# A100-80GB profiles: NVML GI id -> (slices, profile, SMs, MIG device UUID)
LAYOUT = {
    1: (3, "3g.40gb", 42, "MIG-aaaaaaaa-0001"),
    5: (2, "2g.20gb", 28, "MIG-aaaaaaaa-0005"),
    13: (1, "1g.10gb", 14, "MIG-aaaaaaaa-0013"),
}
# SM active per GI (the other three fields follow from it), distinct so that a value credited to the
# wrong instance shows.
SM_ACTIVE = {1: 0.75, 5: 0.5, 13: 0.0625, 6: 0.875}

WHOLE_GI = (7, "7g.80gb", 98, "MIG-bbbbbbbb-0000")  # the first GPU's one instance when it is in MIG mode

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def nvml_gi(gi: int, slices: int, profile: str, sms: int, uuid: str) -> FakeGpuInstance:
    device = FakeMigDevice(uuid, sm_count=sms)
    return FakeGpuInstance(
        gi, [device], profile_name=f"MIG {profile}", slice_count=slices, memory_used=gi * GIB, gpm_rates={}
    )


def instance_values(gi: int) -> dict[int, float]:
    ratio = SM_ACTIVE[gi]
    return {1002: ratio, 1003: ratio / 2, 1004: ratio / 4, 1005: ratio / 8}


class Node:
    """One A100 without MIG and one in MIG mode, seen alike by the fake NVML and the fake hostengine."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, fake: ModuleType, plain_split: bool = False, **dcgm_gi: Any
    ) -> None:
        """``plain_split``: the first GPU is in MIG mode too, with one 7g instance."""
        self.fake = fake
        a100 = {"name": "NVIDIA A100-SXM4-80GB", "gpm_supported": False, "compute_capability": (8, 0)}
        whole_gi = {"mig_mode": pynvml.NVML_DEVICE_MIG_ENABLE, "gpu_instances": [nvml_gi(0, *WHOLE_GI)]}
        self.nvml: FakeNode = install(
            monkeypatch,
            FakeGpu(PLAIN, **a100, **(whole_gi if plain_split else {})),  # type: ignore[arg-type]
            FakeGpu(
                SPLIT,
                mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
                gpu_instances=[nvml_gi(gi, *spec) for gi, spec in LAYOUT.items()],
                **a100,  # type: ignore[arg-type]
            ),
        )
        self.engine = fake.FakeHostengine(
            [
                fake.FakeGpu(PLAIN, instances=[fake.FakeGpuInstance(0, 7)] if plain_split else []),
                fake.FakeGpu(
                    SPLIT, instances=[self.dcgm_gi(gi, **dcgm_gi.get(str(gi), {})) for gi in LAYOUT]
                ),
            ]
        )
        fake.REGISTRY.listen(self.engine)
        self.now = 0.0
        self.clock_step = 0.0  # how far the clock moves at each read of it, as a real clock does
        settings = SimpleNamespace(
            interval=1.0,
            node_name="node-a",
            energy_interval=10.0,
            utilization_interval=1.0,
            dcgm_hostengine=None,
            dcgm_embedded=False,
        )
        opened = KINDS["dcgm"].open(settings)  # type: ignore[arg-type]
        self.dcgm = next(b for b in opened.extras if isinstance(b, DcgmBackend))
        self.sampler = Sampler(opened.device, opened.extras, "node-a", 1.0, clock=self.clock)
        self.sampler.open()
        publisher = Publisher()
        self.sampler.subscribe(publisher.publish)
        self.client = TestClient(create_app(publisher, thresholds.load(), lambda: True))
        self.instances = list(LAYOUT)

    def clock(self) -> float:
        self.now += self.clock_step
        return self.now

    def missing(self, gi: int) -> dict[str, str]:
        """What /api/v1/gpus says is missing for one GPU instance of the MIG GPU."""
        split = next(g for g in self.client.get("/api/v1/gpus").json()["gpus"] if g["uuid"] == SPLIT)
        return next(i["missing"] for i in split["instances"] if i["gpu_instance"] == gi)

    def dcgm_gi(self, gi: int, **extra: Any) -> Any:
        return self.fake.FakeGpuInstance(nvml_id=gi, slices=(LAYOUT.get(gi) or (1,))[0], **extra)

    def tick(
        self, blank: dict[int, dict[int, float]] | None = None, published: list[int] | None = None
    ) -> Series:
        for index in range(len(self.engine.gpus)):
            self.engine.publish(index, WHOLE)
        for gi in self.instances if published is None else published:
            values = {**instance_values(gi), **(blank or {}).get(gi, {})}
            self.engine.publish_instance(1, gi, values)
        self.nvml.advance(1.0)
        self.now += 1.0
        self.sampler.tick()
        text = self.client.get("/metrics", headers={"Accept-Encoding": "identity"}).text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def reconfigure(
        self, instances: dict[int, tuple[int, str, int, str]], dcgm: bool = True, nvml: bool = True
    ) -> None:
        """Destroy and create GPU instances; DCGM and NVML may each learn of it at its own pace."""
        if nvml:
            gpu = self.nvml.gpu(SPLIT)
            gone = [
                g.id for g in gpu.gpu_instances if instances.get(g.id, (0, "", 0, ""))[3] != g.devices[0].uuid
            ]
            for gi in gone:
                self.nvml.destroy_instance(SPLIT, gi)
            for gi, spec in instances.items():
                if all(g.id != gi for g in gpu.gpu_instances):
                    self.nvml.create_instance(SPLIT, nvml_gi(gi, *spec))
        if dcgm:
            self.engine.reconfigure(
                1, [self.fake.FakeGpuInstance(gi, slices=spec[0]) for gi, spec in instances.items()]
            )
        if dcgm:
            self.instances = list(instances)


def labels(gi: int, spec: tuple[int, str, int, str] | None = None) -> frozenset[tuple[str, str]]:
    _, profile, _, uuid = spec or LAYOUT[gi]
    return frozenset(
        {
            "gpu": "1",
            "uuid": SPLIT,
            "hostname": "node-a",
            "gpu_instance": str(gi),
            "mig_profile": profile,
            "mig_uuid": uuid,
        }.items()
    )


def mig_series(series: Series, name: str) -> dict[str, float]:
    return {dict(lbl)["gpu_instance"]: v for (n, lbl), v in series.items() if n == name}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, fake_dcgm: ModuleType) -> Node:
    return Node(monkeypatch, fake_dcgm)


def test_each_gpu_instance_of_several_profiles_has_its_dcgm_values_at_metrics(node: Node) -> None:
    node.tick()
    node.tick()
    series = node.tick()
    for gi, (_, _, sms, _) in LAYOUT.items():
        own = labels(gi)
        assert series[("gpu_mig_sm_active_ratio", own)] == pytest.approx(SM_ACTIVE[gi])
        assert series[("gpu_mig_sm_occupancy_ratio", own)] == pytest.approx(SM_ACTIVE[gi] / 2)
        assert series[("gpu_mig_tensor_active_ratio", own)] == pytest.approx(SM_ACTIVE[gi] / 4)
        assert series[("gpu_mig_dram_active_ratio", own)] == pytest.approx(SM_ACTIVE[gi] / 8)
        assert series[("gpu_mig_sm_active_seconds_total", own)] == pytest.approx(2 * SM_ACTIVE[gi])
        assert series[("gpu_mig_profiled_seconds_total", own)] == pytest.approx(2.0)
        # memory comes from the nvml backend onto the same series: one instance, one label set
        assert series[("gpu_mig_memory_used_bytes", own)] == gi * GIB
        assert series[("gpu_mig_info", frozenset({*own, ("sm_count", str(sms))}))] == 1
    assert len(mig_series(series, "gpu_mig_info")) == 3
    # the whole GPUs are unchanged, and the GPU without MIG has no instance series
    for gpu, uuid in (("0", PLAIN), ("1", SPLIT)):
        whole = frozenset({"gpu": gpu, "uuid": uuid, "hostname": "node-a"}.items())
        assert series[("gpu_sm_active_ratio", whole)] == 0.5
    assert not any(n.startswith("gpu_mig_") and ("uuid", PLAIN) in lbl for n, lbl in series)
    # what the hostengine was asked: one group of the three GI entities, the four per-instance fields
    gi_entities = {(node.fake.F.DCGM_FE_GPU_I, node.engine.instance_entity(1, gi)) for gi in LAYOUT}
    groups = [g.items for g in node.engine.groups.values() if set(g.items) & gi_entities]
    assert groups == [tuple(sorted(gi_entities, key=lambda e: e[1]))]
    for _, entity_id in gi_entities:
        assert node.engine.watched(1, (node.fake.F.DCGM_FE_GPU_I, entity_id)) == {1002, 1003, 1004, 1005}


def test_an_instance_dcgm_returns_blank_for_is_absent_never_zero(node: Node) -> None:
    import dcgmvalue

    node.tick()
    node.tick()
    blank = {5: {1002: dcgmvalue.DCGM_FP64_BLANK, 1003: dcgmvalue.DCGM_FP64_NOT_SUPPORTED}}
    series = node.tick(blank=blank)
    assert "5" not in mig_series(series, "gpu_mig_sm_active_ratio")
    assert "5" not in mig_series(series, "gpu_mig_sm_occupancy_ratio")
    assert series[("gpu_mig_tensor_active_ratio", labels(5))] == pytest.approx(SM_ACTIVE[5] / 4)
    assert series[("gpu_mig_sm_active_ratio", labels(13))] == pytest.approx(SM_ACTIVE[13])
    # the integral keeps what it had: the blank tick adds no coverage, and nothing is 0 or NaN
    assert series[("gpu_mig_sm_active_seconds_total", labels(5))] == pytest.approx(SM_ACTIVE[5])
    assert all(v == v for v in series.values())
    assert node.missing(5) == {"sm_active": "blank", "sm_occupancy": "not_supported"}


def test_an_instance_dcgm_will_not_watch_stays_absent_and_is_retried(
    monkeypatch: pytest.MonkeyPatch, fake_dcgm: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="smlens.sources.dcgm.instances")
    refused = fake_dcgm.S.DCGM_ST_PROFILING_NOT_SUPPORTED
    node = Node(monkeypatch, fake_dcgm, **{"13": {"profiling_error": refused}})
    node.tick()
    node.tick()
    series = node.tick()
    assert set(mig_series(series, "gpu_mig_sm_active_ratio")) == {"1", "5"}
    assert "13" not in mig_series(series, "gpu_mig_profiled_seconds_total")
    assert series[("gpu_mig_memory_used_bytes", labels(13))] == 13 * GIB  # the instance is still there
    assert node.missing(13) == {"sm_active": "watch_failed"}
    for _ in range(2 * int(WATCH_RETRY_SECONDS) + 2):  # two retries, still refused
        node.tick()
    refusals = [r for r in caplog.records if "refused to watch GPU instance 13" in r.getMessage()]
    assert [r.levelname for r in refusals] == ["WARNING", "DEBUG", "DEBUG"]  # said once, not every 30 s
    node.engine.gpus[1].instances[2].profiling_error = None
    for _ in range(int(WATCH_RETRY_SECONDS) + 2):
        series = node.tick()
    assert any("watches GPU instance 13 again" in r.getMessage() for r in caplog.records)
    assert series[("gpu_mig_sm_active_ratio", labels(13))] == pytest.approx(SM_ACTIVE[13])
    assert series[("gpu_mig_sm_active_ratio", labels(1))] == pytest.approx(SM_ACTIVE[1])


def test_reconfiguration_mid_run_moves_no_value_to_another_instance(node: Node) -> None:
    node.tick()
    node.tick()
    # GI 1 (first in DCGM's list) is destroyed and GI 6 created: DCGM hands GI 5 and GI 13 other entity
    # ids at once, while NVML's cached layout still has GI 1 for up to MIG_RESCAN_INTERVAL seconds.
    after = {5: LAYOUT[5], 13: LAYOUT[13], 6: (1, "1g.10gb", 14, "MIG-aaaaaaaa-0006")}
    old_entity_13 = node.engine.instance_entity(1, 13)
    node.reconfigure(after, nvml=False)
    assert node.engine.instance_entity(1, 13) != old_entity_13
    seen: list[Series] = [node.tick()]
    assert node.missing(1) == {"sm_active": "not_in_dcgm"}  # NVML still lists it, DCGM no longer does
    assert "1" not in mig_series(seen[0], "gpu_mig_sm_active_ratio")
    for _ in range(int(MIG_RESCAN_INTERVAL)):
        seen.append(node.tick())
    node.reconfigure(after, dcgm=False)
    for _ in range(3):
        seen.append(node.tick())
    for series in seen:  # at every tick, a value is its own instance's or absent
        for gi, value in mig_series(series, "gpu_mig_sm_active_ratio").items():
            assert value == pytest.approx(SM_ACTIVE[int(gi)]), (gi, value)
    final = seen[-1]
    assert set(mig_series(final, "gpu_mig_info")) == {"5", "6", "13"}
    assert not any(dict(lbl).get("gpu_instance") == "1" for _, lbl in final)  # no stale series
    assert final[("gpu_mig_sm_active_ratio", labels(6, after[6]))] == pytest.approx(SM_ACTIVE[6])
    assert final[("gpu_mig_sm_active_ratio", labels(13))] == pytest.approx(SM_ACTIVE[13])
    # only one group of GI entities is left in the hostengine: the old ones were destroyed
    gi_groups = [
        g for g in node.engine.groups.values() if any(e[0] == node.fake.F.DCGM_FE_GPU_I for e in g.items)
    ]
    assert len(gi_groups) == 1
    assert node.fake.REGISTRY.crashes == []


def test_a_gi_given_another_gis_entity_id_is_never_credited_that_gis_last_sample(node: Node) -> None:
    node.tick()
    before = node.tick()
    # GI 1 (first in DCGM's list) is destroyed: GI 5 and GI 13 take the entity ids GI 1 and GI 5 had, whose
    # last samples DCGM keeps serving until its profiling module writes new ones
    after = {5: LAYOUT[5], 13: LAYOUT[13]}
    node.reconfigure(after)
    for _ in range(int(MIG_RESCAN_INTERVAL)):
        series = node.tick(published=[])
        assert mig_series(series, "gpu_mig_sm_active_ratio") == {}
        for name in ("gpu_mig_sm_active_seconds_total", "gpu_mig_profiled_seconds_total"):
            assert mig_series(series, name) == {gi: mig_series(before, name)[gi] for gi in ("5", "13")}
    assert node.missing(13)["sm_active"] == "stale"  # never a fresh sample for 3 intervals
    node.tick()
    series = node.tick()
    assert mig_series(series, "gpu_mig_sm_active_ratio") == {
        "5": pytest.approx(SM_ACTIVE[5]),
        "13": pytest.approx(SM_ACTIVE[13]),
    }


def test_an_instance_dcgm_lists_with_another_profile_waits_until_nvml_agrees(node: Node) -> None:
    node.tick()
    node.tick()
    changed = {**LAYOUT, 13: (2, "2g.20gb", 28, "MIG-aaaaaaaa-0113")}  # GI 13 recreated with 2 slices
    node.reconfigure(changed, nvml=False)
    series = node.tick()
    assert node.missing(13) == {"sm_active": "mig_layout_changing"}
    assert "13" not in mig_series(series, "gpu_mig_sm_active_ratio")
    assert series[("gpu_mig_memory_used_bytes", labels(13))] == 13 * GIB  # NVML's old view, until it sees
    node.reconfigure(changed, dcgm=False)
    for _ in range(3):
        series = node.tick()
    assert series[("gpu_mig_sm_active_ratio", labels(13, changed[13]))] == pytest.approx(SM_ACTIVE[13])
    assert not any(dict(lbl).get("mig_uuid") == LAYOUT[13][3] for _, lbl in series)


def test_an_instance_created_mid_run_costs_the_others_no_coverage(node: Node) -> None:
    node.tick()
    before = node.tick()
    added = {**LAYOUT, 6: (1, "1g.10gb", 14, "MIG-aaaaaaaa-0006")}
    node.reconfigure(added)  # appended: DCGM keeps the other instances' entity ids
    for _ in range(int(MIG_RESCAN_INTERVAL) + 1):
        after = node.tick()
    ticks = int(MIG_RESCAN_INTERVAL) + 1
    for gi in LAYOUT:
        covered = after[("gpu_mig_profiled_seconds_total", labels(gi))]
        assert covered == before[("gpu_mig_profiled_seconds_total", labels(gi))] + ticks
    assert after[("gpu_mig_sm_active_ratio", labels(6, added[6]))] == pytest.approx(SM_ACTIVE[6])


def test_all_instances_destroyed_leaves_no_instance_series_and_no_group(node: Node) -> None:
    node.tick()
    node.tick()
    node.reconfigure({})
    for _ in range(int(MIG_RESCAN_INTERVAL) + 1):
        series = node.tick()
    assert not any(n.startswith("gpu_mig_") for n, _ in series)
    assert not any(e[0] == node.fake.F.DCGM_FE_GPU_I for g in node.engine.groups.values() for e in g.items)
    whole = frozenset({"gpu": "1", "uuid": SPLIT, "hostname": "node-a"}.items())
    assert series[("gpu_sm_active_ratio", whole)] == 0.5


def test_a_node_without_mig_asks_dcgm_nothing_about_instances(
    monkeypatch: pytest.MonkeyPatch, fake_dcgm: ModuleType
) -> None:
    node = Node(monkeypatch, fake_dcgm)
    node.nvml.gpu(SPLIT).mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE
    node.engine.gpus[1].instances = []
    node.instances = []
    node.tick()
    series = node.tick()
    assert not any(n.startswith("gpu_mig_") for n, _ in series)
    calls = set(fake_dcgm.REGISTRY.calls)
    assert "dcgmGetGpuInstanceHierarchy" not in calls and "dcgmGroupAddEntity" not in calls
    for gpu, uuid in (("0", PLAIN), ("1", SPLIT)):
        whole = frozenset({"gpu": gpu, "uuid": uuid, "hostname": "node-a"}.items())
        assert series[("gpu_sm_active_ratio", whole)] == 0.5
        assert series[("gpu_dram_active_ratio", whole)] == 0.375


def test_the_hierarchy_is_read_once_per_tick_for_all_mig_gpus(
    monkeypatch: pytest.MonkeyPatch, fake_dcgm: ModuleType
) -> None:
    node = Node(monkeypatch, fake_dcgm, plain_split=True)
    node.clock_step = 0.001  # each GPU is read at its own time within the tick
    node.tick()
    calls = fake_dcgm.REGISTRY.calls
    for _ in range(3):
        before = calls.count("dcgmGetGpuInstanceHierarchy")
        series = node.tick()
        assert calls.count("dcgmGetGpuInstanceHierarchy") == before + 1
    assert series[("gpu_mig_sm_active_ratio", labels(5))] == pytest.approx(SM_ACTIVE[5])
    assert {dict(lbl)["uuid"] for n, lbl in series if n == "gpu_mig_info"} == {PLAIN, SPLIT}


def test_the_hostengine_restarting_rebuilds_the_instance_watch(node: Node) -> None:
    node.tick()
    node.tick()
    node.engine.restart()
    for _ in range(4):  # reconnect after 1 s, then one warming read
        series = node.tick()
    assert series[("gpu_mig_sm_active_ratio", labels(5))] == pytest.approx(SM_ACTIVE[5])


def test_matching_needs_the_same_gi_and_slice_count() -> None:
    three = MigInstance(1, "3g.40gb", ("MIG-a",))
    unnamed = MigInstance(2, "", ("MIG-b",))
    missing = MigInstance(3, "1g.10gb", ("MIG-c",))
    entities = {1: GiEntity(8, 1, 2), 2: GiEntity(9, 2, 4)}
    assert match_instances((three, unnamed, missing), entities) == {
        three: "mig_layout_changing",  # DCGM says 2 slices: one side has not seen the change yet
        unnamed: entities[2],  # no profile name to check against
        missing: "not_in_dcgm",
    }
    assert [profile_slices(p) for p in ("7g.80gb", "1g.10gb+me", "", "MIG")] == [7, 1, None, None]


def test_the_stub_adds_gi_entities_to_groups_as_dcgm_does(fake_dcgm: ModuleType) -> None:
    """DcgmGroupInfo::AddEntityToGroup: BADPARAM for an unknown entity or one already in the group, the
    GPU's GPU_IS_LOST for an entity of a lost GPU."""
    from smlens.sources.dcgm.bindings import load_bindings

    engine = fake_dcgm.REGISTRY.listen(
        fake_dcgm.FakeHostengine([fake_dcgm.FakeGpu(SPLIT, instances=[fake_dcgm.FakeGpuInstance(1, 3)])])
    )
    bindings = load_bindings()
    agent, structs, fields = bindings.agent, bindings.structs, bindings.fields
    handle = agent.dcgmConnect_v2("localhost:5555", structs.c_dcgmConnectV2Params_v2())
    group = agent.dcgmGroupCreate(handle, structs.DCGM_GROUP_EMPTY, "other")
    (gi,) = [r for r in engine.hierarchy() if r[0] == fields.DCGM_FE_GPU_I]
    agent.dcgmGroupAddEntity(handle, group, fields.DCGM_FE_GPU_I, gi[1])
    for entity_id, code in ((gi[1], structs.DCGM_ST_BADPARAM), (gi[1] + 1, structs.DCGM_ST_BADPARAM)):
        with pytest.raises(structs.DCGMError) as caught:
            agent.dcgmGroupAddEntity(handle, group, fields.DCGM_FE_GPU_I, entity_id)
        assert caught.value.value == code
    engine.gpus[0].lost = True
    other = agent.dcgmGroupCreate(handle, structs.DCGM_GROUP_EMPTY, "other-2")
    with pytest.raises(structs.DCGMError) as caught:
        agent.dcgmGroupAddEntity(handle, other, fields.DCGM_FE_GPU_I, gi[1])
    assert caught.value.value == structs.DCGM_ST_GPU_IS_LOST
