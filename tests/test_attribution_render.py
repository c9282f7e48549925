"""Attribution in the exposition (each test renders into its own registry) and the sim pod layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smlens.attribution import sim_layout
from smlens.attribution.refresher import PODRESOURCES, PROCESSES
from smlens.errors import ConfigError
from smlens.exposition.collector import SnapshotCollector
from smlens.model import (
    UNATTRIBUTED,
    Allocation,
    Attribution,
    GpuIdentity,
    Snapshot,
    SourceState,
    Workload,
    WorkloadUsage,
)
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend

A = Workload("ml", "a", "main")
B = Workload("ml", "b", "main")


def snapshot_with(attribution: Attribution) -> Snapshot:
    now = [0.0]
    sampler = Sampler(SimBackend(Scenario.steady(4)), [], hostname="n1", interval=1.0, clock=lambda: now[0])
    sampler.open()
    sampler.tick()
    now[0] = 1.0
    snapshot = sampler.tick()  # the second tick has ratios
    return snapshot._replace(attribution=attribution)


def render(snapshot: Snapshot) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append({**sample.labels, "value": str(sample.value)})
    return found


def uuids() -> list[str]:
    return [g.identity.uuid for g in snapshot_with(Attribution()).gpus]


def test_owner_labels_only_on_gpus_one_container_holds() -> None:
    u = uuids()
    attribution = Attribution(
        allocations=(
            Allocation(A, "nvidia.com/gpu", u[0], u[0]),
            Allocation(A, "nvidia.com/gpu.shared", f"{u[1]}::0", u[1]),
            Allocation(B, "nvidia.com/gpu.shared", f"{u[1]}::1", u[1]),
            Allocation(B, "nvidia.com/mig-1g.18gb", "MIG-x", u[2], partition=True),
            Allocation(B, "nvidia.com/mig-1g.18gb", "MIG-unknown", None, partition=True),
        ),
        sources=(SourceState(PODRESOURCES, True),),
    )
    found = render(snapshot_with(attribution))
    owners = {row["gpu"]: (row.get("namespace"), row.get("pod")) for row in found["gpu_sm_active_ratio"]}
    assert owners == {"0": ("ml", "a"), "1": (None, None), "2": (None, None), "3": (None, None)}
    assert all(row.get("pod") == "a" for row in found["gpu_info"] if row["gpu"] == "0")
    info = {(r["gpu"], r["uuid"], r["pod"], r["resource"]) for r in found["gpu_allocation_info"]}
    assert info == {
        ("0", u[0], "a", "nvidia.com/gpu"),
        ("1", u[1], "a", "nvidia.com/gpu.shared"),
        ("1", u[1], "b", "nvidia.com/gpu.shared"),
        ("2", u[2], "b", "nvidia.com/mig-1g.18gb"),
        ("", "MIG-unknown", "b", "nvidia.com/mig-1g.18gb"),
    }
    assert found["smlens_attribution_up"] == [{"source": "podresources", "value": "1.0"}]
    assert "gpu_workload_memory_used_bytes" not in found  # no process source configured


def test_owner_labels_can_be_switched_off() -> None:
    u = uuids()
    attribution = Attribution(
        allocations=(Allocation(A, "nvidia.com/gpu", u[0], u[0]),),
        sources=(SourceState(PODRESOURCES, True),),
        owner_labels=False,
    )
    found = render(snapshot_with(attribution))
    assert all("pod" not in row for row in found["gpu_sm_active_ratio"])
    assert [r["pod"] for r in found["gpu_allocation_info"]] == ["a"]


def test_source_down_shows_and_drops_nothing_else() -> None:
    attribution = Attribution(sources=(SourceState(PODRESOURCES, False, "timeout", "slow", 0.5),))
    found = render(snapshot_with(attribution))
    assert found["smlens_attribution_up"] == [{"source": "podresources", "value": "0.0"}]
    assert "gpu_allocation_info" not in found  # an empty family has no samples
    assert len(found["gpu_up"]) == 4


def test_no_attribution_no_families() -> None:
    found = render(snapshot_with(Attribution()))
    assert not [name for name in found if "attribution" in name or "allocation" in name]


def test_workload_series() -> None:
    u = uuids()
    job = Workload(slurm_job="77")
    attribution = Attribution(
        workloads=(
            WorkloadUsage(u[1], A, 2, 3e9, 0.5),
            WorkloadUsage(u[1], job, 1, None, None),
            WorkloadUsage(u[3], UNATTRIBUTED, 1, 1e9, 0.0),
        ),
        sources=(SourceState(PROCESSES, True, refresh_seconds=0.002),),
    )
    found = render(snapshot_with(attribution))
    memory = {
        (r["gpu"], r["pod"], r["slurm_job"]): float(r["value"])
        for r in found["gpu_workload_memory_used_bytes"]
    }
    assert memory == {("1", "a", ""): 3e9, ("3", "", ""): 1e9}  # the job's unknown memory stays absent
    util = {(r["gpu"], r["pod"], r["slurm_job"]) for r in found["gpu_workload_utilization_ratio"]}
    assert util == {("1", "a", ""), ("3", "", "")}
    processes = {(r["gpu"], r["slurm_job"]): float(r["value"]) for r in found["gpu_workload_processes"]}
    assert processes[("1", "77")] == 1
    # Workload series carry their own labels, never a GPU owner's on top.
    assert all(
        set(r) - {"value"} == {"gpu", "uuid", "hostname", "namespace", "pod", "container", "slurm_job"}
        for r in found["gpu_workload_processes"]
    )


GPUS = [GpuIdentity(i, f"GPU-{i}", "x") for i in range(8)]


def test_default_sim_layout_matches_the_sim_profiles() -> None:
    source = sim_layout.SimLayoutSource(sim_layout.DEFAULT_PODS, GPUS)
    got = Attribution(source.allocations())
    assert got.sole_owner("GPU-1") == Workload("ml-training", "llm-finetune-0", "trainer")  # the hollow GPU
    assert got.sole_owner("GPU-3") is None and len(got.owners("GPU-3")) == 2  # shared
    assert got.owners("GPU-6") == ()  # idle and free
    assert {a.device for a in got.allocations_of("GPU-3")} == {"GPU-3::0", "GPU-3::1"}
    # Fewer simulated GPUs: the default layout keeps what fits.
    assert {
        a.gpu_uuid for a in sim_layout.SimLayoutSource(sim_layout.DEFAULT_PODS, GPUS[:2]).allocations()
    } == {
        "GPU-0",
        "GPU-1",
    }


def test_sim_layout_places_pods_by_gpu_index_when_one_is_missing() -> None:
    present = [GPUS[0], GPUS[1], GPUS[3]]  # GPU 2 left out of discovery
    default = Attribution(sim_layout.SimLayoutSource(sim_layout.DEFAULT_PODS, present).allocations())
    assert len(default.owners("GPU-3")) == 2  # the two embedders of GPU 3
    assert default.sole_owner("GPU-1") == Workload("ml-training", "llm-finetune-0", "trainer")
    assert Workload("research", "spin-wait-debug", "worker") not in {a.owner for a in default.allocations}
    pods = [sim_layout.SimPod(A, (3,)), sim_layout.SimPod(B, (0, 1))]
    placed = Attribution(sim_layout.SimLayoutSource(pods, present, origin="pods.yaml").allocations())
    assert placed.sole_owner("GPU-3") == A
    assert placed.sole_owner("GPU-0") == placed.sole_owner("GPU-1") == B
    with pytest.raises(ConfigError, match="lists GPU 2"):
        sim_layout.SimLayoutSource([sim_layout.SimPod(A, (2,))], present, origin="pods.yaml")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("pods: 3\n", "needs a list under 'pods'"),
        ("pods:\n  - just-a-name\n", "expected a mapping"),
        ("pods:\n  - {namespace: a, pod: b, container: c}\n", "'gpus' must be"),
        ("pods:\n  - {namespace: a, pod: b, container: c, gpus: [true]}\n", "'gpus' must be"),
        ("pods:\n  - {namespace: a, pod: 'b c', container: c, gpus: [0]}\n", "'pod' must be"),
        ("pods:\n  - {namespace: a, pod: b, container: c, gpus: [0], gpu: 1}\n", "unknown key 'gpu'"),
        ("pods: [\n", "not valid YAML"),
    ],
)
def test_bad_layout_files(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        sim_layout.load(path)


def test_layout_file(tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text("pods:\n  - {namespace: a, pod: b, container: c, gpus: [2, 2, 5]}\n")
    (pod,) = sim_layout.load(path)
    assert pod == sim_layout.SimPod(Workload("a", "b", "c"), (2, 5))
    with pytest.raises(ConfigError, match="lists GPU 5"):
        sim_layout.SimLayoutSource([pod], GPUS[:4], origin=str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        sim_layout.load(tmp_path / "absent.yaml")
