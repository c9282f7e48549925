"""A real Prometheus scrapes the real exporter (sim backend) with the shipped rules loaded.

The sim node's default GPUs: 0 healthy, 1 hollow, 2 single SM, 3 low occupancy, 4 memory-bound,
5 launch-bound, 6 idle, 7 idle with memory held; its default pod layout attributes most of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import REPO, ExporterFactory
from promstack import panel_queries, prometheus, query, require_any, substitute, wait_for

HOSTNAME = "e2e-node"


@pytest.fixture
def stack(start_exporter: ExporterFactory, tmp_path: Path) -> Iterator[str]:
    """Prometheus base URL, once every GPU has recorded means."""
    require_any("prometheus")
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", HOSTNAME)
    rule_files = sorted((REPO / "rules").glob("*.rules.yaml"))
    with prometheus(tmp_path, {"smlens": exporter.removeprefix("http://")}, rule_files) as base:
        wait_for(
            "recorded means of all 8 GPUs", lambda: len(query(base, "gpu:gpu_sm_active:ratio_rate10m")) == 8
        )
        yield base


def _by_gpu(base: str, expr: str) -> dict[str, float]:
    return {s["metric"]["gpu"]: float(s["value"][1]) for s in query(base, expr)}


def _rules(base: str) -> list[dict[str, Any]]:
    groups = httpx.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_rules_evaluate_without_errors_and_record_what_the_sim_gpus_do(stack: str) -> None:
    wait_for("every rule evaluated once", lambda: all(r["health"] != "unknown" for r in _rules(stack)))
    broken = [(r["name"], r.get("lastError")) for r in _rules(stack) if r["health"] != "ok"]
    assert not broken
    assert len(_rules(stack)) == 54

    util = _by_gpu(stack, "gpu:gpu_utilization:ratio_rate10m")
    sm = _by_gpu(stack, "gpu:gpu_sm_active:ratio_rate10m")
    assert util["1"] >= 0.9 and sm["1"] <= 0.15  # hollow
    assert util["2"] >= 0.9 and sm["2"] <= 0.02  # one SM of 132
    assert sm["0"] >= 0.85 and _by_gpu(stack, "gpu:gpu_tensor_active:ratio_rate10m")["0"] >= 0.6
    assert _by_gpu(stack, "gpu:gpu_sm_occupancy:ratio_rate10m")["3"] <= 0.05
    assert _by_gpu(stack, "gpu:gpu_dram_active:ratio_rate10m")["4"] >= 0.8
    # Hollow GPUs count all their GPU-seconds as hollow. (rate() over a window longer than the data
    # Prometheus has yet is the window's average, so compare with the GPU's sampled seconds.)
    hollow = _by_gpu(stack, "gpu:gpu_busy_but_hollow_seconds:rate10m")
    sampled = _by_gpu(stack, "gpu:gpu_utilization_sampled_seconds:rate10m")
    assert {gpu for gpu, value in hollow.items() if value > 0} == {"1", "2"}
    assert hollow["1"] == pytest.approx(sampled["1"])

    # The node's mean is its GPU-seconds summed, then divided: the same as from the raw counters.
    [node] = query(stack, "hostname:gpu_sm_active:ratio_rate10m")
    assert node["metric"] == {"__name__": "hostname:gpu_sm_active:ratio_rate10m", "hostname": HOSTNAME}
    [raw] = query(
        stack, "sum(rate(gpu_sm_active_seconds_total[10m])) / sum(rate(gpu_profiled_seconds_total[10m]))"
    )
    assert float(node["value"][1]) == pytest.approx(float(raw["value"][1]), abs=0.01)

    # Workload levels carry the owner the exporter attributes the GPU to.
    owners = query(stack, 'gpu_allocation_info{gpu="1"}')
    assert len(owners) == 1
    owner = owners[0]["metric"]
    [per_gpu] = query(stack, 'gpu:gpu_sm_active:ratio_rate10m{gpu="1"}')
    assert (per_gpu["metric"]["namespace"], per_gpu["metric"]["pod"]) == (owner["namespace"], owner["pod"])
    [pod] = query(stack, f'namespace_pod:gpu_busy_but_hollow_seconds:rate10m{{pod="{owner["pod"]}"}}')
    at, value = pod["value"]  # recorded in the same evaluation as the per-GPU series
    [gpu] = query(stack, 'gpu:gpu_busy_but_hollow_seconds:rate10m{gpu="1"}', at=at)
    assert float(value) == float(gpu["value"][1]) > 0


def _series_label_values(base: str, selector: str, label: str) -> list[str]:
    response = httpx.get(f"{base}/api/v1/series", params={"match[]": selector}, timeout=10).json()
    assert response["status"] == "success", response
    values = {s[label] for s in response["data"] if label in s}
    return sorted(values, key=lambda v: (len(v), v) if v.isdigit() else (0, v))


def test_every_dashboard_query_returns_data(stack: str) -> None:
    """Variables take Grafana's defaults (All for multi-value, else the first value); every query of
    every panel must then return at least one series, and the fleet counts match the sim's GPUs."""
    empty: list[str] = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text())
        values: dict[str, str] = {"datasource": "prometheus"}
        for variable in model["templating"]["list"][1:]:
            metric, label = variable["definition"].removeprefix("label_values(").removesuffix(")").split(", ")
            options = _series_label_values(stack, substitute(metric, values), label)
            assert options, f"{path.name}: variable {variable['name']} has no values"
            values[variable["name"]] = ".*" if variable["multi"] else options[0]
        for title, expr in panel_queries(model):
            if not query(stack, substitute(expr, values)):
                empty.append(f"{path.name} / {title}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

    fleet = json.loads((REPO / "dashboards" / "smlens-fleet.json").read_text())
    stats = {p["title"]: p["targets"][0]["expr"] for p in fleet["panels"] if p["type"] == "stat"}

    def count(title: str) -> float:
        [sample] = query(stack, substitute(stats[title], {"hostname": ".*"}))
        return float(sample["value"][1])

    assert count("GPUs") == 8
    assert count("Busy (NVML)") == 5  # GPUs 0-4
    assert count("Truly working") == 3  # GPUs 0, 3 and 4
    assert count("Busy but hollow") == 2  # GPUs 1 and 2
    assert count("No SM metrics") == 0
