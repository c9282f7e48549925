"""Load the thresholds: the shipped ``thresholds.yaml`` under a user's overrides.

The shipped file is the one place a threshold's value is written, with the reason for it beside it; the
rules, the dashboards and the Helm chart are generated from it. :class:`Thresholds` therefore has no
defaults: every instance comes from :func:`load` (or from another instance, ``with_overrides``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
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


_CURRENCY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,15}$")


@dataclass(frozen=True)
class Prices:
    """What a GPU-hour costs, by GPU model, and an hour of a MIG instance by ``"<model>/<profile>"``
    where that is not its share of the GPU's SMs at the GPU's price. Empty: no money anywhere."""

    currency: str
    gpu_hour: Mapping[str, float]
    mig_instance_hour: Mapping[str, float]

    def __bool__(self) -> bool:
        return bool(self.gpu_hour or self.mig_instance_hour)

    def as_dict(self) -> dict[str, Any]:
        return {
            "currency": self.currency,
            "gpu_hour": dict(self.gpu_hour),
            "mig_instance_hour": dict(self.mig_instance_hour),
        }


def _prices(raw: Any, origin: str) -> Prices:
    where = f"{origin}: prices"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with currency, gpu_hour and mig_instance_hour.")
    unknown = sorted(set(raw) - {"currency", "gpu_hour", "mig_instance_hour"}, key=str)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {quote(unknown[0])}; known: currency, gpu_hour, mig_instance_hour."
        )
    currency = raw.get("currency", "USD")
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        raise ConfigError(f"{where}: currency must be a short name such as USD, got {quote(currency)}.")
    tables: dict[str, Mapping[str, float]] = {}
    for table in ("gpu_hour", "mig_instance_hour"):
        entries = raw.get(table) or {}
        if not isinstance(entries, dict):
            raise ConfigError(f"{where}.{table} must be a mapping of name to price, got {quote(entries)}.")
        checked: dict[str, float] = {}
        for name, price in entries.items():
            if not isinstance(name, str) or not name.strip() or '"' in name or "\\" in name:
                raise ConfigError(f"{where}.{table}: {quote(name)} is not a GPU model name.")
            if table == "mig_instance_hour" and name.count("/") != 1:
                raise ConfigError(
                    f"{where}.mig_instance_hour: {quote(name)} must be written <model>/<MIG profile>, "
                    'e.g. "NVIDIA H200/1g.18gb".'
                )
            if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price < 1e9:
                raise ConfigError(
                    f"{where}.{table}: the price of {quote(name)} must be a number >= 0, got {quote(price)}."
                )
            checked[name] = float(price)
        tables[table] = MappingProxyType(checked)
    return Prices(currency, tables["gpu_hour"], tables["mig_instance_hour"])


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
    slow_rank_for: str
    allocated_idle_for: str
    profiling_unavailable_for: str
    exporter_down_for: str
    thermal_slowdown_for: str
    hardware_error_for: str
    exporter_job: str
    cluster_label: str
    runbook_base_url: str
    prices: Prices

    def as_dict(self) -> dict[str, Any]:
        """As the thresholds file writes them."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "prices": self.prices.as_dict()}

    def with_overrides(self, overrides: dict[str, Any], origin: str) -> Thresholds:
        return _build({**self.as_dict(), **overrides}, origin)


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
        if name == "prices":
            values[name] = _prices(value, origin)
        elif names[name].type == "float":
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
