"""The shipped Alertmanager route (alertmanager/) in a real Alertmanager: one notification per
workload for alerts that name a pod, one per node for the others."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from conftest import REPO
from promstack import alertmanager_with_webhook, wait_for
from smlens.bundle import alertmanager
from smlens.verdicts import thresholds

ROUTE_FILE = REPO / "alertmanager" / alertmanager.ROUTE_FILE


def test_committed_route_is_what_the_generator_writes() -> None:
    generated = alertmanager.route_files(thresholds.load())[alertmanager.ROUTE_FILE]
    assert ROUTE_FILE.read_text() == generated, (
        "alertmanager/ is stale: run"
        " `PYTHONPATH=exporter python -m smlens.bundle alertmanager --out alertmanager`"
    )


def _alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {
        "labels": {"alertname": name, "severity": severity, "cluster": "prod", **labels},
        "annotations": {"summary": name},
    }


def _gpu(node: str, index: int) -> dict[str, str]:
    return {"hostname": node, "gpu": str(index), "uuid": f"GPU-{node}-{index}"}


def _notifications(workdir: Path, routes: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The notifications a real Alertmanager sends for 8 hollow GPUs of one pod, one of another pod
    and 2 unreadable GPUs of a node without workloads."""
    job = {"namespace": "ml", "pod": "train-0", "container": "main"}
    alerts = [_alert("GPUBusyButSMUnderused", "warning", **_gpu("node-a", i), **job) for i in range(8)]
    alerts.append(
        _alert("GPUBusyButSMUnderused", "warning", **_gpu("node-b", 0), namespace="ml", pod="infer-1")
    )
    alerts += [_alert("GPUNotReadable", "warning", **_gpu("node-c", i)) for i in range(2)]
    with alertmanager_with_webhook(workdir, routes) as (address, received):
        httpx.post(f"http://{address}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()
        wait_for("notifications of all alerts", lambda: sum(len(p["alerts"]) for p in received) >= 11)
        time.sleep(3)  # three more group intervals without a change: nothing more may arrive
    return received


def test_eight_hollow_gpus_of_one_pod_give_one_notification(tmp_path: Path) -> None:
    # The shipped routes with a test's timing: what is grouped together is unchanged.
    routes = yaml.safe_load(ROUTE_FILE.read_text())["routes"]
    for route in routes:
        route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    received = _notifications(tmp_path, routes)
    groups = {
        tuple(sorted(payload["groupLabels"].items())): sorted(a["labels"]["gpu"] for a in payload["alerts"])
        for payload in received
    }
    assert len(received) == 3, [p["groupLabels"] for p in received]
    assert groups == {
        (("cluster", "prod"), ("namespace", "ml"), ("pod", "train-0"), ("severity", "warning")): [
            str(i) for i in range(8)
        ],
        (("cluster", "prod"), ("namespace", "ml"), ("pod", "infer-1"), ("severity", "warning")): ["0"],
        (("cluster", "prod"), ("hostname", "node-c"), ("severity", "warning")): ["0", "1"],
    }


def test_a_critical_alert_of_a_workload_is_not_grouped_with_its_warnings(tmp_path: Path) -> None:
    """A hardware XID on a GPU of a pod whose GPUs run hollow: its own notification, with severity
    among the group labels so that a receiver can be chosen by severity."""
    routes = yaml.safe_load(ROUTE_FILE.read_text())["routes"]
    for route in routes:
        route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    job = {"namespace": "ml", "pod": "train-0", "container": "main"}
    alerts = [_alert("GPUBusyButSMUnderused", "warning", **_gpu("node-a", i), **job) for i in range(2)]
    alerts.append(_alert("GPUXidErrorHardware", "critical", **_gpu("node-a", 0), **job, xid="79"))
    with alertmanager_with_webhook(tmp_path, routes) as (address, received):
        httpx.post(f"http://{address}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()
        wait_for("notifications of all alerts", lambda: sum(len(p["alerts"]) for p in received) >= 3)
        time.sleep(3)
    by_severity = {p["groupLabels"].get("severity"): len(p["alerts"]) for p in received}
    assert len(received) == 2, [p["groupLabels"] for p in received]
    assert by_severity == {"warning": 2, "critical": 1}


def test_without_the_route_each_gpu_pages_alone(tmp_path: Path) -> None:
    """The negative case: grouped per GPU (the test stack's default route), the same alerts page 11 times."""
    assert len(_notifications(tmp_path, None)) == 11


def test_a_hardware_xid_mutes_application_xids_of_the_same_gpu_only(tmp_path: Path) -> None:
    """The shipped inhibit rule in a real Alertmanager: a hardware XID on GPU-a of node-a in prod
    mutes the application XID of that GPU, not those of another GPU of the node, of a GPU with the
    same uuid and node name in another cluster, nor any other alert of the GPU."""
    shipped = yaml.safe_load(ROUTE_FILE.read_text())
    hardware = _alert("GPUXidErrorHardware", "critical", hostname="node-a", uuid="GPU-a", xid="79")
    same_gpu = _alert("GPUXidError", "warning", hostname="node-a", uuid="GPU-a", xid="13")
    other_gpu = _alert("GPUXidError", "warning", hostname="node-a", uuid="GPU-b", xid="13")
    other_cluster = _alert("GPUXidError", "warning", hostname="node-a", uuid="GPU-a", xid="13")
    other_cluster["labels"]["cluster"] = "staging"
    hollow = _alert("GPUBusyButSMUnderused", "warning", hostname="node-a", uuid="GPU-a")
    posted = [hardware, same_gpu, other_gpu, other_cluster, hollow]
    with alertmanager_with_webhook(tmp_path, shipped["routes"], shipped["inhibit_rules"]) as (address, _):
        httpx.post(f"http://{address}/api/v2/alerts", json=posted, timeout=10).raise_for_status()

        def states() -> dict[tuple[str, str, str], bool]:
            listed = httpx.get(f"http://{address}/api/v2/alerts", timeout=10).json()
            return {
                (a["labels"]["alertname"], a["labels"]["cluster"], a["labels"]["uuid"]): bool(
                    a["status"]["inhibitedBy"]
                )
                for a in listed
            }

        wait_for("all alerts listed", lambda: len(states()) == len(posted))
        wait_for(
            "the same GPU's application XID inhibited", lambda: states()[("GPUXidError", "prod", "GPU-a")]
        )
        assert states() == {
            ("GPUXidErrorHardware", "prod", "GPU-a"): False,
            ("GPUXidError", "prod", "GPU-a"): True,
            ("GPUXidError", "prod", "GPU-b"): False,
            ("GPUXidError", "staging", "GPU-a"): False,
            ("GPUBusyButSMUnderused", "prod", "GPU-a"): False,
        }


def test_nodes_without_an_exporter_page_once_per_node(tmp_path: Path) -> None:
    """GPUNodeWithoutExporter carries the node's name as hostname too (rules/tests/fleet.test.yaml
    checks its labels): two such nodes of a cluster are two notifications, not one cluster-wide."""
    routes = yaml.safe_load(ROUTE_FILE.read_text())["routes"]
    for route in routes:
        route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    alerts = [_alert("GPUNodeWithoutExporter", "warning", node=n, hostname=n) for n in ("node-x", "node-y")]
    with alertmanager_with_webhook(tmp_path, routes) as (address, received):
        httpx.post(f"http://{address}/api/v2/alerts", json=alerts, timeout=10).raise_for_status()
        wait_for("notifications of both nodes", lambda: sum(len(p["alerts"]) for p in received) >= 2)
        time.sleep(3)
    assert sorted(p["groupLabels"].get("hostname", "") for p in received) == ["node-x", "node-y"]
