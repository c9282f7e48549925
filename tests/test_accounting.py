"""The accounting ledger (smlens.pipeline.accounting) and its families at /metrics: seconds per verdict
class and owner, tick by tick."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smlens import names as n
from smlens.exposition.collector import SnapshotCollector
from smlens.exposition.selection import Selection, parse_selection
from smlens.model import (
    UNATTRIBUTED,
    Account,
    Allocation,
    Attribution,
    Entry,
    GpuIdentity,
    GpuState,
    InstanceState,
    MigInstance,
    Snapshot,
    Workload,
    WorkloadUsage,
)
from smlens.pipeline.accounting import LINGER_SECONDS, MAX_ACCOUNTS_PER_GPU, Accountant, account
from smlens.verdicts import thresholds

T = thresholds.load()
TRAINER = Workload("ml", "train-0", "main")
OTHER = Workload("ml", "notebook", "jupyter")
JOB = Workload(slurm_job="4242")
COMPUTE = {
    n.UTILIZATION: 1.0,
    n.SM_ACTIVE: 0.96,
    n.SM_OCCUPANCY: 0.3,
    n.DRAM_ACTIVE: 0.2,
    n.TENSOR_ACTIVE: 0.93,
}
HOLLOW = {
    n.UTILIZATION: 1.0,
    n.SM_ACTIVE: 0.05,
    n.SM_OCCUPANCY: 0.01,
    n.DRAM_ACTIVE: 0.0,
    n.TENSOR_ACTIVE: 0.0,
}
IDLE = {n.UTILIZATION: 0.0, n.SM_ACTIVE: 0.0, n.SM_OCCUPANCY: 0.0, n.DRAM_ACTIVE: 0.0, n.TENSOR_ACTIVE: 0.0}


def gpu(
    uuid: str = "GPU-0",
    gauges: dict[str, float] = COMPUTE,
    up: bool = True,
    instances: tuple[InstanceState, ...] = (),
) -> GpuState:
    return GpuState(
        identity=GpuIdentity(0, uuid, "NVIDIA H200", sm_count=132),
        up=up,
        gauges=MappingProxyType(dict(gauges)),
        activity_totals=MappingProxyType({}),
        totals=MappingProxyType({}),
        clock_events=MappingProxyType({}),
        xid_totals=MappingProxyType({}),
        missing=MappingProxyType({}),
        profiling_source="sim",
        profiling_available=True,
        profiling_reason="",
        sources=("sim",),
        instances=instances,
    )


def held(*owners: Workload, uuid: str = "GPU-0") -> Attribution:
    return Attribution(allocations=tuple(Allocation(o, "nvidia.com/gpu", uuid, uuid) for o in owners))


def seconds(ledger: Mapping[Account, Entry]) -> dict[tuple[str, Workload], float]:
    return {(k.verdict, k.owner): round(v.seconds, 6) for k, v in ledger.items()}


def test_a_tick_adds_its_seconds_to_the_class_and_owner_of_that_tick() -> None:
    ledger = account(T, {}, [gpu()], held(TRAINER), 1.0, now=10.0)
    ledger = account(T, ledger, [gpu()], held(TRAINER), 1.0, now=11.0)
    ledger = account(T, ledger, [gpu(gauges=HOLLOW)], held(TRAINER), 0.5, now=11.5)
    assert seconds(ledger) == {("compute_bound", TRAINER): 2.0, ("hollow", TRAINER): 0.5}


def test_a_gpu_shared_by_several_workloads_splits_its_seconds_evenly() -> None:
    ledger = account(T, {}, [gpu(gauges=IDLE)], held(TRAINER, OTHER), 3.0, now=1.0)
    assert seconds(ledger) == {("idle", TRAINER): 1.5, ("idle", OTHER): 1.5}


def test_without_allocations_the_workloads_whose_processes_use_it_own_it() -> None:
    usage = WorkloadUsage("GPU-0", JOB, processes=2, memory_used_bytes=1e9, utilization=1.0)
    unattributed = WorkloadUsage("GPU-0", UNATTRIBUTED, processes=1, memory_used_bytes=1e6, utilization=0)
    attribution = Attribution(workloads=(usage, unattributed))
    assert seconds(account(T, {}, [gpu()], attribution, 1.0, now=1.0)) == {("compute_bound", JOB): 1.0}
    assert seconds(account(T, {}, [gpu()], Attribution(), 1.0, now=1.0)) == {
        ("compute_bound", UNATTRIBUTED): 1.0
    }


def test_with_owner_labels_off_every_second_is_unattributed() -> None:
    attribution = Attribution(allocations=held(TRAINER).allocations, owner_labels=False)
    assert seconds(account(T, {}, [gpu()], attribution, 1.0, now=1.0)) == {
        ("compute_bound", UNATTRIBUTED): 1.0
    }


def test_a_lost_gpu_counts_down_seconds() -> None:
    assert seconds(account(T, {}, [gpu(up=False)], held(TRAINER), 1.0, now=1.0)) == {("down", TRAINER): 1.0}


def test_a_gpu_in_mig_mode_accounts_its_instances_not_itself() -> None:
    small = MigInstance(1, "1g.18gb", ("MIG-a",), sm_count=16)
    large = MigInstance(2, "3g.71gb", ("MIG-b",), sm_count=60)
    busy = {n.SM_ACTIVE: 0.9, n.SM_OCCUPANCY: 0.5, n.DRAM_ACTIVE: 0.9, n.MEMORY_USED_BYTES: 4e9}
    quiet = {n.SM_ACTIVE: 0.0, n.SM_OCCUPANCY: 0.0, n.DRAM_ACTIVE: 0.0, n.MEMORY_USED_BYTES: 0.0}
    instances = (
        InstanceState(small, MappingProxyType(busy), MappingProxyType({}), MappingProxyType({})),
        InstanceState(large, MappingProxyType(quiet), MappingProxyType({}), MappingProxyType({})),
    )
    attribution = Attribution(
        allocations=(Allocation(TRAINER, "nvidia.com/mig-1g.18gb", "MIG-a", "GPU-0", True, 1),)
    )
    ledger = account(T, {}, [gpu(gauges=COMPUTE, instances=instances)], attribution, 2.0, now=1.0)
    assert {(k.gpu_instance, k.mig_profile, k.verdict, k.owner): v.seconds for k, v in ledger.items()} == {
        (1, "1g.18gb", "memory_bound", TRAINER): 2.0,
        (2, "3g.71gb", "idle", UNATTRIBUTED): 2.0,
    }


def test_an_account_no_tick_adds_to_lingers_then_goes() -> None:
    ledger = account(T, {}, [gpu()], held(TRAINER), 1.0, now=0.0)
    ledger = account(T, ledger, [gpu()], held(OTHER), 1.0, now=LINGER_SECONDS - 1)
    assert seconds(ledger) == {("compute_bound", TRAINER): 1.0, ("compute_bound", OTHER): 1.0}
    ledger = account(T, ledger, [gpu()], held(OTHER), 1.0, now=LINGER_SECONDS + 1)
    assert seconds(ledger) == {("compute_bound", OTHER): 2.0}


def test_a_storm_of_short_lived_pods_keeps_a_gpu_within_its_accounts() -> None:
    ledger: Mapping[Account, Entry] = {}
    for tick in range(MAX_ACCOUNTS_PER_GPU * 3):
        ledger = account(T, ledger, [gpu()], held(Workload("ml", f"crash-{tick}", "c")), 1.0, now=float(tick))
    assert len(ledger) == MAX_ACCOUNTS_PER_GPU
    assert Workload("ml", f"crash-{MAX_ACCOUNTS_PER_GPU * 3 - 1}", "c") in {k.owner for k in ledger}


def test_the_accountant_times_ticks_by_the_sampler_clock_and_caps_a_gap() -> None:
    accountant = Accountant(T, interval=1.0)
    accountant.tick([gpu()], held(TRAINER), at=100.0)  # the first tick: nothing before it was seen
    assert seconds(accountant.ledger) == {}
    accountant.tick([gpu()], held(TRAINER), at=101.0)
    accountant.tick([gpu()], held(TRAINER), at=131.0)  # a stalled sampler: only two intervals count
    assert seconds(accountant.ledger) == {("compute_bound", TRAINER): 3.0}


def render_text(snapshot: Snapshot, selection: Selection) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, selection))
    return generate_latest(registry).decode()


def _snapshot(ledger: dict[Account, Entry], gpus: tuple[GpuState, ...]) -> Snapshot:
    return Snapshot("node-a", 1, 0.0, 1.0, 0.0, 0.0, gpus, (), ledger=MappingProxyType(ledger))


@pytest.mark.parametrize("groups", ["default,accounting", "all"])
def test_metrics_carry_one_counter_per_account_and_each_instance_share(groups: str) -> None:
    small = MigInstance(1, "1g.18gb", ("MIG-a",), sm_count=33)
    state = gpu(
        instances=(InstanceState(small, MappingProxyType({}), MappingProxyType({}), MappingProxyType({})),)
    )
    ledger = {
        Account("GPU-0", 1, "1g.18gb", "stalled", TRAINER): Entry(12.5, 0.0),
        Account("GPU-0", None, "", "idle", JOB): Entry(3.0, 0.0),
    }
    text = render_text(_snapshot(ledger, (state,)), parse_selection(groups))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.labels["gpu_instance"], s.labels["verdict"], s.labels["pod"], s.labels["slurm_job"]): s.value
        for s in families["gpu_verdict_seconds"].samples
        if s.name.endswith("_total")
    }
    assert samples == {("1", "stalled", "train-0", ""): 12.5, ("", "idle", "", "4242"): 3.0}
    (share,) = families[n.GPU_MIG_SM_SHARE_RATIO].samples
    assert share.value == 0.25 and share.labels["mig_profile"] == "1g.18gb"
    assert "namespace" not in share.labels  # owner labels never land on it


def test_the_default_groups_leave_the_accounting_families_out() -> None:
    ledger = {Account("GPU-0", None, "", "idle", JOB): Entry(3.0, 0.0)}
    text = render_text(_snapshot(ledger, (gpu(),)), parse_selection("default"))
    assert n.GPU_VERDICT_SECONDS not in text and n.GPU_MIG_SM_SHARE_RATIO not in text
