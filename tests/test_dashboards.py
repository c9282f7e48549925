"""The Grafana dashboards: generated from the thresholds, committed as generated, importable, valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, require_tool
from promstack import GRAFANA_BUILTINS, panel_queries, substitute
from smlens.bundle import accounting, dashboards, grafana, rules
from smlens.bundle.dashboards.sections import RULES_STRIP  # says 0 on purpose where rules are missing
from smlens.verdicts import thresholds

DASHBOARDS_DIR = REPO / "dashboards"
PANEL_TYPES = {"row", "timeseries", "stat", "table", "bargauge", "xychart", "state-timeline"}
RECORDED = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z0-9_]+\b")


def _committed() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def _variables(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in model["templating"]["list"]}


def test_committed_dashboards_are_what_the_generator_writes() -> None:
    committed = {p.name: p.read_text() for p in DASHBOARDS_DIR.iterdir()}
    generated = dashboards.dashboard_files(thresholds.load())
    assert committed == generated, (
        "dashboards/ is stale: run `PYTHONPATH=exporter python -m smlens.bundle dashboards --out dashboards`"
    )


def test_the_five_dashboards_exist_with_their_variables() -> None:
    models = _committed()
    expected = {
        "smlens-fleet.json": {"datasource", "cluster"},
        "smlens-node.json": {"datasource", "cluster", "hostname", "gpu"},
        "smlens-gpu.json": {"datasource", "cluster", "hostname", "gpu"},
        "smlens-workload.json": {"datasource", "cluster", "namespace", "pod"},
        "smlens-waste.json": {"datasource", "cluster", "namespace"},
    }
    assert set(models) == set(expected)
    for name, variables in expected.items():
        assert set(_variables(models[name])) == variables, name
        datasource = models[name]["templating"]["list"][0]
        assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_every_json_file_is_an_importable_classic_dashboard(name: str) -> None:
    model = json.loads((DASHBOARDS_DIR / name).read_text())
    assert model["id"] is None  # import creates it; a fixed id would overwrite another dashboard
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", model["uid"])
    assert model["title"] and isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    assert {"from", "to"} <= set(model["time"])
    panels = model["panels"]
    assert panels and all(p["type"] in PANEL_TYPES for p in panels)
    assert len({p["id"] for p in panels}) == len(panels)
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= grafana.GRID_WIDTH, panel[
            "title"
        ]
        cells = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert len(panel["description"]) > 40, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        assert all(t["datasource"] == panel["datasource"] and t["expr"].strip() for t in panel["targets"])


def test_queries_use_only_defined_variables_and_recorded_series_that_exist() -> None:
    records = {
        r["record"]
        for path in (rules.RECORDING_FILE, rules.ACCOUNTING_FILE)
        for g in yaml.safe_load((REPO / "rules" / path).read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    records.add(accounting.PRICE)  # written from the price table, absent without one
    for name, model in _committed().items():
        values = {v: "x" for v in _variables(model)}
        for title, expr in panel_queries(model):
            substitute(expr, values)  # raises on an undefined variable
            for series in RECORDED.findall(expr):
                assert series in records, f"{name} / {title}: {series} is not recorded"


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted) as the expression of a recording rule."""
    promtool = require_tool("promtool")
    checked = []
    for model in _committed().values():
        values = {v: "1" for v in _variables(model)}
        for title, expr in panel_queries(model):
            checked.append(
                {"record": "dashboard_query", "expr": substitute(expr, values), "labels": {"panel": title}}
            )
        for variable in model["templating"]["list"][1:]:
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
            assert match, variable["definition"]
            checked.append({"record": "variable_query", "expr": substitute(match.group(1), values)})
    rule_file = tmp_path / "queries.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": checked}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_fleet_overview_has_the_hollow_panels() -> None:
    fleet = _committed()["smlens-fleet.json"]
    by_title = {p["title"]: p for p in fleet["panels"]}
    assert by_title["Top hollow GPUs"]["type"] == "table"
    assert "topk(20" in by_title["Top hollow GPUs"]["targets"][0]["expr"]
    assert by_title["Hollow GPU-hours by namespace"]["type"] == "bargauge"
    scatter = by_title["Utilization vs SM active, GPUs with the largest gap"]
    assert scatter["type"] == "xychart"
    assert [t["format"] for t in scatter["targets"]] == ["table", "table"]
    for title in ("Busy (NVML)", "Truly working", "Busy but hollow"):
        assert by_title[title]["type"] == "stat"


