"""`smlens report` against a real Prometheus serving a known history (tests/accounting_history.py):
GPU-hours per verdict class and owner within one scrape interval per series of what the exporter
counted, for several ranges and groupings; the cost of a price table; the four formats."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting_history import A100, CLUSTER, H200, History, served
from conftest import REPO, run_cli
from smlens import names as n

GROUPS = {
    "job": (CLUSTER, n.NAMESPACE, n.OWNER_KIND, n.OWNER_NAME),
    "namespace": (CLUSTER, n.NAMESPACE),
    "cluster": (CLUSTER,),
}
PRICES = {"currency": "EUR", "gpu_hour": {H200: 4.0}, "mig_instance_hour": {f"{H200}/1g.18gb": 0.9}}
EPSILON = 1e-3  # GPU-seconds: the JSON's rounding to a millionth of an hour (0.0036 s) is below it


@dataclass(frozen=True)
class Stack:
    history: History
    url: str
    data: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The history, ending an hour or two before now, in a Prometheus that keeps 10 days."""
    with served(tmp_path_factory.mktemp("report"), ["--storage.tsdb.retention.time=10d"]) as served_stack:
        yield Stack(*served_stack)


def report(url: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    """The JSON rows of `smlens report` and its stderr."""
    result = run_cli("report", "--prometheus", url, "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows, result.stderr


def by_cell(rows: list[dict[str, Any]], by: str) -> dict[tuple[str, ...], float]:
    """GPU-seconds per (grouping labels..., verdict) of the report's rows."""
    cells = {}
    for row in rows:
        labels = tuple(row[label] for label in GROUPS[by])
        for verdict, hours in row["gpu_hours"].items():
            cells[(*labels, verdict)] = hours * 3600
    return cells


def assert_within(
    got: Mapping[tuple[str, ...], float],
    truth: Mapping[tuple[str, ...], float],
    tolerance: Mapping[tuple[str, ...], float],
) -> None:
    """Every cell of the truth is in the report within its tolerance, and the report has no other
    cell beyond its tolerance (a class without seconds in a row is 0 there)."""
    for key in sorted(set(got) | set(truth)):
        allowed = tolerance.get(key, 0.0) + EPSILON
        assert abs(got.get(key, 0.0) - truth.get(key, 0.0)) <= allowed, (
            key,
            got.get(key, 0.0),
            truth.get(key, 0.0),
            allowed,
        )


def ranges(history: History) -> dict[str, tuple[float, float]]:
    start, h = history.start, 3600
    return {
        # Whole and inner ranges; the inner ones not on a scrape and crossing node-b's restart (2h10m),
        # GPU 0's compute_bound series going stale (1h05m) and coming back from 0 (2h30m).
        "whole": (start, history.end),
        "inner": (start + 37 * 60 + 7, start + 3 * h + 11 * 60 + 3),
        # Shorter than a chunk, over the restart.
        "short": (start + 2 * h + 5 * 60 + 1, start + 2 * h + 20 * 60),
        # From before the history began, so that every series is first seen inside the range.
        "before": (start - 2 * h, start + 90 * 60 + 9),
    }


@pytest.mark.parametrize("name", ["whole", "inner", "short", "before"])
def test_gpu_hours_per_job_and_class_are_the_truth_within_a_scrape_interval_per_series(
    stack: Stack, name: str
) -> None:
    start, end = ranges(stack.history)[name]
    rows, stderr = report(stack.url, "--since", f"{start:.3f}", "--until", f"{end:.3f}")
    keys = (*GROUPS["job"], n.VERDICT)
    truth = stack.history.gpu_seconds(start, end, keys)
    assert_within(by_cell(rows, "job"), truth, stack.history.tolerance(start, end, keys))
    for row in rows:
        assert math.isclose(row["gpu_hours_total"], sum(row["gpu_hours"].values()), abs_tol=1e-5)
        assert "cost" not in row and "currency" not in row  # no prices: no money
    assert stderr == ""


def test_owners_are_resolved_through_kube_state_metrics_or_fall_back(stack: Stack) -> None:
    """A ReplicaSet's pod to its Deployment (per cluster), a Job's to its JobSet, a Job without owner
    and a StatefulSet's pod as they are, a pod kube-state-metrics does not know to itself, a Slurm job,
    and no workload."""
    rows, _ = report(stack.url, "--since", str(stack.history.start), "--until", str(stack.history.end))
    owners = {(r[CLUSTER], r[n.NAMESPACE], r[n.OWNER_KIND], r[n.OWNER_NAME]) for r in rows}
    assert owners == {
        ("east", "serving", "Deployment", "infer"),
        ("east", "research", "JobSet", "train"),
        ("east", "research", "Job", "eval"),
        ("east", "lab", "StatefulSet", "notebook"),
        ("east", "research", n.OWNER_KIND_POD, "debug-shell"),
        ("east", "", "", ""),
        ("west", "serving", "Deployment", "infer"),
        ("west", "", n.OWNER_KIND_SLURM_JOB, "4242"),
        ("west", "", n.OWNER_KIND_SLURM_JOB, "4243"),
    }


def test_the_default_range_is_the_last_7_days(stack: Stack) -> None:
    rows, _ = report(stack.url)
    keys = (*GROUPS["job"], n.VERDICT)
    history = stack.history
    assert_within(
        by_cell(rows, "job"),
        history.gpu_seconds(history.start - 3600, history.end, keys),
        history.tolerance(history.start - 3600, history.end, keys),
    )


@pytest.mark.parametrize("by", ["namespace", "cluster"])
def test_namespace_and_cluster_rows_are_the_truth_too(stack: Stack, by: str) -> None:
    start, end = ranges(stack.history)["inner"]
    rows, _ = report(stack.url, "--since", str(start), "--until", str(end), "--by", by)
    assert all(set(row) >= set(GROUPS[by]) and n.OWNER_KIND not in row for row in rows)
    keys = (*GROUPS[by], n.VERDICT)
    truth = stack.history.gpu_seconds(start, end, keys)
    assert_within(by_cell(rows, by), truth, stack.history.tolerance(start, end, keys))


def test_rows_are_sorted_by_wasted_gpu_hours(stack: Stack) -> None:
    rows, _ = report(stack.url, "--since", "6h")
    wasted = [row["gpu_hours_wasted"] for row in rows]
    assert wasted == sorted(wasted, reverse=True) and wasted[0] > 0
    for row in rows:
        held = row[n.OWNER_KIND] != ""
        classes = [*n.WASTED_VERDICTS, *(n.WASTED_WHEN_HELD if held else ())]
        expected = sum(row["gpu_hours"].get(c, 0.0) for c in classes)
        assert math.isclose(row["gpu_hours_wasted"], expected, abs_tol=1e-5), row
    # Only classes that occurred are columns: nothing was unknown, down or without profiling.
    assert set(rows[0]["gpu_hours"]) == {
        n.VERDICT_IDLE,
        n.VERDICT_IDLE_MEMORY_HELD,
        n.VERDICT_HOLLOW,
        n.VERDICT_STALLED,
        n.VERDICT_MEMORY_BOUND,
        n.VERDICT_COMPUTE_BOUND,
        n.VERDICT_PARTIAL,
    }


def test_cost_of_a_price_table_and_a_note_naming_the_unpriced_model(stack: Stack, tmp_path: Path) -> None:
    """H200 GPU-hours at 4 EUR, an hour of a 1g.18gb instance at 0.9 EUR (not its share of 4 EUR), the
    3g.71gb instance at its share of the GPU's price; no price for the A100: no cost for it, said so."""
    overrides = tmp_path / "thresholds.yaml"
    overrides.write_text(yaml.safe_dump({"prices": PRICES}))
    start, end = ranges(stack.history)["inner"]
    rows, stderr = report(
        stack.url, "--since", str(start), "--until", str(end), "--thresholds", str(overrides)
    )
    keys = (*GROUPS["job"], n.VERDICT)
    history = stack.history
    cost = history.cost(start, end, keys, PRICES["gpu_hour"], PRICES["mig_instance_hour"])
    # A scrape interval of seconds is at most a scrape interval of the dearest second (4 EUR/h).
    tolerance = {key: value * 4.0 / 3600 for key, value in history.tolerance(start, end, keys).items()}
    got = {
        (*(row[label] for label in GROUPS["job"]), verdict): money
        for row in rows
        for verdict, money in row["cost"].items()
        if money is not None
    }
    assert_within(got, cost, tolerance)
    assert cost[("east", "research", "Job", "eval", n.VERDICT_STALLED)] > 0  # the 1g.18gb instance
    for row in rows:
        assert row["currency"] == "EUR"
        if row[CLUSTER] == "west":  # all A100: no money at all, not 0
            assert row["cost_total"] is None and set(row["cost"].values()) == {None}
            assert math.isclose(row["unpriced_gpu_hours"], row["gpu_hours_total"], abs_tol=1e-5), row
        else:
            assert math.isclose(row["cost_total"], sum(row["cost"].values()), abs_tol=1e-5)
            assert row["unpriced_gpu_hours"] == 0.0
    assert A100 in stderr and "no cost" in stderr and H200 not in stderr


def run_format(url: str, fmt: str, *args: str) -> str:
    result = run_cli("report", "--prometheus", url, "--since", "6h", "--format", fmt, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_csv_table_and_markdown_carry_the_json_numbers(stack: Stack, tmp_path: Path) -> None:
    overrides = tmp_path / "thresholds.yaml"
    overrides.write_text(yaml.safe_dump({"prices": PRICES}))
    rows = json.loads(run_format(stack.url, "json", "--thresholds", str(overrides)))
    classes = list(rows[0]["gpu_hours"])

    parsed = list(csv.DictReader(io.StringIO(run_format(stack.url, "csv", "--thresholds", str(overrides)))))
    assert len(parsed) == len(rows)
    for line, row in zip(parsed, rows, strict=True):
        assert [line[label] for label in GROUPS["job"]] == [row[label] for label in GROUPS["job"]]
        for c in classes:
            assert float(line[f"gpu_hours_{c}"]) == pytest.approx(row["gpu_hours"][c], abs=1e-6)
            money = row["cost"][c]
            if money is None:
                assert line[f"cost_{c}"] == ""
            else:
                assert float(line[f"cost_{c}"]) == pytest.approx(money, abs=1e-6)
        assert float(line["gpu_hours_wasted"]) == pytest.approx(row["gpu_hours_wasted"], abs=1e-6)
        assert line["currency"] == "EUR"

    table = run_format(stack.url, "table", "--thresholds", str(overrides)).splitlines()
    assert table[0].startswith("GPU-hours by verdict class, ") and "cost in EUR" in table[0]
    header, rule = table[3], table[4]
    assert header.split()[:6] == ["cluster", "namespace", "owner", "kind", "owner", classes[0]]
    assert "total EUR" in header and "unpriced" in header and set(rule) == {"-", " "}
    body = table[5 : 5 + len(rows)]
    assert [line.split()[3] for line in body] == [row[n.OWNER_NAME] or "-" for row in rows]
    for line, row in zip(body, rows, strict=True):
        assert f"{row['gpu_hours_total']:.2f}" in line.split()
    assert any(A100 in line for line in table[5 + len(rows) :])  # the note, below the table

    markdown = run_format(stack.url, "markdown", "--thresholds", str(overrides)).splitlines()
    assert markdown[3].startswith("| cluster | namespace | owner kind | owner |")
    assert markdown[4] == "|---|---|---|---|" + "---:|" * (markdown[3].count("|") - 5)
    cells = [line.strip("|").split(" | ") for line in markdown[5 : 5 + len(rows)]]
    assert [[c.strip() for c in line[:4]] for line in cells] == [
        [row[label] or "-" for label in GROUPS["job"]] for row in rows
    ]


def test_without_prices_no_format_has_money(stack: Stack) -> None:
    for fmt in ("table", "markdown", "csv"):
        text = run_format(stack.url, fmt)
        assert "cost" not in text and "USD" not in text and "unpriced" not in text, fmt


def test_serve_does_not_import_the_report_client() -> None:
    """httpx is the report's alone: the exporter's command line and app load without it."""
    code = (
        "import sys\n"
        "from smlens import cli\n"
        "from smlens.settings import resolve\n"
        "import smlens.web.app, smlens.pipeline.build\n"
        "cli._parser()\n"
        "resolve('serve', {'backend': 'sim'}, environ={})\n"
        "assert 'httpx' not in sys.modules and 'smlens.report.client' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )
    assert result.returncode == 0, result.stderr
