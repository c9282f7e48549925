"""The parts of `smlens report` that need no Prometheus: times and durations, the retention a
Prometheus' flags give, and the rows: GPU-hours of MIG instances, prices, waste, notes."""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType

import pytest

from conftest import run_cli
from smlens import names as n
from smlens.report.command import retention
from smlens.report.ledger import Spent
from smlens.report.render import build, render_markdown, render_table
from smlens.settings import ReportSettings, options, resolve
from smlens.timespec import duration, parse_duration, parse_time, rfc3339, since_seconds
from smlens.verdicts.thresholds import Prices


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("1h30m", 5400), ("90s", 90), ("1w2d", 777600), ("1y", 31536000), ("250ms", 0.25)],
)
def test_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "1.5h", "30m1h", "0s", "-1h", "1 h"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2025-05-01T00:00:00Z", 1746057600.0),
        ("2025-05-01T02:00:00+02:00", 1746057600.0),
        ("2025-05-01t00:00:00.5z", 1746057600.5),
        ("2025-05-01T00:00:00.123456789Z", 1746057600.123456),
        ("1746057600", 1746057600.0),
        ("1746057600.25", 1746057600.25),
    ],
)
def test_rfc3339_and_unix_times(text: str, at: float) -> None:
    assert math.isclose(parse_time(text), at, abs_tol=1e-6)


