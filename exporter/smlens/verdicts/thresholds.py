"""Load the thresholds: the shipped ``thresholds.yaml`` under a user's overrides.

The shipped file is the one place a threshold's value is written, with the reason for it beside it; the
rules, the dashboards and the Helm chart are generated from it. :class:`Thresholds` therefore has no
defaults: every instance comes from :func:`load` (or from another instance, ``with_overrides``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlens.errors import ConfigError
from smlens.files import quote, read_yaml

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_URL = re.compile(r"^https?://\S+$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# A path, not importlib.resources (whose import would stay resident in serve): smlens is never imported
# from a zip.
SHIPPED = Path(__file__).parent / "thresholds.yaml"


def _is_regex(value: str) -> bool:
    if not value:
        return False
    try:
        re.compile(value)
    except (re.error, OverflowError, RecursionError):
        return False
    return True


# Fields that are neither ratios nor durations: how to check them and what they must be.
_TEXT_FIELDS: dict[str, tuple[Callable[[str], bool], str]] = {
    "exporter_job": (_is_regex, "a regular expression for the Prometheus job label of smlens targets"),
    "runbook_base_url": (lambda value: bool(_URL.match(value)), "an http(s) URL without spaces"),
    "cluster_label": (lambda value: bool(_LABEL_NAME.match(value)), "a Prometheus label name"),
}


@dataclass(frozen=True)
class Thresholds:
    """Every threshold, checked; the values are the shipped file's unless a user's file overrides them."""

    busy_utilization: float
    hollow_sm_active: float
    idle_utilization: float
    working_sm_active: float
    low_occupancy: float
    tensor_busy: float
    memory_bound_dram: float
    compute_bound_pipe: float
    window: str
    evaluation_interval: str
    hollow_for: str
    low_occupancy_for: str
    stalled_for: str
    allocated_idle_for: str
    profiling_unavailable_for: str
    exporter_down_for: str
    thermal_slowdown_for: str
    hardware_error_for: str
    exporter_job: str
    cluster_label: str
    runbook_base_url: str

    def with_overrides(self, overrides: dict[str, Any], origin: str) -> Thresholds:
        return _build({**dataclasses.asdict(self), **overrides}, origin)


def _build(raw: Any, origin: str) -> Thresholds:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: thresholds must be a mapping of name to value.")
    names = {f.name: f for f in dataclasses.fields(Thresholds)}
    unknown = sorted(set(raw) - set(names), key=str)
    if unknown:
        raise ConfigError(f"{origin}: unknown threshold {quote(unknown[0])}; known: {', '.join(names)}.")
    missing = sorted(set(names) - set(raw))
    if missing:
        raise ConfigError(f"{origin}: threshold {missing[0]!r} is missing.")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if names[name].type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(
                    f"{origin}: threshold {name!r} must be a ratio from 0 to 1, got {quote(value)}."
                )
            values[name] = float(value)
        elif name in _TEXT_FIELDS:
            check, expected = _TEXT_FIELDS[name]
            if not isinstance(value, str) or not check(value):
                raise ConfigError(f"{origin}: threshold {name!r} must be {expected}, got {quote(value)}.")
            values[name] = value
        else:
            if not isinstance(value, str) or not _DURATION.match(value):
                raise ConfigError(
                    f"{origin}: threshold {name!r} must be a Prometheus duration such as 15m, "
                    f"got {quote(value)}."
                )
            values[name] = value
    return Thresholds(**values)


def load(path: Path | None = None) -> Thresholds:
    """The shipped thresholds, with the keys of the YAML file at ``path`` (if any) overriding them."""
    base = _build(read_yaml(SHIPPED, "shipped thresholds file"), "shipped thresholds.yaml")
    if path is None:
        return base
    overrides = read_yaml(path, "thresholds file")
    if overrides is None:
        return base
    if not isinstance(overrides, dict):
        raise ConfigError(f"{path}: thresholds must be a mapping of name to value.")
    return base.with_overrides(overrides, str(path))
