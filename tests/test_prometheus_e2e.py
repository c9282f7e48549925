"""A real Prometheus scrapes the real exporter (sim backend) with the shipped rules loaded.

The sim node's default GPUs: 0 healthy, 1 hollow, 2 single SM, 3 low occupancy, 4 memory-bound,
5 launch-bound, 6 idle, 7 idle with memory held; its default pod layout attributes most of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conftest import REPO, ExporterFactory
from promstack import has_data_soon, panel_queries, prometheus, query, require_any, substitute, wait_for
from smlens.bundle import rules
from smlens.exposition.selection import BY_NAME, DEFAULT_GROUPS, SELECTABLE
from smlens.verdicts import thresholds

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
        # The last rule of the recording group: every layer of one evaluation is written.
        wait_for("the last layer", lambda: bool(query(base, rules.ranked_name(thresholds.load().window))))
        yield base


def _by_gpu(base: str, expr: str) -> dict[str, float]:
    return {s["metric"]["gpu"]: float(s["value"][1]) for s in query(base, expr)}


def _samples(base: str, selector: str) -> dict[float, float]:
    """The samples of the one series ``selector`` matches, over the last minute, by their timestamp."""
    series = query(base, f"{selector}[1m]")
    assert len(series) <= 1, series
    return {float(at): float(value) for at, value in series[0]["values"]} if series else {}


def _at_one_evaluation(base: str, *selectors: str) -> tuple[float, list[float]]:
    """The time of the latest rule evaluation that wrote all these series, and their values then.

    Every rule of one evaluation writes its samples at that evaluation's time; read one query after the
    other, the series could come from two evaluations, and a rate over a window longer than the data
    grows with each one."""
    found: list[tuple[float, list[float]]] = []

    def written() -> bool:
        series = [_samples(base, selector) for selector in selectors]
        common = set.intersection(*(set(samples) for samples in series))
        if common:
            at = max(common)
            found.append((at, [samples[at] for samples in series]))
        return bool(common)

    wait_for(f"one evaluation that wrote {', '.join(selectors)}", written)
    return found[-1]


def _rules(base: str) -> list[dict[str, Any]]:
    groups = httpx.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_rules_evaluate_without_errors_and_record_what_the_sim_gpus_do(stack: str) -> None:
    wait_for("every rule evaluated once", lambda: all(r["health"] != "unknown" for r in _rules(stack)))
    broken = [(r["name"], r.get("lastError")) for r in _rules(stack) if r["health"] != "ok"]
    assert not broken
    shipped = [
        rule
        for path in sorted((REPO / "rules").glob("*.rules.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    assert len(_rules(stack)) == len(shipped)

    util = _by_gpu(stack, "gpu:gpu_utilization:ratio_rate10m")
    sm = _by_gpu(stack, "gpu:gpu_sm_active:ratio_rate10m")
    assert util["1"] >= 0.9 and sm["1"] <= 0.15  # hollow
    assert util["2"] >= 0.9 and sm["2"] <= 0.02  # one SM of 132
    profiled = "gpu:gpu_profiled_seconds:rate10m"
    assert (
        sm["0"] >= 0.85 and _by_gpu(stack, f"gpu:gpu_tensor_active_seconds:rate10m / {profiled}")["0"] >= 0.6
    )
    assert _by_gpu(stack, f"gpu:gpu_sm_occupancy_seconds:rate10m / {profiled}")["3"] <= 0.05
    assert _by_gpu(stack, f"gpu:gpu_dram_active_seconds:rate10m / {profiled}")["4"] >= 0.8
    # Hollow GPUs count all their GPU-seconds as hollow. (rate() over a window longer than the data
    # Prometheus has yet is the window's average, so compare with the GPU's sampled seconds.)
    hollow = _by_gpu(stack, "gpu:gpu_busy_but_hollow_seconds:rate10m")
    assert {gpu for gpu, value in hollow.items() if value > 0} == {"1", "2"}
    _, (hollow_1, sampled_1) = _at_one_evaluation(
        stack,
        'gpu:gpu_busy_but_hollow_seconds:rate10m{gpu="1"}',
        'gpu:gpu_utilization_sampled_seconds:rate10m{gpu="1"}',
    )
    assert hollow_1 == pytest.approx(sampled_1)

    # The node's mean is its GPU-seconds summed, then divided: the same as from the raw counters.
    [node] = query(stack, "hostname:gpu_sm_active_seconds:rate10m")
    assert node["metric"] == {"__name__": "hostname:gpu_sm_active_seconds:rate10m", "hostname": HOSTNAME}
    at, [active, covered] = _at_one_evaluation(
        stack, "hostname:gpu_sm_active_seconds:rate10m", "hostname:gpu_profiled_seconds:rate10m"
    )
    [raw] = query(
        stack,
        "sum(rate(gpu_sm_active_seconds_total[10m])) / sum(rate(gpu_profiled_seconds_total[10m]))",
        at=at,
    )
    assert active / covered == pytest.approx(float(raw["value"][1]), abs=0.01)

    # Workload levels carry the owner the exporter attributes the GPU to.
    owners = query(stack, 'gpu_allocation_info{gpu="1"}')
    assert len(owners) == 1
    owner = owners[0]["metric"]
    [per_gpu] = query(stack, 'gpu:gpu_sm_active:ratio_rate10m{gpu="1"}')
    assert (per_gpu["metric"]["namespace"], per_gpu["metric"]["pod"]) == (owner["namespace"], owner["pod"])
    namespace_hollow = f'namespace:gpu_busy_but_hollow_seconds:rate10m{{namespace="{owner["namespace"]}"}}'
    _, (namespace, gpu) = _at_one_evaluation(
        stack, namespace_hollow, 'gpu:gpu_busy_but_hollow_seconds:rate10m{gpu="1"}'
    )
    assert namespace >= gpu > 0


def _series_label_values(base: str, selector: str, label: str) -> list[str]:
    response = httpx.get(f"{base}/api/v1/series", params={"match[]": selector}, timeout=10).json()
    assert response["status"] == "success", response
    values = {s[label] for s in response["data"] if label in s}
    return sorted(values, key=lambda v: (len(v), v) if v.isdigit() else (0, v))


def test_every_dashboard_query_returns_data(stack: str) -> None:
    """Variables take Grafana's defaults (All where offered, else the first value); every query of
    every panel must then return at least one series, and the fleet counts match the sim's GPUs."""
    empty: list[str] = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text())
        values: dict[str, str] = {"datasource": "prometheus"}
        for variable in model["templating"]["list"][1:]:
            metric, label = (
                variable["definition"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
            )
            # All where offered, which also matches series without the label (no cluster here); else
            # the first value, as Grafana opens a dashboard.
            if variable["multi"] and variable["includeAll"]:
                values[variable["name"]] = ".*"
                continue
            options = _series_label_values(stack, substitute(metric, values), label)
            assert options, f"{path.name}: variable {variable['name']} has no values"
            values[variable["name"]] = options[0]
        # A panel that names its empty state (noValue, e.g. "none reported" for XIDs) may be empty, and
        # so may a query of families outside the default metric groups in a panel that says which.
        says_empty = {
            p["title"] for p in model["panels"] if "noValue" in p.get("fieldConfig", {}).get("defaults", {})
        }
        names_groups = {p["title"] for p in model["panels"] if "--metrics" in p.get("description", "")}
        for title, expr in panel_queries(model):
            optional = title in names_groups and any(family in expr for family in NOT_DEFAULT)
            if (
                title not in says_empty
                and not optional
                and not has_data_soon(stack, substitute(expr, values))
            ):
                empty.append(f"{path.name} / {title}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

    fleet = json.loads((REPO / "dashboards" / "smlens-fleet.json").read_text())
    stats = {p["title"]: p["targets"][0]["expr"] for p in fleet["panels"] if p["type"] == "stat"}

    def count(title: str) -> float:
        [sample] = query(stack, substitute(stats[title], {"cluster": ".*"}))
        return float(sample["value"][1])

    assert count("GPUs") == 8
    assert count("Busy (NVML)") == 5  # GPUs 0-4
    assert count("Truly working") == 3  # GPUs 0, 3 and 4
    assert count("Busy but hollow") == 2  # GPUs 1 and 2
    assert count("No SM metrics") == 0
    assert count("Recording rules") == 1  # the strip says the rules are loaded


NOT_DEFAULT = sorted(SELECTABLE - {f for group in DEFAULT_GROUPS for f in BY_NAME[group].families})
RECORDED_SERIES = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
RAW_SERIES = re.compile(r"(?<![:\w])gpu_[a-z0-9_]+")


def test_dashboards_say_so_when_the_recording_rules_are_missing(
    start_exporter: ExporterFactory, tmp_path: Path
) -> None:
    """Absent, never 0, where users meet it: a Prometheus without smlens' rules (the PrometheusRule not
    picked up) gives a red strip that names the fix and empty tiles, never "8 GPUs, 0 busy"."""
    require_any("prometheus")
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", HOSTNAME)
    with prometheus(tmp_path, {"smlens": exporter.removeprefix("http://")}, []) as base:
        wait_for("the GPUs scraped", lambda: len(query(base, "gpu_up")) == 8)
        for path in sorted((REPO / "dashboards").glob("*.json")):
            if path.name == "smlens-waste.json":
                continue  # its strip tells three states apart: tests/test_accounting_e2e.py
            model = json.loads(path.read_text())
            values = {"cluster": ".*", "hostname": HOSTNAME, "gpu": "0", "namespace": ".*", "pod": ".*"}
            (strip,) = [p for p in model["panels"] if p["title"] == "Recording rules" and p["type"] == "stat"]
            [sample] = query(base, substitute(strip["targets"][0]["expr"], values))
            assert float(sample["value"][1]) == 0, path.name
            mapping = strip["fieldConfig"]["defaults"]["mappings"][0]["options"]["0"]
            assert "NOT LOADED" in mapping["text"] and "release" in mapping["text"]
            assert mapping["color"] == "red"
            # Every panel that reads only the rules' series is empty: no tile, line or row turns
            # their absence into a number.
            for title, expr in panel_queries(model):
                only_recorded = RECORDED_SERIES.search(expr) and not RAW_SERIES.search(expr)
                if only_recorded and title != "Recording rules":
                    assert query(base, substitute(expr, values)) == [], f"{path.name} / {title}: {expr}"