@pytest.mark.parametrize("text", ["2025-05-01", "2025-05-01T00:00:00", "2025-13-01T00:00:00Z", "now", "-5"])
def test_what_is_not_a_time(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


def test_since_is_a_duration_back_or_a_time() -> None:
    assert since_seconds("1h", 7200.0) == 3600.0
    assert since_seconds("1970-01-01T00:10:00Z", 7200.0) == 600.0
    assert rfc3339(1746057600.0) == "2025-05-01T00:00:00Z" and rfc3339(1746057600.25).endswith(".250Z")
    assert duration(93784.5) == "1d2h3m4s500ms" and duration(0) == "0s"


@pytest.mark.parametrize(
    ("flags", "seconds"),
    [
        ({"storage.tsdb.retention.time": "10d", "storage.tsdb.retention.size": "0B"}, 864000.0),
        ({"storage.tsdb.retention.time": "0s", "storage.tsdb.retention.size": "0B"}, 15 * 86400.0),
        ({"storage.tsdb.retention.time": "0s", "storage.tsdb.retention": "30d"}, 30 * 86400.0),
        ({"storage.tsdb.retention.time": "0s", "storage.tsdb.retention.size": "512GB"}, None),
        ({}, None),  # not a Prometheus that tells (Thanos, Mimir...)
    ],
)
def test_retention_from_the_flags(flags: dict[str, str], seconds: float | None) -> None:
    assert retention(flags) == seconds


def _spent(verdict: str, seconds: float, owner: tuple[str, str], **labels: str) -> Spent:
    base = {key: "" for key in ("cluster", *n.VERDICT_SECONDS_LABELS)}
    base.update({"cluster": "c", n.HOSTNAME: "h", n.UUID: "GPU-1", n.GPU: "0", n.VERDICT: verdict})
    base.update(labels)
    return Spent(base, {owner: seconds})


GPU = ("c", "h", "GPU-1")
MIG = {n.GPU_INSTANCE: "1", n.MIG_PROFILE: "1g.18gb"}
POD = (n.OWNER_KIND_POD, "p")


def test_mig_hours_prices_waste_and_notes() -> None:
    spent = [
        _spent(n.VERDICT_COMPUTE_BOUND, 7200, POD),  # 2 GPU-hours at 3/h
        _spent(n.VERDICT_HOLLOW, 3600, POD, **MIG),  # 1 instance-hour at 0.5/h, a quarter GPU-hour
        _spent(n.VERDICT_IDLE, 3600, ("", "")),  # idle nobody held: not waste
        _spent(n.VERDICT_IDLE, 1800, POD),  # idle held: waste
        _spent(n.VERDICT_STALLED, 3600, POD, **{n.UUID: "GPU-2"}),  # a model without a price
        _spent(n.VERDICT_HOLLOW, 3600, POD, **{n.GPU_INSTANCE: "2", n.MIG_PROFILE: "2g.35gb"}),  # no share
    ]
    prices = Prices("EUR", MappingProxyType({"H200": 3.0}), MappingProxyType({"H200/1g.18gb": 0.5}))
    models = {GPU: "H200", ("c", "h", "GPU-2"): "B200"}
    shares = {(*GPU, "1", "1g.18gb"): 0.25}
    report = build(spent, "cluster", "job", 0.0, 86400.0, prices, models, shares)
    pod, nobody = report.rows
    assert pod.labels == ("c", "", n.OWNER_KIND_POD, "p") and nobody.labels == ("c", "", "", "")
    assert pod.seconds == {
        n.VERDICT_COMPUTE_BOUND: 7200,
        n.VERDICT_HOLLOW: 900,
        n.VERDICT_IDLE: 1800,
        n.VERDICT_STALLED: 3600,
    }
    assert pod.wasted == 900 + 1800 + 3600 and nobody.wasted == 0
    assert pod.cost == {n.VERDICT_COMPUTE_BOUND: 6.0, n.VERDICT_HOLLOW: 0.5, n.VERDICT_IDLE: 1.5}
    assert pod.unpriced == 3600
    assert report.classes == [n.VERDICT_IDLE, n.VERDICT_HOLLOW, n.VERDICT_STALLED, n.VERDICT_COMPUTE_BOUND]
    unpriced, no_share = report.notes
    assert unpriced.startswith("No price for B200 (1.00 GPU-hours): their seconds have no cost")
    assert no_share == (
        "Left out, without gpu_mig_sm_share_ratio to make GPU-hours of their hours: h GPU GPU-1 instance 2 "
        "(2g.35gb, 1.00 instance-hours)."
    )
    table = render_table(report)
    assert "hollow EUR" in table and "total EUR" in table and "unpriced" in table
    assert render_markdown(report).splitlines()[3].startswith("| cluster | namespace | owner kind | owner |")


def test_without_prices_there_is_no_money() -> None:
    report = build(
        [_spent(n.VERDICT_HOLLOW, 3600, POD)],
        "cluster",
        "cluster",
        0.0,
        3600.0,
        Prices("USD", {}, {}),
        {},
        {},
    )
    assert report.currency is None and report.notes == [] and report.rows[0].cost == {}
    assert "USD" not in render_table(report)


def test_options_come_from_flags_the_environment_and_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "report.yaml"
    config.write_text("prometheus: https://prometheus.example:9090/\nby: namespace\nuntil: 1746057600\n")
    settings = resolve(
        "report",
        {"config": str(config), "format": "csv"},
        environ={"SMLENS_SINCE": "1d", "SMLENS_SERVER_NAME": "prom.internal"},
    )
    assert isinstance(settings, ReportSettings)
    assert settings.prometheus == "https://prometheus.example:9090"  # the trailing slash goes
    assert (settings.by, settings.format, settings.since, settings.until) == (
        "namespace",
        "csv",
        "1d",
        1746057600.0,
    )
    assert settings.server_name == "prom.internal" and settings.timeout == 120.0
    assert settings.window(0.0) == (1746057600.0 - 86400, 1746057600.0)


def test_help_names_every_option_and_the_waste_and_fits_a_terminal() -> None:
    result = run_cli("report", "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert max(map(len, result.stdout.splitlines())) <= 80
    text = " ".join(result.stdout.split())
    for option in options("report"):
        assert f"{option.flag} " in text and f"env {option.env})" in text, option.flag
    assert f"rows sorted by wasted GPU-hours: {n.WASTED_WORDS}" in text
