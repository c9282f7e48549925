"""The chart's rules and dashboards have one source: rules/, dashboards/ and their generators.

The chart carries templated copies (tools/helm_sync.py). These tests fail when a copy drifts: when the
chart, rendered with default values, does not give exactly the committed rules/ and dashboards/; when
threshold overrides do not give exactly what the generators give for the same thresholds; and when the
copies are not what tools/helm_sync.py would write now.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from conftest import REPO, require_tool
from helm_support import CHART_DIR, Rendered, helm_sync, render
from smlens.bundle import alertmanager, dashboards, files
from smlens.verdicts import thresholds

# Values as a user would set them: a ratio as --set gives it (a string), a whole number, a zero.
OVERRIDES: dict[str, Any] = {
    "hollow_sm_active": "0.2",
    "busy_utilization": 0.875,
    "tensor_busy": 1,
    "idle_utilization": 0,
    "window": "5m",
    "hollow_for": "30m",
    "runbook_base_url": "https://wiki.example.com/gpu/runbooks",
    "cluster_label": "k8s_cluster",
}


def chart_rule_groups(rendered: Rendered) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = rendered.one("PrometheusRule")["spec"]["groups"]
    return groups


def dashboard_configmaps(rendered: Rendered, label: str = "grafana_dashboard") -> list[dict[str, Any]]:
    return [cm for cm in rendered.of_kind("ConfigMap") if label in cm["metadata"]["labels"]]


def chart_dashboards(rendered: Rendered) -> dict[str, str]:
    return {name: text for cm in dashboard_configmaps(rendered) for name, text in cm["data"].items()}


def chart_route(rendered: Rendered) -> str:
    (configmap,) = [cm for cm in rendered.of_kind("ConfigMap") if cm["metadata"]["name"].endswith("-route")]
    text: str = configmap["data"][alertmanager.ROUTE_FILE]
    return text


def groups_of(files: dict[str, str]) -> list[dict[str, Any]]:
    """Rule groups of rule files, in the order Helm reads the chart's copies (by file name)."""
    return [group for name in sorted(files) for group in yaml.safe_load(files[name])["groups"]]


def test_chart_copies_are_what_helm_sync_writes() -> None:
    expected = helm_sync.expected_files()
    differing = [str(p.relative_to(REPO)) for p, text in expected.items() if p.read_text() != text]
    assert differing == [], "run: PYTHONPATH=exporter python tools/helm_sync.py"
    assert helm_sync.stale_files(expected) == []


def test_chart_thresholds_are_the_shipped_file() -> None:
    assert (CHART_DIR / "files" / "thresholds.yaml").read_bytes() == thresholds.SHIPPED.read_bytes()


def test_default_rules_are_exactly_rules_dir() -> None:
    committed = {p.name: p.read_text() for p in sorted((REPO / "rules").glob("*.yaml"))}
    assert committed, "rules/ holds no rule files"
    assert chart_rule_groups(render()) == groups_of(committed)


def test_default_dashboards_are_exactly_dashboards_dir() -> None:
    committed = {p.name: p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))}
    assert committed, "dashboards/ holds no dashboards"
    rendered = chart_dashboards(render())
    assert sorted(rendered) == sorted(committed)
    for name, text in committed.items():
        assert rendered[name] == text.rstrip("\n"), name


def test_overrides_give_what_the_generators_give() -> None:
    as_numbers = {k: float(v) if k == "hollow_sm_active" else v for k, v in OVERRIDES.items()}
    expected = thresholds.load().with_overrides(as_numbers, "test overrides")
    rendered = render({"thresholds": OVERRIDES})
    assert chart_rule_groups(rendered) == groups_of(files.rule_files(expected))
    generated = dashboards.dashboard_files(expected)
    assert chart_dashboards(rendered) == {name: text.rstrip("\n") for name, text in generated.items()}
    assert "ratio_rate5m" in json.dumps(chart_rule_groups(rendered))  # the window reaches record names
    route = alertmanager.route_files(expected)[alertmanager.ROUTE_FILE]
    assert chart_route(rendered) == route.rstrip("\n") and "k8s_cluster" in route