def test_single_gpu_dashboard_puts_all_activity_on_one_time_axis() -> None:
    gpu = _committed()["smlens-gpu.json"]
    by_title = {p["title"]: p for p in gpu["panels"]}
    activity = by_title["Utilization, SM active, occupancy, tensor, DRAM"]
    counters = ["gpu_busy_seconds_total", "gpu_sm_active_seconds_total", "gpu_sm_occupancy_seconds_total"]
    counters += ["gpu_tensor_active_seconds_total", "gpu_dram_active_seconds_total"]
    assert [c in t["expr"] for t, c in zip(activity["targets"], counters, strict=True)] == [True] * 5
    assert activity["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert {"Power", "Memory used", "SM clock", "Clock slowdown (throttling)"} <= set(by_title)


def test_thresholds_flow_into_the_dashboards() -> None:
    t = thresholds.load().with_overrides({"busy_utilization": 0.9, "window": "5m"}, "test")
    fleet = json.loads(dashboards.dashboard_files(t)["smlens-fleet.json"])
    exprs = "\n".join(expr for _, expr in panel_queries(fleet))
    assert "ratio_rate5m" in exprs and "count5m" in exprs and "10m" not in exprs
    busy = next(p for p in fleet["panels"] if p["title"] == "Busy (NVML)")
    assert "90%" in busy["description"] and "5m" in busy["description"]


def test_substitute_knows_grafana_builtins_and_refuses_unknown_variables() -> None:
    assert substitute('rate(x{a=~"$a"}[$__rate_interval])', {"a": ".*"}) == (
        f'rate(x{{a=~".*"}}[{GRAFANA_BUILTINS["__rate_interval"]}])'
    )
    assert substitute("${a}", {"a": "1"}) == "1"
    with pytest.raises(KeyError):
        substitute("$b", {"a": "1"})


# What, on the right of an `or`, makes a number where the left had no data: a vector(), an expression
# scaled to a constant (x * 0), or group() (1 for any series) shifted or scaled.
_OR = re.compile(r"\bor\b", re.IGNORECASE)
_CONSTANT = re.compile(
    r"\bvector\s*\(|\*\s*0(?:\.0*)?(?![\d.])|(?<![\w.])0(?:\.0*)?\s*\*|\bgroup\s*\("
    r"|\bclamp_max\s*\([^)]*,\s*0(?:\.0*)?\s*\)",
    re.IGNORECASE,
)


def fills_absence(expr: str) -> bool:
    """Whether a query turns no data into a number (``or vector(0)`` and the like, or ``absent()``)."""
    after_or = [expr[m.end() :] for m in _OR.finditer(expr)]
    return any(_CONSTANT.search(rhs) for rhs in after_or) or "absent(" in expr


@pytest.mark.parametrize(
    ("expr", "fills"),
    [
        ("sum(x) or vector(0)", True),
        ("sum(x)\nor\nvector(0)", True),
        ("sum(x) or on() vector(0)", True),
        ("sum(x) or on (cluster) vector(0)", True),
        ("sum(x) or ignoring(job) (vector(1))", True),
        ("sum(x) or (count(up) * 0)", True),
        ("sum(x) or on() up * 0", True),
        ("x or (group(y) - 1)", True),
        ("sum(x) OR vector(0)", True),
        ("x or y * 0.0", True),
        ("x or 0 * y", True),
        ("x or clamp_max(y, 0)", True),
        ("x * 0.05 or y", False),
        ("x or y * 0.5", False),
        ("x or y * 10", False),
        ("absent(x)", True),
        ("sum(x) or sum(y)", False),
        ("x or on (gpu) max by (gpu) (y)", False),
        ("x * 0.5 or y", False),
        ("(x >= bool 0.8) * 0.5", False),
        ("gpu:a or on (c, hostname) gpu:b", False),
    ],
)
def test_the_absence_check_tells_a_fill_in_from_a_join(expr: str, fills: bool) -> None:
    assert fills_absence(expr) is fills


def test_no_query_turns_missing_data_into_zero() -> None:
    """Absent, never 0, on every dashboard: no `or vector(0)`, `or on() vector(0)` or other `or` that
    makes a number where there is no data; only the rules strip says 0 (rules missing) on purpose."""
    checked = set()
    for name, model in _committed().items():
        for title, expr in panel_queries(model):
            if title != RULES_STRIP:
                assert not fills_absence(expr), f"{name} / {title}: {expr}"
                checked.add(name)
    assert checked == set(_committed())


def test_every_panel_names_the_grafana_version_of_its_options() -> None:
    """Grafana runs a panel's migration whenever pluginVersion differs from its own; the XY chart's
    (grafana/grafana public/app/plugins/panel/xychart/migrations.ts) rewrites options when it is empty
    or below 11.1, which would wrap our 11.1-form matchers again."""
    for name, model in _committed().items():
        for panel in model["panels"]:
            if panel["type"] == "row":
                continue
            expected = grafana.PLUGIN_VERSIONS.get(panel["type"], grafana.PLUGIN_VERSION)
            assert panel["pluginVersion"] == expected, f"{name} / {panel['title']}"
            if panel["type"] == "xychart":
                assert float(".".join(panel["pluginVersion"].split(".")[:2])) >= 11.1
                assert panel["options"]["mapping"] == "auto" and "seriesMapping" not in panel["options"]
                for series in panel["options"]["series"]:
                    assert set(series["x"]["matcher"]) == {"id", "options"}


def test_every_dashboard_has_the_cluster_variable_and_the_rules_strip() -> None:
    for name, model in _committed().items():
        cluster = _variables(model)["cluster"]
        assert cluster["includeAll"] and cluster["allValue"] == ".*", name  # matches an empty label too
        strips = [p for p in model["panels"] if p["type"] == "stat" and p["title"] == "Recording rules"]
        assert len(strips) == 1 and strips[0]["gridPos"]["y"] <= 1, name
        for title, expr in panel_queries(model):
            if "gpu_info" in expr or "gpu:" in expr or "cluster:" in expr:
                assert '$cluster"' in expr, f"{name} / {title}"


def test_lists_of_gpus_and_pods_are_bounded() -> None:
    """With All selected, panels that list GPUs or pods show the worst few, not thousands of rows. The
    waste dashboard's tables list every job (rows summed over a job's pods and GPUs): bounding each of
    their class columns by the Total's topk would integrate the range once more per column."""
    jobs = "sum by (cluster, namespace, owner_kind, owner_name"
    for name, model in _committed().items():
        for panel in model["panels"]:
            if panel["type"] not in ("table", "xychart", "bargauge") or name == "smlens-node.json":
                continue
            for target in panel["targets"]:
                expr = target["expr"]
                bounded = re.search(r"\b(topk|bottomk)\(\d+,", expr) or "namespace:" in expr
                every_job = name == "smlens-waste.json" and panel["type"] == "table" and jobs in expr
                assert bounded or every_job, f"{name} / {panel['title']}: {expr}"
