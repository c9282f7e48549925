"""Every generated file of the bundle, by folder: what `python -m smlens.bundle` writes and the Helm
chart copies (tools/helm_sync.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from smlens.bundle import alertmanager, dashboards, dcgm_exporter, rules
from smlens.verdicts.thresholds import Thresholds


def rule_files(t: Thresholds) -> dict[str, str]:
    """smlens' recording and alerting rules, and the dcgm-exporter mapping."""
    return {**rules.rule_files(t), **dcgm_exporter.rule_files(t)}


GENERATORS: Mapping[str, Callable[[Thresholds], dict[str, str]]] = {
    "rules": rule_files,
    "dashboards": dashboards.dashboard_files,
    "alertmanager": alertmanager.route_files,
}
