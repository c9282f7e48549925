"""The Prometheus rules: generated from the thresholds, committed as generated, valid and unit-tested."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, require_tool
from smlens.bundle import files, rules
from smlens.verdicts import thresholds

RULES_DIR = REPO / "rules"
RUNBOOKS = REPO / "docs" / "runbooks.md"
PER_GPU_ALERTS = {
    "GPUBusyButSMUnderused",
    "GPULowSMOccupancy",
    "GPUAllocatedButIdle",
    "GPUProfilingMetricsUnavailable",
    "GPUNotReadable",
    "GPUXidError",
    "GPUXidErrorHardware",
    "GPUUncorrectableECCErrors",
    "GPUClockSlowdown",
}
REQUIRED_ALERTS = PER_GPU_ALERTS | {"SmlensExporterDown", "SmlensSamplingStalled", "SmlensBackendDown"}


def _groups(text: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(text)["groups"]
    return groups


def _alerts(t: thresholds.Thresholds) -> list[dict[str, Any]]:
    return [r for g in _groups(rules.rule_files(t)[rules.ALERTS_FILE]) for r in g["rules"]]


def _records(t: thresholds.Thresholds) -> list[dict[str, Any]]:
    return [r for g in _groups(rules.rule_files(t)[rules.RECORDING_FILE]) for r in g["rules"]]


def test_committed_rule_files_are_what_the_generator_writes() -> None:
    generated = files.rule_files(thresholds.load())
    committed = {p.name: p.read_text() for p in RULES_DIR.glob("*.yaml")}
    assert committed == generated, (
        "rules/ is stale: run `PYTHONPATH=exporter python -m smlens.bundle rules --out rules`"
    )


def test_promtool_accepts_the_committed_rules() -> None:
    promtool = require_tool("promtool")
    files = sorted(str(p) for p in RULES_DIR.glob("*.yaml"))
    result = subprocess.run([promtool, "check", "rules", *files], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    suites = sorted(str(p) for p in (RULES_DIR / "tests").glob("*.test.yaml"))
    assert len(suites) >= 5
    result = subprocess.run(
        [promtool, "test", "rules", *suites],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULES_DIR / "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(suites)


def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """The suites judge behaviour: the same suites fail against rules generated with other thresholds."""
    promtool = require_tool("promtool")
    (tmp_path / "tests").mkdir()
    for name, text in rules.rule_files(
        thresholds.load().with_overrides({"hollow_sm_active": 0.005}, "test")
    ).items():
        (tmp_path / name).write_text(text)
    suite = tmp_path / "tests" / "hollow.test.yaml"
    suite.write_text((RULES_DIR / "tests" / "hollow.test.yaml").read_text())
    result = subprocess.run(
        [promtool, "test", "rules", str(suite)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "GPUBusyButSMUnderused" in result.stdout + result.stderr


def test_required_alerts_exist_with_for_severity_and_annotations() -> None:
    t = thresholds.load()
    alerts = _alerts(t)
    assert {a["alert"] for a in alerts} >= REQUIRED_ALERTS
    for alert in alerts:
        assert list(alert) == ["alert", "expr", "for", "labels", "annotations"], alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info")
        annotations = alert["annotations"]
        assert list(annotations) == ["summary", "description", "runbook_url"]
        assert annotations["runbook_url"] == f"{t.runbook_base_url}#{alert['alert'].lower()}"
        if alert["alert"] in PER_GPU_ALERTS:
            for label in ("hostname", "gpu", "uuid", "pod", "namespace"):
                assert f"$labels.{label}" in annotations["description"], (alert["alert"], label)


def test_every_alert_has_a_runbook_section() -> None:
    headings = re.findall(r"^## (\w+)\s*$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    anchors = {h.lower() for h in headings}
    for alert in _alerts(thresholds.load()):
        assert alert["annotations"]["runbook_url"].split("#")[1] in anchors, alert["alert"]


def test_thresholds_flow_into_the_rules() -> None:
    t = thresholds.load().with_overrides(
        {
            "busy_utilization": 0.9,
            "hollow_sm_active": 0.25,
            "hollow_for": "1m",
            "window": "5m",
            "exporter_job": "gpu-exporter|smlens",
            "runbook_base_url": "https://wiki.example/gpu",
        },
        "test",
    )
    hollow = next(a for a in _alerts(t) if a["alert"] == "GPUBusyButSMUnderused")
    assert hollow["for"] == "1m"
    assert ">= 0.9" in hollow["expr"] and "<= 0.25" in hollow["expr"]
    assert "gpu:gpu_sm_active:ratio_rate5m" in hollow["expr"]
    assert hollow["annotations"]["runbook_url"] == "https://wiki.example/gpu#gpubusybutsmunderused"
    down = next(a for a in _alerts(t) if a["alert"] == "SmlensExporterDown")
    assert down["expr"] == 'up{job=~"gpu-exporter|smlens"} == 0'
    records = {r["record"]: r["expr"] for r in _records(t)}
    assert "rate(gpu_busy_seconds_total[5m])" in records["gpu:gpu_busy_seconds:rate5m"]
    assert not any("10m" in name for name in records)


def test_recorded_names_follow_level_metric_operations() -> None:
    t = thresholds.load()
    levels = {level.name for level in (rules.GPU, *rules.AGGREGATES, rules.NAMESPACE_POD, rules.INSTANCE)}
    names = [r["record"] for r in _records(t)]
    assert len(names) == len(set(names))
    for name in names:
        level, metric, operations = name.split(":")
        assert level in levels and metric.startswith("gpu"), name
        assert re.fullmatch(r"(topk_)?(ratio_)?rate10m|count(10m)?|sum", operations), name
    for level in (rules.GPU, *rules.AGGREGATES):
        recorded_means = {name for name in names if name.startswith(f"{level.name}:") and ":ratio_" in name}
        assert recorded_means == {rules.mean_name(level, mean, t.window) for mean in level.ratios}
        for summed in rules.SUMMED:
            if level is not rules.GPU or summed not in (rules.PROFILED_BUSY, rules.SOL_PROFILED):
                assert rules.sum_name(level, summed, t.window) in names
        assert rules.hollow_name(level, t.window) in names
    # Every mean at the cluster and fleet layers; the per-GPU names users' own queries and the
    # alerts rely on stay as they were.
    for level in (rules.CLUSTER, rules.FLEET):
        assert set(level.ratios) == {*rules.MEANS, rules.EFFICIENCY, rules.COMPUTE_SOL}
    assert rules.GPU.ratios == (rules.UTILIZATION_MEAN, rules.SM_ACTIVE_MEAN)
    assert {"gpu:gpu_sm_active:ratio_rate10m", "gpu:gpu_utilization:ratio_rate10m"} <= set(names)


def test_each_layer_sums_the_layer_below_and_divides_its_own_sums() -> None:
    """Aggregates read only the layer below (never the per-GPU series again) and keep the cluster
    label up to the cluster layer; ratios divide sums of their own layer, never average ratios."""
    t = thresholds.load()
    records = {r["record"]: r["expr"] for r in _records(t)}
    for expr in records.values():
        assert "avg" not in expr
    for level in rules.AGGREGATES:
        assert level.below is not None
        kept = ", ".join(rules.level_labels(level, "cluster"))
        grouping = f"by ({kept}) " if kept else ""
        for summed in rules.SUMMED:
            below = rules.summed(level.below, summed, t.window)
            assert records[rules.sum_name(level, summed, t.window)] == f"sum {grouping}({below})"
        for mean in level.ratios:
            numerator, denominator = records[rules.mean_name(level, mean, t.window)].split("\n/\n")
            assert numerator.startswith(rules.sum_name(level, mean.numerator, t.window)), level.name
            assert denominator == f"({rules.sum_name(level, mean.denominator, t.window)} > 0)"
    assert "cluster" in rules.level_labels(rules.CLUSTER, "cluster")
    assert rules.level_labels(rules.FLEET, "cluster") == ()


def test_cluster_label_is_configurable() -> None:
    t = thresholds.load().with_overrides({"cluster_label": "k8s_cluster"}, "test")
    text = "\n".join(r["expr"] for r in _records(t)) + "\n".join(str(a["expr"]) for a in _alerts(t))
    assert "k8s_cluster" in text and "cluster," not in text.replace("k8s_cluster,", "")


def test_rule_yaml_is_stable_and_literal() -> None:
    text = rules.rule_files(thresholds.load())[rules.RECORDING_FILE]
    assert text == rules.rule_files(thresholds.load())[rules.RECORDING_FILE]
    assert text.startswith(rules.HEADER)
    assert "expr: |-\n" in text  # multi-line expressions stay readable block scalars


def _bundle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "smlens.bundle", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )


def test_bundle_cli_writes_overridden_rules(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("hollow_for: 2s\n")
    result = _bundle("rules", "--out", str(tmp_path / "out"), "--thresholds", str(overrides))
    assert result.returncode == 0, result.stderr
    alerts = yaml.safe_load((tmp_path / "out" / rules.ALERTS_FILE).read_text())["groups"][0]["rules"]
    assert next(a for a in alerts if a["alert"] == "GPUBusyButSMUnderused")["for"] == "2s"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("window: 5\n", "threshold 'window' must be a Prometheus duration such as 15m, got 5."),
        ("hollow_sm_active: 3\n", "threshold 'hollow_sm_active' must be a ratio from 0 to 1, got 3."),
        ("runbook_base_url: wiki\n", "threshold 'runbook_base_url' must be an http(s) URL without spaces"),
        ("exporter_job: '('\n", "threshold 'exporter_job' must be a regular expression"),
        ("cluster_label: 'a-b'\n", "threshold 'cluster_label' must be a Prometheus label name"),
        ("no_such: 1\n", "unknown threshold 'no_such'"),
    ],
)
def test_bundle_cli_rejects_bad_thresholds_in_one_sentence(
    tmp_path: Path, content: str, expected: str
) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(content)
    result = _bundle("rules", "--out", str(tmp_path / "out"), "--thresholds", str(overrides))
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _gpu_series(uuid: str, labels: str, values: tuple[str, str, str], sm_step: int) -> list[dict[str, str]]:
    """A GPU's counters and gpu_up as promtool input: busy every second, SM active ``sm_step`` of 60 s;
    ``values``: the counters' values before, during and after the series' life (promtool notation)."""
    before, steps, after = values
    key = f'cluster="a",hostname="n1",gpu="0",uuid="{uuid}"{labels},instance="i",job="smlens"'
    counters = {"gpu_busy_seconds_total": 60, "gpu_utilization_sampled_seconds_total": 60}
    counters |= {"gpu_sm_active_seconds_total": sm_step, "gpu_profiled_seconds_total": 60}
    series = [
        {"series": f"{name}{{{key}}}", "values": f"{before}0+{step}x{steps}{after}"}
        for name, step in counters.items()
    ]
    return [*series, {"series": f"gpu_up{{{key}}}", "values": f"{before}1x{steps}{after}"}]


def test_ranked_lists_hold_the_worst_current_gpus_after_churn(tmp_path: Path) -> None:
    """Five GPUs changed owner 4 minutes ago: their previous owners' series, the most hollow of the
    cluster, linger. The hollow list still holds its TOP_GPUS current GPUs; it held 15 when the
    lingering series were ranked before being dropped."""
    promtool = require_tool("promtool")
    series: list[dict[str, str]] = []
    for i in range(5):
        series += _gpu_series(f"GPU-c{i}", ',namespace="ml",pod="old"', ("", "6", " stale"), 3)
        series += _gpu_series(f"GPU-c{i}", ',namespace="ml",pod="new"', ("_x6 ", "6", ""), 3)
    for i in range(rules.TOP_GPUS + 2):
        series += _gpu_series(f"GPU-h{i}", "", ("", "12", ""), 6)
    ranked = rules.ranked_name("10m")
    suite = {
        "rule_files": [str(RULES_DIR / rules.RECORDING_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f'count({ranked}{{ranking="hollow"}})',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": "{}", "value": rules.TOP_GPUS}],
                    },
                    {
                        "expr": f'count({ranked}{{ranking="hollow",pod="new"}})',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": "{}", "value": 5}],
                    },
                    {"expr": f'{ranked}{{pod="old"}}', "eval_time": "10m", "exp_samples": []},
                ],
            }
        ],
    }
    path = tmp_path / "ranked.test.yaml"
    path.write_text(yaml.safe_dump(suite))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
