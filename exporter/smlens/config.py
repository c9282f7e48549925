"""Settings from defaults < config file < environment (SMLENS_*) < flags, all checked in one place.

Every option is declared once in :data:`OPTIONS`; the CLI flags, the environment variables and the
config-file keys are derived from that table.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlens.attribution.devices import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCE_NAMES
from smlens.attribution.refresher import DEFAULT_INTERVAL, DEFAULT_TIMEOUT
from smlens.errors import ConfigError
from smlens.yamlfile import read_yaml

DEFAULT_PORT = 10132

Parser = Callable[[Any], Any]


def _number(kind: type, low: float | None = None, high: float | None = None) -> Parser:
    def parse(raw: Any) -> Any:
        noun = "a whole number" if kind is int else "a number"
        if isinstance(raw, bool):
            raise ValueError(f"must be {noun}")
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"must be {noun}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bounds}")
        return value

    return parse


def _choice(*choices: str) -> Parser:
    def parse(raw: Any) -> str:
        if raw not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(raw)

    return parse


def _text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("must be a non-empty string")
    return raw.strip()


def _path(raw: Any) -> Path:
    return Path(_text(raw))


def _names(raw: Any) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else str(raw).split(",")
    names = tuple(str(item).strip() for item in items if str(item).strip())
    if not names:
        raise ValueError("must list at least one name")
    return names


def _flag(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def parse_listen(raw: Any) -> tuple[str, int]:
    text = _text(raw)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be HOST:PORT with a port from 1 to 65535, e.g. 0.0.0.0:10132")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Option:
    name: str  # attribute name; flag is --name-with-dashes, env SMLENS_NAME
    parse: Parser
    default: Any
    help: str
    commands: tuple[str, ...] = ("serve", "check")
    is_switch: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "backend",
        _choice("auto", "nvml", "dcgm", "sim"),
        "auto",
        "data source: auto (NVML, plus GPM where supported, else DCGM when reachable), nvml (no "
        "profiling metrics), dcgm (NVML plus DCGM profiling, no GPM) or sim",
    ),
    Option("listen", parse_listen, f"0.0.0.0:{DEFAULT_PORT}", "HOST:PORT to serve on", ("serve",)),
    Option("interval", _number(float, 0.1, 60.0), 1.0, "sampling interval in seconds (0.1-60)"),
    Option(
        "hostname",
        _text,
        None,
        "node name for the hostname label (the Helm chart sets it from spec.nodeName); "
        "default: the OS hostname",
    ),
    Option(
        "energy_interval",
        _number(float, 1.0, 3600.0),
        15.0,
        "seconds between reads of the energy counter (one read costs ~4 ms per GPU)",
    ),
    Option(
        "utilization_interval",
        _number(float, 0.1, 10.0),
        5.0,
        "seconds between reads of the driver's utilization samples (one read costs ~2 ms per GPU; each "
        "read integrates every sample since the last, so the counters stay exact)",
    ),
    Option("sim_gpus", _number(int, 1, 64), 8, "number of simulated GPUs (--backend sim)"),
    Option("sim_seed", _number(int, 0), 0, "seed of the simulated node's noise"),
    Option("sim_scenario", _path, None, "YAML file of time-varying simulated GPU phases"),
    Option("thresholds", _path, None, "YAML file overriding the shipped verdict thresholds"),
    Option("log_level", _choice("debug", "info", "warning", "error"), "info", "log level"),
    # DCGM profiling for GPUs without GPM (docs/dcgm.md).
    Option(
        "dcgm_hostengine",
        _text,
        None,
        "nv-hostengine to use: HOST[:PORT] or unix:///path (default localhost:5555)",
    ),
    Option(
        "dcgm_embedded",
        _flag,
        False,
        "start an embedded DCGM engine instead of using nv-hostengine (needs root; never on a GPU "
        "Operator node, whose hostengine holds the profiling lock)",
        is_switch=True,
    ),
    Option(
        "admin_token_file",
        _path,
        None,
        "file holding a bearer token (16+ characters) that enables /admin/profiling/pause and /resume "
        "for DCGM; off without it",
        ("serve",),
    ),
    # Workload attribution (docs/attribution.md).
    Option(
        "pod_resources_socket",
        _path,
        None,
        "kubelet PodResources socket for pod labels; default: /var/lib/kubelet/pod-resources/kubelet.sock "
        "if that directory exists (with --backend sim only when given: it replaces the sim pod layout)",
        ("serve",),
    ),
    Option(
        "attribution_interval",
        _number(float, 0.2, 3600.0),
        DEFAULT_INTERVAL,
        "seconds between attribution refreshes (kubelet, NVML process lists), off the scrape path",
        ("serve",),
    ),
    Option(
        "attribution_timeout",
        _number(float, 0.1, 60.0),
        DEFAULT_TIMEOUT,
        "seconds the kubelet may take to answer before pod labels are dropped as down",
        ("serve",),
    ),
    Option(
        "gpu_resource_names",
        _names,
        DEFAULT_RESOURCE_NAMES,
        "comma-separated device plugin resource names (globs allowed) whose devices are GPUs",
        ("serve",),
    ),
    Option(
        "gpu_dra_drivers",
        _names,
        DEFAULT_DRA_DRIVERS,
        "comma-separated DRA driver names whose claimed devices are GPUs",
        ("serve",),
    ),
    Option(
        "no_workload_labels",
        _flag,
        False,
        "do not add namespace/pod/container to the series of a GPU that one container holds",
        ("serve",),
        is_switch=True,
    ),
    Option(
        "sim_pods", _path, None, "YAML pod layout for --backend sim (default: a built-in one)", ("serve",)
    ),
    Option(
        "process_attribution",
        _flag,
        False,
        "per-workload GPU memory and time-based utilization from NVML process lists (needs the host "
        "PID namespace: hostPID in Kubernetes)",
        ("serve",),
        is_switch=True,
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def node_name(self) -> str:
        return str(self.values["hostname"] or socket.gethostname())


def env_name(option: Option) -> str:
    return "SMLENS_" + option.name.upper()


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (env SMLENS_CONFIG)")
    for option in OPTIONS:
        if command not in option.commands:
            continue
        flag = "--" + option.name.replace("_", "-")
        if option.is_switch:
            parser.add_argument(
                flag,
                action="store_const",
                const=True,
                default=None,
                help=f"{option.help} (env {env_name(option)})",
            )
        else:
            parser.add_argument(
                flag,
                default=None,
                metavar=option.name.split("_")[-1].upper(),
                help=f"{option.help} (default {option.default}; env {env_name(option)})",
            )


def _read_config_file(path: Path) -> dict[str, Any]:
    raw = read_yaml(path, "config file")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of option to value.")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in _BY_NAME:
            raise ConfigError(f"config file {path}: unknown option {key!r}.")
        values[name] = value
    return values


def resolve(command: str, flags: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Settings:
    """Merge defaults, config file, environment and flags, validating every value."""
    config_path = flags.get("config") or environ.get("SMLENS_CONFIG")
    from_file = _read_config_file(Path(config_path)) if config_path else {}
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if command not in option.commands:
            continue
        raw, origin = option.default, None
        if option.name in from_file:
            raw, origin = from_file[option.name], f"config file option {option.name!r}"
        if env_name(option) in environ:
            raw, origin = environ[env_name(option)], f"environment variable {env_name(option)}"
        if flags.get(option.name) is not None:
            raw, origin = flags[option.name], "--" + option.name.replace("_", "-")
        if origin is None or raw is None:
            values[option.name] = raw
            continue
        try:
            values[option.name] = option.parse(raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{origin}: {raw!r} {exc}.") from None
    if command == "serve" and isinstance(values["listen"], str):
        values["listen"] = parse_listen(values["listen"])
    return Settings(values)
