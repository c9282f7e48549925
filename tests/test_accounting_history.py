"""The accounting rules and the Waste and cost dashboard on a known history (tests/accounting_history.py):
the per-owner layer's expression is evaluated once a minute over four backfilled hours, as its rule
group would have written it (``promtool tsdb create-blocks-from rules`` does not give the same samples
twice), and the dashboard's GPU-hours per job and class are compared with
what the exporter counted, second by second.

Prometheus 2.42 takes the per-second rates from ``rate()`` over the rule window, which extrapolates at
the edges of each series' life: this test measures how far that lands from the truth, and holds the
bundle to the bound docs/accounting.md gives.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from accounting_history import SCRAPE, History, backfill, copy_blocks, recent, serve
from promstack import panel_queries, require_any, substitute
from smlens import names as n
from smlens.bundle import accounting, rules
from smlens.bundle.dashboards import waste
from smlens.verdicts import thresholds

T = thresholds.load()
W = T.window
OWNER = accounting.name("owner", accounting.SECONDS, W)
JOB = ("cluster", "namespace", "owner_kind", "owner_name", "verdict")
# Per incarnation of a series, what the rate windows may be off by at its ends.
PER_INCARNATION = SCRAPE


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[History, str]]:
    """The history, and a Prometheus serving it with the owner layer recorded over it: the rule's
    expression evaluated once a minute, as a rule group running every minute writes it."""
    promtool = require_any("promtool")
    workdir = tmp_path_factory.mktemp("history")
    history = recent()
    backfill(history, workdir / "raw", workdir)
    (expr,) = [
        rule["expr"]
        for group in yaml.safe_load(rules.rule_files(T)[rules.ACCOUNTING_FILE])["groups"]
        for rule in group["rules"]
        if rule.get("record") == OWNER
    ]
    with serve(workdir / "first", workdir / "raw") as url:
        params = {"query": expr, "start": history.start, "end": history.end, "step": 60}
        answer = httpx.get(f"{url}/api/v1/query_range", params=params, timeout=300).json()
    assert answer["status"] == "success", answer
    om = workdir / "recorded.om"
    with om.open("w") as out:
        out.write(f"# TYPE {OWNER} gauge\n")
        for series in answer["data"]["result"]:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(series["metric"].items()))
            out.writelines(f"{OWNER}{{{labels}}} {value} {at}\n" for at, value in series["values"])
        out.write("# EOF\n")
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(workdir / "recorded")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = workdir / "both"
    copy_blocks(workdir / "raw", data)
    copy_blocks(workdir / "recorded", data)
    with serve(workdir / "second", data) as url:
        yield history, url


def _query(url: str, expr: str, at: float) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=60).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _row(series: dict[str, Any], labels: tuple[str, ...]) -> tuple[str, ...]:
    """A table row's key, its owner labels as the history writes them (empty where no workload)."""
    values = (series["metric"].get(k, "") for k in labels)
    return tuple("" if value == waste.NO_OWNER else value for value in values)


def _panel(title: str) -> list[str]:
    model = json.loads((Path(__file__).parent.parent / "dashboards" / "smlens-waste.json").read_text())
    return [e for t, e in panel_queries(model) if t == title]


@pytest.mark.parametrize("hours", [1, 2, 3])
def test_the_dashboards_gpu_hours_per_job_and_class_are_the_truth_within_the_bound(
    recorded: tuple[History, str], hours: int
) -> None:
    """Each class column of the job table, and its Total, as the dashboard sends them."""
    history, url = recorded
    # The subquery samples the window means at whole windows of the clock: a dashboard opened at any
    # other moment (this one, a second past) reads the range up to the last whole window. Prometheus 2
    # would take a sample at an aligned range's start as well (its ranges are closed on the left).
    end = history.end - 600  # the last rule window of the history is full
    start = end - hours * 3600
    asked = end + 1
    builtins = {"__range": f"{hours}h", "__interval": W, "__interval_ms": "600000", "__rate_interval": "1m"}
    total, *columns = _panel("GPU-hours per job")
    column_of = {}  # each class, the column (its classes, "|"-joined) that sums it
    found: dict[tuple[str, ...], float] = {}
    for expr in columns:
        (classes,) = re.findall(r'verdict=~?"([\w|]+)"', expr)
        column_of.update(dict.fromkeys(classes.split("|"), classes))
        answered = _query(url, substitute(expr, {"cluster": ".*", "namespace": ".*"}, builtins), asked)
        for s in answered:
            # Grafana's merge matches rows on the labels every frame has: each row carries all of them.
            assert set(JOB[:-1]) <= set(s["metric"]), s["metric"]
            found[(*_row(s, JOB[:-1]), classes)] = float(s["value"][1]) * 3600
    assert set(column_of) == set(n.VERDICT_CODES)
    # A class a job had before the range reads 0 in it: rows of no time are no time.
    found = {k: v for k, v in found.items() if v > 0}
    truth: dict[tuple[str, ...], float] = {}
    bound: dict[tuple[str, ...], float] = {}
    for key, seconds in history.gpu_seconds(start, end, JOB).items():
        column = (*key[:-1], column_of[key[-1]])
        truth[column] = truth.get(column, 0.0) + seconds
    for key, seconds in history.tolerance(start, end, JOB).items():
        column = (*key[:-1], column_of[key[-1]])
        bound[column] = bound.get(column, 0.0) + seconds * PER_INCARNATION / SCRAPE
    assert set(found) == {k for k, v in truth.items() if v > 0}
    worst = max(abs(found.get(k, 0.0) - truth[k]) for k in truth)
    print(f"{hours} h: largest miss {worst:.1f} GPU-s per job and class of {sum(truth.values()):,.0f}")
    off = {k: (found[k], truth[k], bound[k]) for k in truth if abs(found.get(k, 0.0) - truth[k]) > bound[k]}
    assert not off, off
    answered = _query(url, substitute(total, {"cluster": ".*", "namespace": ".*"}, builtins), asked)
    totals = {_row(s, JOB[:-1]): float(s["value"][1]) * 3600 for s in answered}
    assert {job for job, seconds in totals.items() if seconds > 0} == {k[:-1] for k in found}
    for job, seconds in totals.items():
        classes = sum(v for k, v in found.items() if k[:-1] == job)
        assert seconds == pytest.approx(classes, abs=1e-6), job


def test_cost_panels_say_so_without_a_price_table(recorded: tuple[History, str]) -> None:
    history, url = recorded
    assert _query(url, accounting.PRICE, history.end) == []
    model = json.loads((Path(__file__).parent.parent / "dashboards" / "smlens-waste.json").read_text())
    costs = [
        p
        for p in model["panels"]
        if p["title"].startswith("Cost per") or p["title"].startswith("Top wasters: money")
    ]
    assert len(costs) == 3
    for panel in costs:
        assert "no price table" in panel["fieldConfig"]["defaults"]["noValue"]