PRICES: dict[str, Any] = {
    "currency": "EUR",
    "gpu_hour": {"NVIDIA H200": 3.5, "NVIDIA A100-SXM4-80GB": 2},
    "mig_instance_hour": {"NVIDIA H200/1g.18gb": 0.625},
}


def test_a_price_table_gives_the_price_rules_the_generator_gives() -> None:
    expected = thresholds.load().with_overrides({"prices": PRICES}, "test prices")
    rendered = chart_rule_groups(render({"thresholds": {"prices": PRICES}}))
    assert rendered == groups_of(files.rule_files(expected))
    (prices,) = [g for g in rendered if g["name"] == "smlens-prices"]
    assert {r["expr"] for r in prices["rules"]} == {"vector(3.5)", "vector(2.0)", "vector(0.625)"}
    assert all(r["labels"]["currency"] == "EUR" for r in prices["rules"])
    (unpriced,) = [g for g in chart_rule_groups(render()) if g["name"] == "smlens-prices"]
    assert unpriced["rules"] == []


def test_a_price_table_the_exporter_would_refuse_the_chart_refuses_too() -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render({"thresholds": {"prices": {"gpu_hour": {"NVIDIA H200": -1}}}})
    with pytest.raises(helm_python.HelmValuesError):
        render({"thresholds": {"prices": {"mig_instance_hour": {"1g.18gb": 1}}}})


def test_default_route_is_exactly_alertmanager_dir() -> None:
    committed = (REPO / "alertmanager" / alertmanager.ROUTE_FILE).read_text()
    assert chart_route(render()) == committed.rstrip("\n")


def _alert_expr(rendered: Rendered, name: str) -> str:
    exprs = [r["expr"] for g in chart_rule_groups(rendered) for r in g["rules"] if r.get("alert") == name]
    assert len(exprs) == 1
    return str(exprs[0])


def test_exporter_down_alert_matches_the_job_the_monitor_creates() -> None:
    assert 'up{job=~"smlens"}' in _alert_expr(render(), "SmlensExporterDown")
    assert 'up{job=~"gpu-smlens"}' in _alert_expr(render(release="gpu"), "SmlensExporterDown")
    podmonitor = render({"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": True}})
    assert 'up{job=~"monitoring/smlens"}' in _alert_expr(podmonitor, "SmlensExporterDown")
    pinned = render({"thresholds": {"exporter_job": "gpu-exporters"}})
    assert 'up{job=~"gpu-exporters"}' in _alert_expr(pinned, "SmlensExporterDown")


@pytest.mark.parametrize(
    "values",
    [None, {"thresholds": OVERRIDES}, CHART_DIR / "ci" / "podmonitor-values.yaml"],
    ids=["default", "overrides", "podmonitor-values"],
)
def test_promtool_checks_the_rendered_rules(values: dict[str, Any] | Path | None, tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": chart_rule_groups(render(values))}))
    result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_would_catch_a_broken_rule(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    groups = chart_rule_groups(render())
    groups[0]["rules"][0]["expr"] = "sum by (hostname (gpu_up)"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_dashboard_configmaps_carry_the_sidecar_label() -> None:
    configmaps = dashboard_configmaps(render())
    assert len(configmaps) == len(list((REPO / "dashboards").glob("*.json")))
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = configmap["data"].values()
        assert json.loads(text)["panels"]
    relabelled = render({"dashboards": {"label": "dashboards.example.com/load", "labelValue": "yes"}})
    assert len(dashboard_configmaps(relabelled, "dashboards.example.com/load")) == len(configmaps)
    for configmap in dashboard_configmaps(relabelled, "dashboards.example.com/load"):
        assert configmap["metadata"]["labels"]["dashboards.example.com/load"] == "yes"
        assert "grafana_dashboard" not in configmap["metadata"]["labels"]
