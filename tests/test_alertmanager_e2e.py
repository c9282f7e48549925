"""A real Alertmanager delivers smlens' alerts to a webhook: Prometheus evaluates rules generated with
shortened ``for`` durations (through the thresholds file, as users and the Helm chart override them)
against the real exporter on the sim backend."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from conftest import ExporterFactory
from promstack import (
    ALERTMANAGER_NAMES,
    alertmanager_with_webhook,
    generate_rules,
    prometheus,
    query,
    require_any,
    wait_for,
)
from smlens.bundle import rules

HOSTNAME = "e2e-node"


def _delivered(received: list[dict[str, Any]], alertname: str) -> dict[str, dict[str, Any]]:
    """Alerts of that name the webhook received, by GPU index."""
    return {
        alert["labels"]["gpu"]: alert
        for payload in received
        for alert in payload["alerts"]
        if alert["labels"]["alertname"] == alertname
    }


def _active(base: str, alertname: str) -> set[str]:
    alerts = httpx.get(f"{base}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return {a["labels"]["gpu"] for a in alerts if a["labels"]["alertname"] == alertname}


def test_hollow_gpu_alert_reaches_the_webhook_and_the_healthy_gpu_stays_quiet(
    start_exporter: ExporterFactory, tmp_path: Path
) -> None:
    require_any("prometheus")
    require_any(*ALERTMANAGER_NAMES)
    rule_files = generate_rules(tmp_path / "rules", {"hollow_for": "2s", "allocated_idle_for": "2s"})
    generated = yaml.safe_load((tmp_path / "rules" / rules.ALERTS_FILE).read_text())["groups"][0]["rules"]
    assert {a["alert"]: a["for"] for a in generated}["GPUBusyButSMUnderused"] == "2s"
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", HOSTNAME)
    with (
        alertmanager_with_webhook(tmp_path) as (alertmanager, received),
        prometheus(tmp_path, {"smlens": exporter.removeprefix("http://")}, rule_files, alertmanager) as base,
    ):
        wait_for(
            "GPUBusyButSMUnderused for the hollow GPU at the webhook",
            lambda: "1" in _delivered(received, "GPUBusyButSMUnderused"),
            timeout=60,
        )
        wait_for(
            "GPUAllocatedButIdle for the idle GPU a notebook holds",
            lambda: "7" in _delivered(received, "GPUAllocatedButIdle"),
            timeout=30,
        )
        time.sleep(3)  # a few more evaluations and notifications: nothing else may arrive
        assert _active(base, "GPUBusyButSMUnderused") == {"1", "2"}  # hollow and single-SM GPUs
        hollow = _delivered(received, "GPUBusyButSMUnderused")
        assert set(hollow) == {"1", "2"}, "the healthy GPU 0 (and the others) must not alert"
        assert set(_delivered(received, "GPUAllocatedButIdle")) == {"7"}  # GPU 6 is idle but not held

        [info] = query(base, 'gpu_info{gpu="1"}')
        [owner] = query(base, 'gpu_allocation_info{gpu="1"}')
        alert = hollow["1"]
        assert alert["status"] == "firing"
        labels = alert["labels"]
        assert labels["severity"] == "warning"
        assert (labels["hostname"], labels["uuid"]) == (HOSTNAME, info["metric"]["uuid"])
        assert (labels["namespace"], labels["pod"]) == (owner["metric"]["namespace"], owner["metric"]["pod"])
        description = alert["annotations"]["description"]
        assert f"GPU 1 ({labels['uuid']}) on node {HOSTNAME}" in description
        assert f"workload {labels['namespace']}/{labels['pod']}" in description
        # The thresholds in words (no query per alert in the template: it would cost every evaluation).
        assert "NVML utilization is at least 80% but only" in description
        assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks.md#gpubusybutsmunderused")
