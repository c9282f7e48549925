"""A small typed builder for classic Grafana dashboard JSON (the model with ``panels``).

It writes ``schemaVersion`` 39 (Grafana 10.4 and later migrate it forward on import) and only what
the panels use. Every query goes to the dashboard's ``datasource`` variable, so the files import into
any Grafana without ``__inputs`` mapping. Every panel names the Grafana version its options were
written for (``pluginVersion``): Grafana runs a panel's migration when that differs from its own, and
an empty one makes the XY chart rewrap options already in its 11.1 form (docs/monitoring.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 39
# The Grafana version whose option format each panel type's options follow: the oldest the
# dashboards support (10.4 LTS), except the XY chart, whose options changed in 11.1 and which
# migrates any pluginVersion below 11.1 from the old format (grafana/grafana
# public/app/plugins/panel/xychart/migrations.ts).
PLUGIN_VERSION = "10.4.0"
PLUGIN_VERSIONS: Mapping[str, str] = {"xychart": "11.1.0"}
GRID_WIDTH = 24
DATASOURCE: Mapping[str, str] = {"type": "prometheus", "uid": "${datasource}"}
TAG = "smlens"

JSON = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One PromQL target. ``instant`` queries evaluate once at the end of the range (tables, stats)."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    kind: str  # Grafana panel type: timeseries, stat, table, bargauge, xychart, state-timeline
    title: str
    description: str
    queries: Sequence[Query]
    unit: str = "none"
    width: int = 12
    height: int = 8
    ratio: bool = False  # a 0..1 value: percent unit, axis from 0 to 1
    steps: Sequence[tuple[float | None, str]] = ()  # threshold colours, the first from -inf (None)
    options: Mapping[str, Any] = field(default_factory=dict)
    custom: Mapping[str, Any] = field(default_factory=dict)  # fieldConfig.defaults.custom
    overrides: Sequence[Mapping[str, Any]] = ()  # fieldConfig.overrides: per-field settings
    mappings: Sequence[Mapping[str, Any]] = ()  # fieldConfig.defaults.mappings: value to text
    no_value: str = ""  # fieldConfig.defaults.noValue: what the panel says when the query is empty
    transformations: Sequence[Mapping[str, Any]] = ()
    min_interval: str = ""  # the panel's "Min interval": the least $__interval Grafana gives its queries


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[Panel]


@dataclass(frozen=True)
class Variable:
    """A query variable over label values; ``query`` is a ``label_values(...)`` expression."""

    name: str
    label: str
    query: str
    multi: bool = False  # several values and an All option, which matches any value, empty included
    # Without an All option, Grafana opens the dashboard on the first value (in sort order): for a
    # variable whose All would make the default view read every series of a large fleet.
    offers_all: bool = True
    sort: int = 3  # Grafana's: 3 numerical, 5 alphabetical (case-insensitive), ascending


def _target(query: Query, ref: str, table: bool) -> JSON:
    target: JSON = {
        "refId": ref,
        "datasource": dict(DATASOURCE),
        "editorMode": "code",
        "expr": query.expr,
        "legendFormat": query.legend or "__auto",
        "range": not query.instant,
        "instant": query.instant,
    }
    if table:
        target["format"] = "table"
    return target


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> JSON:
    chosen = steps or ((None, "green"),)
    return {"mode": "absolute", "steps": [{"color": colour, "value": value} for value, colour in chosen]}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> JSON:
    defaults: JSON = {"unit": "percentunit" if panel.ratio else panel.unit}
    if panel.ratio:
        defaults.update(min=0, max=1)
    defaults["thresholds"] = _thresholds(panel.steps)
    if panel.steps:
        defaults["color"] = {"mode": "thresholds"}
    if panel.custom:
        defaults["custom"] = dict(panel.custom)
    if panel.no_value:
        defaults["noValue"] = panel.no_value
    if panel.mappings:
        defaults["mappings"] = [dict(m) for m in panel.mappings]
    refs = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    table = panel.kind in ("table", "xychart")
    out: JSON = {
        "id": panel_id,
        "type": panel.kind,
        "pluginVersion": PLUGIN_VERSIONS.get(panel.kind, PLUGIN_VERSION),
        "title": panel.title,
        "description": panel.description,
        "datasource": dict(DATASOURCE),
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": [dict(o) for o in panel.overrides]},
        "options": dict(panel.options),
        "targets": [_target(query, refs[i], table) for i, query in enumerate(panel.queries)],
    }
    if panel.transformations:
        out["transformations"] = [dict(t) for t in panel.transformations]
    if panel.min_interval:
        out["interval"] = panel.min_interval
    return out


def _layout(rows: Sequence[Row]) -> list[JSON]:
    """Row headers across the grid; panels fill each line left to right and wrap at the grid width."""
    panels: list[JSON] = []
    y = 0
    for row in rows:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def _datasource_variable() -> JSON:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def _query_variable(variable: Variable) -> JSON:
    return {
        "type": "query",
        "name": variable.name,
        "label": variable.label,
        "datasource": dict(DATASOURCE),
        "definition": variable.query,
        "query": {
            "qryType": 1,
            "query": variable.query,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        },
        "current": {},
        "hide": 0,
        "includeAll": variable.multi and variable.offers_all,
        "allValue": ".*" if variable.multi and variable.offers_all else None,
        "multi": variable.multi,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": variable.sort,
    }


def dashboard(
    uid: str, title: str, description: str, variables: Sequence[Variable], rows: Sequence[Row]
) -> JSON:
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": description,
        "tags": [TAG],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "smlens dashboards",
                "type": "dashboards",
                "tags": [TAG],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": [_datasource_variable(), *(_query_variable(v) for v in variables)]},
        "panels": _layout(rows),
    }


def render(model: JSON) -> str:
    return json.dumps(model, indent=2, ensure_ascii=False) + "\n"
