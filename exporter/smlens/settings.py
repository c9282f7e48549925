"""Settings of each command, from defaults < config file < environment (SMLENS_*) < flags.

Every option is one field of a frozen dataclass (:class:`SourceSettings`, :class:`ServeSettings`,
:class:`CheckSettings`, and :class:`ReportSettings`, which reads Prometheus, not a node); its metadata
holds the parser, the default (parsed like any other value), the help text and the group. The CLI flags,
the environment variables and the config-file keys are derived from those fields. :func:`resolve` parses
every value and checks every rule between values in one step, before the command touches NVML, a socket
or a thread; a bad value is one sentence that names where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from smlens import names as n
from smlens.attribution.devices import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCE_NAMES
from smlens.attribution.refresher import DEFAULT_INTERVAL, DEFAULT_TIMEOUT
from smlens.errors import ConfigError
from smlens.exposition.selection import DEFAULT, DEFAULT_GROUPS, Selection, parse_selection
from smlens.files import quote, read_yaml
from smlens.names import MAX_SIM_GPUS
from smlens.sources.registry import KINDS, SIM_GPUS, SIM_SEED, accepting
from smlens.timespec import parse_since, parse_time, since_seconds

DEFAULT_PORT = 10132
NOT_PAUSABLE = "--admin-token-file enables DCGM profiling pause/resume, but DCGM is not in use here."
LOG_LEVELS = ("debug", "info", "warning", "error")
CONFIG_ENV = "SMLENS_CONFIG"

Parser = Callable[[Any], Any]


def _number(kind: type[int] | type[float], low: float | None = None, high: float | None = None) -> Parser:
    noun = "a whole number" if kind is int else "a number"
    bounds = f"must be from {low} to {high}" if high is not None else f"must be at least {low}"

    def parse(raw: Any) -> Any:
        if isinstance(raw, bool) or (kind is int and isinstance(raw, float) and not raw.is_integer()):
            raise ValueError(f"must be {noun}")
        if isinstance(raw, str) and "_" in raw:  # float() and int() would take 1_0.5
            raise ValueError(f"must be {noun}")
        try:
            value = kind(raw.strip() if isinstance(raw, str) else raw)
        except OverflowError:  # float() of a whole number beyond float's range
            raise ValueError(bounds) from None
        except (TypeError, ValueError):
            raise ValueError(f"must be {noun}") from None
        if isinstance(value, float) and not math.isfinite(value):  # isfinite() of a huge int overflows
            raise ValueError("must be a finite number")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(bounds)
        return value

    return parse


def _choice(*choices: str) -> Parser:
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return raw

    return parse


def _text(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError("must be text (quote it in YAML)")
    if not raw.strip():
        raise ValueError("must be a non-empty string")
    if "\0" in raw:
        raise ValueError("must not contain a NUL character")
    return raw.strip()


def _path(raw: Any) -> Path:
    return Path(_text(raw))


def _names(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, (list, tuple)):
        items = [_text(item) for item in raw]
    elif isinstance(raw, str):
        items = [item.strip() for item in raw.split(",") if item.strip()]
    else:
        raise ValueError("must be a comma-separated list of names")
    if not items:
        raise ValueError("must list at least one name")
    return tuple(items)


def _verdicts(raw: Any) -> frozenset[str]:
    codes = {code.strip() for code in str(raw).split(",") if code.strip()}
    if codes == {"none"}:
        return frozenset()
    if not codes or not codes <= set(n.VERDICT_CODES):
        raise ValueError(f"must be a comma list of {', '.join(n.VERDICT_CODES)}, or none")
    return frozenset(codes)


def _flag(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _metrics(raw: Any) -> Selection:
    if isinstance(raw, (list, tuple)):
        raw = ",".join(_text(item) for item in raw)
    if not isinstance(raw, str):
        raise ValueError("must be a comma-separated list of metric groups")
    return parse_selection(raw)


def parse_listen(raw: Any) -> tuple[str, int]:
    text = _text(raw)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("must be HOST:PORT with a port from 0 (any free port) to 65535, e.g. 0.0.0.0:10132")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Option:
    """How one settings field is read: ``--name-with-dashes``, env ``SMLENS_NAME``, config key ``name``."""

    name: str
    parse: Parser
    default: Any  # raw, parsed like a given value; None: unset (``shown`` says what that means)
    help: str
    group: str
    metavar: str = ""
    shown: str = ""  # the default as --help words it, where the raw value does not say it
    choices: tuple[str, ...] = ()
    is_switch: bool = False

    def __post_init__(self) -> None:
        if not (self.metavar or self.choices or self.is_switch):
            raise TypeError(f"option {self.name} needs a metavar for --help")

    @property
    def flag(self) -> str:
        return flag_of(self.name)

    @property
    def env(self) -> str:
        return "SMLENS_" + self.name.upper()


def flag_of(name: str) -> str:
    """The command-line flag of a settings field."""
    return "--" + name.replace("_", "-")


def _either(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def option(
    parse: Parser,
    default: Any,
    help: str,
    group: str,
    *,
    metavar: str = "",
    shown: str = "",
    choices: tuple[str, ...] = (),
    switch: bool = False,
) -> Any:
    spec = dict(
        parse=parse, default=default, help=help, group=group, metavar=metavar, shown=shown, choices=choices
    )
    return field(metadata={"option": {**spec, "is_switch": switch}})


GENERAL, SOURCE, SIM, DCGM, SERVE, ATTRIBUTION, CHECK = (
    "general",
    "data source",
    "simulated node (--backend sim)",
    "DCGM, for GPUs without GPM (docs/dcgm.md)",
    "serving (TLS, auth and connections: docs/security.md)",
    "workload attribution (docs/attribution.md)",
    "check",
)


@dataclass(frozen=True, kw_only=True)
class SourceSettings:
    """Where the data comes from and how often: what both commands share."""

    backend: str = option(
        _choice(*KINDS),
        "auto",
        "; ".join(kind.describe() for kind in KINDS.values()),
        SOURCE,
        choices=tuple(KINDS),
    )
    interval: float = option(
        _number(float, 0.1, 60.0), 1.0, "sampling interval in seconds, 0.1-60", SOURCE, metavar="S"
    )
    hostname: str | None = option(
        _text, None, "value of the hostname label; the Helm chart passes the node name", SOURCE,
        metavar="NAME", shown="the OS hostname",
    )  # fmt: skip
    energy_interval: float = option(
        _number(float, 1.0, 3600.0),
        15.0,
        "seconds between reads of the energy and PCIe replay counters (slow calls)",
        SOURCE,
        metavar="S",
    )
    utilization_interval: float = option(
        _number(float, 0.1, 10.0),
        5.0,
        "seconds between reads of the driver's utilization samples (all samples count)",
        SOURCE,
        metavar="S",
    )
    thresholds: Path | None = option(
        _path, None, "YAML file overriding the shipped verdict thresholds", GENERAL, metavar="FILE"
    )
    log_level: str = option(_choice(*LOG_LEVELS), "info", "log level", GENERAL, choices=LOG_LEVELS)
    # Unset by default (the registry's SIM_GPUS and SIM_SEED apply), so that other backends can refuse them.
    sim_gpus: int | None = option(
        _number(int, 1, MAX_SIM_GPUS), None, f"number of simulated GPUs, 1-{MAX_SIM_GPUS}", SIM,
        metavar="N", shown=str(SIM_GPUS),
    )  # fmt: skip
    sim_seed: int | None = option(
        _number(int, 0), None, "seed of the simulated node's noise", SIM, metavar="N", shown=str(SIM_SEED)
    )
    sim_scenario: Path | None = option(
        _path,
        None,
        "YAML file of time-varying simulated GPU phases; overrides --sim-gpus",
        SIM,
        metavar="FILE",
    )
    dcgm_hostengine: str | None = option(
        _text, None, "nv-hostengine to use: HOST[:PORT] or unix:///path", DCGM,
        metavar="ADDR", shown="localhost:5555",
    )  # fmt: skip
    dcgm_embedded: bool = option(
        _flag,
        False,
        "start an embedded DCGM engine instead of using nv-hostengine (needs root; never on GPU "
        "Operator nodes)",
        DCGM,
        switch=True,
    )

    @property
    def node_name(self) -> str:
        return self.hostname or socket.gethostname()

    def check(self) -> None:
        """Rules between values; raises ConfigError with one sentence.

        An option that the chosen backend would ignore is refused rather than dropped silently; which
        backends take which options is the registry's to say (``BackendKind.options``).
        """
        if self.dcgm_embedded and self.dcgm_hostengine is not None:
            raise ConfigError("--dcgm-hostengine and --dcgm-embedded exclude each other; pass one of them.")
        for f in dataclasses.fields(self):
            kinds = accepting(f.name)
            value = getattr(self, f.name)
            if kinds is not None and self.backend not in kinds and value is not None and value is not False:
                raise ConfigError(f"{flag_of(f.name)} applies only to --backend {_either(kinds)}.")


@dataclass(frozen=True, kw_only=True)
class ServeSettings(SourceSettings):
    """``smlens serve``."""

    listen: tuple[str, int] = option(
        parse_listen,
        f"0.0.0.0:{DEFAULT_PORT}",
        "address to serve on (port 0: any free port)",
        SERVE,
        metavar="HOST:PORT",
    )
    admin_token_file: Path | None = option(
        _path,
        None,
        "file of a bearer token (16+ characters) for /admin/profiling/pause and /resume (DCGM)",
        SERVE,
        metavar="FILE",
        shown="off",
    )
    metrics: Selection = option(
        _metrics,
        DEFAULT,
        "metric groups to export (docs/metrics.md), or all; -GROUP leaves one out",
        SERVE,
        metavar="GROUPS",
        shown=",".join(DEFAULT_GROUPS),
    )
    web_config_file: Path | None = option(
        _path,
        None,
        "TLS, basic auth and headers (exporter-toolkit's web config format)",
        SERVE,
        metavar="FILE",
    )
    web_header_timeout: float = option(
        _number(float, 1.0, 300.0),
        10.0,
        "seconds to send a request's headers",
        SERVE,
        metavar="S",
    )
    web_idle_timeout: float = option(
        _number(float, 1.0, 3600.0),
        60.0,
        "seconds an idle connection stays open",
        SERVE,
        metavar="S",
    )
    web_max_connections: int = option(
        _number(int, 4, 10000),
        64,
        "most open connections; one client address may hold an eighth (at least 4), "
        "a new one replaces the least useful",
        SERVE,
        metavar="N",
    )
    web_protect_probes: bool = option(
        _flag,
        False,
        "basic auth on /-/healthy, /-/ready too",
        SERVE,
        switch=True,
    )
    pod_resources_socket: Path | None = option(
        _path,
        None,
        "kubelet PodResources socket for pod labels (with --backend sim, it replaces the sim pod layout)",
        ATTRIBUTION,
        metavar="PATH",
        shown="/var/lib/kubelet/pod-resources/kubelet.sock if present",
    )
    attribution_interval: float = option(
        _number(float, 0.2, 3600.0),
        DEFAULT_INTERVAL,
        "seconds between attribution refreshes (kubelet, NVML process lists)",
        ATTRIBUTION,
        metavar="S",
    )
    attribution_timeout: float = option(
        _number(float, 0.1, 60.0),
        DEFAULT_TIMEOUT,
        "seconds the kubelet may take to answer before pod labels are dropped",
        ATTRIBUTION,
        metavar="S",
    )
    gpu_resource_names: tuple[str, ...] = option(
        _names,
        ",".join(DEFAULT_RESOURCE_NAMES),
        "device plugin resources whose devices are GPUs, comma-separated, globs allowed",
        ATTRIBUTION,
        metavar="NAMES",
    )
    gpu_dra_drivers: tuple[str, ...] = option(
        _names,
        ",".join(DEFAULT_DRA_DRIVERS),
        "DRA drivers whose claimed devices are GPUs, comma-separated",
        ATTRIBUTION,
        metavar="NAMES",
    )
    no_workload_labels: bool = option(
        _flag,
        False,
        "no namespace/pod/container labels on the series of a GPU that one container holds",
        ATTRIBUTION,
        switch=True,
    )
    sim_pods: Path | None = option(
        _path, None, "YAML pod layout of the simulated node", SIM, metavar="FILE", shown="a built-in one"
    )
    process_attribution: bool = option(
        _flag,
        False,
        "per-workload GPU memory and utilization from NVML process lists (needs hostPID)",
        ATTRIBUTION,
        switch=True,
    )

    def check(self) -> None:
        super().check()
        if self.attribution_timeout >= self.attribution_interval:
            raise ConfigError(
                f"--attribution-timeout ({self.attribution_timeout:g} s) must be shorter than "
                f"--attribution-interval ({self.attribution_interval:g} s)."
            )
        if self.admin_token_file is not None and not KINDS[self.backend].pausable:
            raise ConfigError(NOT_PAUSABLE)
        if self.process_attribution and not KINDS[self.backend].reads_nvml:
            raise ConfigError(
                "--process-attribution reads NVML's process lists and needs --backend nvml or auto."
            )


@dataclass(frozen=True, kw_only=True)
class CheckSettings(SourceSettings):
    """``smlens check``."""

    duration: float = option(
        _number(float, 0.5, 600.0), 3.0, "seconds to sample, 0.5-600", CHECK, metavar="S"
    )
    json: bool = option(_flag, False, "print JSON instead of a table", CHECK, switch=True)
    fail_on: frozenset[str] = option(
        _verdicts,
        n.VERDICT_HOLLOW,
        f"exit 3 when a GPU's verdict is one of these, comma-separated: {', '.join(n.VERDICT_CODES)}; "
        "or none",
        CHECK,
        metavar="VERDICTS",
    )
    # A table for a person or a script: the sampler's INFO lines would only be noise there.
    log_level: str = option(_choice(*LOG_LEVELS), "warning", "log level", GENERAL, choices=LOG_LEVELS)


def _url(raw: Any) -> str:
    text = _text(raw)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError("must be an http:// or https:// URL without a query, e.g. http://prometheus:9090")
    return text.rstrip("/")


def _since(raw: Any) -> str:
    return parse_since(_text(raw))


def _time(raw: Any) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):  # a unix time in a YAML config file
        raw = repr(raw)
    return parse_time(_text(raw))


# `smlens report`'s rows and formats.
GROUPINGS = ("job", "namespace", "cluster")
FORMATS = ("table", "csv", "json", "markdown")
REPORT, CONNECTION = "report", "Prometheus connection (auth and TLS as Prometheus' own clients take them)"


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """``smlens report``: reads Prometheus, not a node; none of the data source options apply."""

    prometheus: str | None = option(
        _url, None, "the Prometheus to read (required), e.g. http://prometheus:9090", REPORT, metavar="URL"
    )
    since: str = option(
        _since,
        "7d",
        "start of the range: a duration back from --until (Prometheus syntax: 7d, 12h, 1h30m), or a time",
        REPORT,
        metavar="WHEN",
    )
    until: float | None = option(
        _time, None, "end of the range: RFC 3339 or unix time", REPORT, metavar="TIME", shown="now"
    )
    by: str = option(
        _choice(*GROUPINGS),
        "job",
        "a row per job (cluster, namespace, owner kind and name), namespace or cluster; rows sorted by "
        f"wasted GPU-hours: {n.WASTED_WORDS}",
        REPORT,
        choices=GROUPINGS,
    )
    format: str = option(
        _choice(*FORMATS),
        "table",
        "aligned text, CSV with a header, a JSON list of objects, or a Markdown table",
        REPORT,
        choices=FORMATS,
    )
    thresholds: Path | None = option(
        _path,
        None,
        "YAML file overriding the shipped thresholds: its prices give the cost, cluster_label the cluster",
        GENERAL,
        metavar="FILE",
    )
    timeout: float = option(
        _number(float, 1.0, 3600.0), 120.0, "seconds each request to Prometheus may take", CONNECTION,
        metavar="S",
    )  # fmt: skip
    bearer_token_file: Path | None = option(
        _path, None, "file of a bearer token to send", CONNECTION, metavar="FILE"
    )
    basic_auth_user: str | None = option(
        _text, None, "basic auth user name; needs --basic-auth-password-file", CONNECTION, metavar="NAME"
    )
    basic_auth_password_file: Path | None = option(
        _path, None, "file of the basic auth password", CONNECTION, metavar="FILE"
    )
    ca_file: Path | None = option(
        _path, None, "CA certificates (PEM) to verify Prometheus' certificate with", CONNECTION,
        metavar="FILE", shown="the system's",
    )  # fmt: skip
    cert_file: Path | None = option(
        _path, None, "client certificate (PEM) for TLS client auth, with --key-file", CONNECTION,
        metavar="FILE",
    )  # fmt: skip
    key_file: Path | None = option(_path, None, "key (PEM) of --cert-file", CONNECTION, metavar="FILE")
    insecure_skip_verify: bool = option(
        _flag, False, "do not verify Prometheus' certificate", CONNECTION, switch=True
    )
    server_name: str | None = option(
        _text, None, "name to send (SNI) and to verify Prometheus' certificate against", CONNECTION,
        metavar="NAME", shown="the URL's host",
    )  # fmt: skip
    log_level: str = option(_choice(*LOG_LEVELS), "warning", "log level", GENERAL, choices=LOG_LEVELS)

    def window(self, now: float) -> tuple[float, float]:
        """The range, as unix times (start, end)."""
        end = now if self.until is None else self.until
        return since_seconds(self.since, end), end

    def check(self) -> None:
        if self.prometheus is None:
            raise ConfigError(
                "smlens report needs --prometheus URL (or SMLENS_PROMETHEUS): the Prometheus to read."
            )
        if (self.basic_auth_user is None) != (self.basic_auth_password_file is None):
            raise ConfigError("--basic-auth-user and --basic-auth-password-file go together; pass both.")
        if self.bearer_token_file is not None and self.basic_auth_user is not None:
            raise ConfigError("--bearer-token-file and basic auth exclude each other; pass one of them.")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("--cert-file and --key-file go together; pass both.")
        if self.insecure_skip_verify and self.ca_file is not None:
            raise ConfigError("--insecure-skip-verify and --ca-file exclude each other; pass one of them.")
        tls = [flag_of(name) for name in ("ca_file", "cert_file", "server_name") if getattr(self, name)]
        tls += ["--insecure-skip-verify"] if self.insecure_skip_verify else []
        if tls and not self.prometheus.startswith("https://"):
            raise ConfigError(f"{tls[0]} applies to an https:// --prometheus URL only.")
        now = time.time()
        start, end = self.window(now)
        if self.until is not None and self.until > now + 60:
            raise ConfigError(f"--until {self.until:.0f} is in the future; the range must end by now.")
        if start >= end:
            raise ConfigError("--since must be before --until: the range would be empty.")


COMMANDS: Mapping[str, type[SourceSettings]] = {"serve": ServeSettings, "check": CheckSettings}
# Every command whose settings come from flags, the environment and a config file: the node's commands,
# and report, which reads Prometheus.
ALL_COMMANDS: Mapping[str, type[SourceSettings | ReportSettings]] = {**COMMANDS, "report": ReportSettings}


def options(command: str) -> Iterator[Option]:
    for f in dataclasses.fields(ALL_COMMANDS[command]):
        yield Option(name=f.name, **f.metadata["option"])


def _all_names() -> set[str]:
    return {o.name for command in ALL_COMMANDS for o in options(command)}


def _shown_default(o: Option) -> str:
    if o.shown:
        return o.shown
    if o.default is None or o.is_switch:
        return ""
    return f"{o.default:g}" if isinstance(o.default, float) else str(o.default)


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The command's flags, in groups; each help line ends with its default (once) and env name."""
    parser.add_argument(
        "--config", metavar="FILE", help=f"YAML file of options, keys as the flag names (env {CONFIG_ENV})"
    )
    groups: dict[str, Any] = {GENERAL: parser.add_argument_group(GENERAL)}  # first, whatever the field order
    for o in options(command):
        group = groups.get(o.group) or groups.setdefault(o.group, parser.add_argument_group(o.group))
        default = _shown_default(o)
        where = f"default {default}; env {o.env}" if default else f"env {o.env}"
        if o.is_switch:
            group.add_argument(
                o.flag, action="store_const", const=True, default=None, help=f"{o.help} ({where})"
            )
        else:
            metavar = "{" + ",".join(o.choices) + "}" if o.choices else o.metavar
            group.add_argument(o.flag, default=None, metavar=metavar, help=f"{o.help} ({where})")


