"""The kinds of panel the dashboards are made of, over the Grafana builder (smlens.bundle.grafana):
their options, and one builder each. Nothing here writes PromQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from smlens.bundle.grafana import Panel, Query

Steps = Sequence[tuple[float | None, str]]

STAT_OPTIONS = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "value",
    "graphMode": "area",
    "justifyMode": "auto",
    "orientation": "auto",
    "textMode": "auto",
}
NAME_STAT_OPTIONS = {**STAT_OPTIONS, "graphMode": "none", "textMode": "name", "colorMode": "none"}
CHECK_OPTIONS = {**STAT_OPTIONS, "graphMode": "none", "textMode": "value", "colorMode": "background"}
SERIES_OPTIONS = {
    "legend": {
        "showLegend": True,
        "displayMode": "table",
        "placement": "right",
        "calcs": ["mean", "lastNotNull"],
    },
    "tooltip": {"mode": "multi", "sort": "desc"},
}
LINES = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never", "spanNulls": False}
BARGAUGE_OPTIONS = {
    "orientation": "horizontal",
    "displayMode": "gradient",
    "showUnfilled": True,
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
}
TIMELINE_OPTIONS = {
    "showValue": "never",
    "mergeValues": True,
    "alignValue": "left",
    "rowHeight": 0.9,
    "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom"},
    "tooltip": {"mode": "single", "sort": "none"},
}


def series(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str = "none",
    width: int = 12,
    height: int = 8,
    ratio: bool = False,
    no_value: str = "",
) -> Panel:
    """A time series of lines, with a legend table of their means and last values; ``no_value`` is
    what it says where there is no data at all."""
    return Panel(
        "timeseries",
        title,
        description,
        queries,
        unit=unit,
        width=width,
        height=height,
        ratio=ratio,
        options=SERIES_OPTIONS,
        custom=LINES,
        no_value=no_value,
    )


def ratio_series(title: str, description: str, queries: Sequence[Query], width: int = 12) -> Panel:
    """A time series of 0..1 values."""
    return series(title, description, queries, width=width, ratio=True)


def stat(
    title: str,
    description: str,
    expr: str,
    ratio: bool = False,
    steps: Steps = (),
    no_value: str = "",
    min_interval: str = "",
) -> Panel:
    """One number: the value of ``expr`` now; ``min_interval``: the least $__interval."""
    return Panel(
        "stat",
        title,
        description,
        [Query(expr, instant=True)],
        width=4,
        height=4,
        ratio=ratio,
        steps=steps,
        options=STAT_OPTIONS,
        no_value=no_value,
        min_interval=min_interval,
    )


def name_stat(title: str, description: str, query: Query, width: int) -> Panel:
    """One text: the legend of ``query``'s series now (labels shown as a name)."""
    return Panel("stat", title, description, [query], width=width, height=4, options=NAME_STAT_OPTIONS)


def bargauge(
    title: str,
    description: str,
    expr: str,
    legend: str,
    unit: str = "none",
    ratio: bool = False,
    min_interval: str = "",
    no_value: str = "",
) -> Panel:
    """Horizontal bars, one per series of ``expr`` now; ``min_interval``: the least $__interval."""
    return Panel(
        "bargauge",
        title,
        description,
        [Query(expr, legend, instant=True)],
        unit=unit,
        ratio=ratio,
        options=BARGAUGE_OPTIONS,
        min_interval=min_interval,
        no_value=no_value,
    )


def joined(columns: Sequence[str]) -> list[dict[str, Any]]:
    """Transformations that join instant table queries into one row per label set: the metric name,
    which differs between queries, and the timestamp go first, then the value columns get names."""
    return [
        {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}},
        {"id": "merge", "options": {}},
        {
            "id": "organize",
            "options": {"renameByName": {f"Value #{chr(65 + i)}": name for i, name in enumerate(columns)}},
        },
    ]


def table(
    title: str,
    description: str,
    key: tuple[str, str],
    columns: Sequence[tuple[str, str]],
    width: int = 24,
    sort_by: str | None = None,
    on: str | None = None,
    overrides: Sequence[Mapping[str, Any]] = (),
    no_value: str = "",
    every_row: bool = False,
    min_interval: str = "",
) -> Panel:
    """One row per series of the ``key`` column (name, expression); every other column is an expression
    restricted to those rows (matched on all labels, or ``on`` these). Sorted by ``sort_by``, the key
    column by default. ``every_row``: the columns are not restricted to the key's rows (each answers
    for every row it has), so that the key is evaluated once, not once per column. ``min_interval``: the
    least $__interval."""
    key_name, key_expr = key
    matching = f"and on ({on})" if on else "and"
    queries = [Query(key_expr, instant=True)]
    queries += [
        Query(expr if every_row else f"{expr}\n{matching}\n{key_expr}", instant=True) for _, expr in columns
    ]
    names = [key_name, *(name for name, _ in columns)]
    return Panel(
        "table",
        title,
        description,
        queries,
        ratio=True,
        width=width,
        height=10,
        options={
            "showHeader": True,
            "cellHeight": "sm",
            "sortBy": [{"displayName": sort_by or key_name, "desc": True}],
        },
        overrides=overrides,
        transformations=joined(names),
        no_value=no_value,
        min_interval=min_interval,
    )


def scatter(
    title: str, description: str, x: Query, y: Query, axes: tuple[str, str] = ("Utilization", "SM active")
) -> Panel:
    """One ratio (x) against another (y), a point per row of the two joined queries; ``axes`` names
    them."""
    x_name, y_name = axes
    return Panel(
        "xychart",
        title,
        description,
        [x, y],
        ratio=True,
        options={
            "mapping": "auto",
            "series": [
                {
                    "x": {"matcher": {"id": "byName", "options": x_name}},
                    "y": {"matcher": {"id": "byName", "options": y_name}},
                }
            ],
            "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "single", "sort": "none"},
        },
        custom={"show": "points", "pointSize": {"fixed": 8}, "pointShape": "circle"},
        transformations=joined(axes),
    )