def _read_config_file(path: Path) -> dict[str, Any]:
    raw = read_yaml(path, "config file")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of option to value.")
    known = _all_names()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path}: unknown option {quote(str(key))}.")
        if name in values:
            raise ConfigError(
                f"config file {path}: option {quote(name)} is given twice (- and _ spell it alike)."
            )
        values[name] = value
    return values


@overload
def resolve(
    command: Literal["serve"], flags: Mapping[str, Any], environ: Mapping[str, str] = ...
) -> ServeSettings: ...
@overload
def resolve(
    command: Literal["check"], flags: Mapping[str, Any], environ: Mapping[str, str] = ...
) -> CheckSettings: ...
@overload
def resolve(
    command: Literal["report"], flags: Mapping[str, Any], environ: Mapping[str, str] = ...
) -> ReportSettings: ...
@overload
def resolve(
    command: str, flags: Mapping[str, Any], environ: Mapping[str, str] = ...
) -> SourceSettings | ReportSettings: ...
def resolve(
    command: str, flags: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> SourceSettings | ReportSettings:
    """The settings of ``command``: every value parsed and every rule between values checked."""
    config_raw = flags.get("config") or environ.get(CONFIG_ENV)
    config_path = _config_path(config_raw) if config_raw else None
    from_file = _read_config_file(config_path) if config_path else {}
    values: dict[str, Any] = {}
    for o in options(command):
        raw, origin = o.default, "the default"
        if from_file.get(o.name) is not None:  # a key without a value leaves the option unset
            raw, origin = from_file[o.name], f"config file {config_path} option {o.name!r}"
        if o.env in environ:
            raw, origin = environ[o.env], f"environment variable {o.env}"
        if flags.get(o.name) is not None:
            raw, origin = flags[o.name], o.flag
        if raw is None:
            values[o.name] = None
            continue
        try:
            values[o.name] = o.parse(raw)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConfigError(f"{origin}: {quote(raw)} {exc}.") from None
    settings = ALL_COMMANDS[command](**values)
    settings.check()
    return settings


def _config_path(raw: str) -> Path:
    try:
        return _path(raw)
    except ValueError as exc:
        raise ConfigError(f"--config / {CONFIG_ENV}: {quote(raw)} {exc}.") from None
