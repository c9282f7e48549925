"""Real Prometheus and Alertmanager processes for the end-to-end tests, on loopback and random ports.

Both bind to 127.0.0.1 only, keep their data in a temporary directory and are stopped by the fixture
that started them. Rule files are generated into that directory through the thresholds file, the
way a user or the Helm chart overrides the shipped thresholds; shipped files are never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from conftest import REPO, free_port, missing_dependency, wait_ready

# Debian installs Alertmanager as prometheus-alertmanager.
ALERTMANAGER_NAMES = ("alertmanager", "prometheus-alertmanager")


def require_any(*names: str) -> str:
    """The first of these tools found; fails under CI (the test command installs it), skips elsewhere."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    missing_dependency(f"{' or '.join(names)} is not installed (the README's test command installs it)")
    raise AssertionError("unreachable")


def run_rules_generator(
    directory: Path, overrides: Mapping[str, Any], source: Path = REPO / "exporter"
) -> subprocess.CompletedProcess[str]:
    """``python -m smlens.bundle rules`` of the smlens at ``source``: its thresholds with ``overrides``,
    the rule files written into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    overrides_file = directory / "thresholds-overrides.yaml"
    overrides_file.write_text(yaml.safe_dump(dict(overrides)))
    argv = [sys.executable, "-m", "smlens.bundle", "rules", "--out", str(directory)]
    return subprocess.run(
        [*argv, "--thresholds", str(overrides_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(source)},
        timeout=300,
    )


def generate_rules(directory: Path, overrides: Mapping[str, Any]) -> list[Path]:
    """Rule files for the shipped thresholds with ``overrides``, written by ``python -m smlens.bundle``."""
    result = run_rules_generator(directory, overrides)
    assert result.returncode == 0, result.stderr
    return sorted(directory.glob("*.rules.yaml"))


class _Process:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


def every_second(rule_file: Path, workdir: Path) -> Path:
    """A copy of a rule file whose groups take the global evaluation interval."""
    groups = yaml.safe_load(rule_file.read_text())
    for group in groups["groups"]:
        group.pop("interval", None)
    copy = workdir / "rules" / rule_file.name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(yaml.safe_dump(groups, sort_keys=False))
    return copy


@contextmanager
def prometheus(
    workdir: Path,
    targets: Mapping[str, str],
    rule_files: list[Path],
    alertmanager: str | None = None,
    target_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[str]:
    """A Prometheus scraping ``targets`` (job name to host:port) and evaluating rules every second;
    ``target_labels`` (job name to labels) adds labels to a job's target, as a scrape's relabelling does.
    The rule files are loaded as they are, less their groups' own evaluation intervals: every group
    runs each second, so that a test sees a change in seconds rather than in a group's minute."""
    binary = require_any("prometheus")
    port = free_port()
    labels = target_labels or {}
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(every_second(p, workdir)) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target], "labels": dict(labels.get(job, {}))}]}
            for job, target in targets.items()
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    process = _Process(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        workdir / "prometheus.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/-/ready", process.process)
        yield base
    finally:
        process.stop()


@contextmanager
def alertmanager_with_webhook(
    workdir: Path,
    routes: list[dict[str, Any]] | None = None,
    inhibit_rules: list[dict[str, Any]] | None = None,
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An Alertmanager that sends every notification at once to a webhook in this process.

    ``routes`` go under the top route (whose receiver they inherit), ``inhibit_rules`` into the
    configuration's inhibit_rules. Yields the Alertmanager's
    host:port and the list the webhook appends each received payload to.
    """
    binary = require_any(*ALERTMANAGER_NAMES)
    received: list[dict[str, Any]] = []

    class Webhook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test reads the payloads, not a request log."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = free_port()
    config = {
        "route": {
            "receiver": "test",
            "group_by": ["alertname", "hostname", "gpu"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
            **({"routes": routes} if routes else {}),
        },
        **({"inhibit_rules": inhibit_rules} if inhibit_rules else {}),
        "receivers": [
            {
                "name": "test",
                "webhook_configs": [
                    {"url": f"http://127.0.0.1:{server.server_address[1]}/alerts", "send_resolved": False}
                ],
            }
        ],
    }
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(config))
    process = _Process(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        workdir / "alertmanager.log",
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/-/ready", process.process)
        yield f"127.0.0.1:{port}", received
    finally:
        process.stop()
        server.shutdown()
        server.server_close()


def query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query (now, or at unix time ``at``); a PromQL error fails loudly."""
    params: dict[str, str | float] = {"query": expr}
    if at is not None:
        params["time"] = at
    response = httpx.get(f"{base}/api/v1/query", params=params, timeout=10)
    body = response.json()
    if body.get("status") != "success":
        raise AssertionError(f"query failed: {expr}\n{body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def has_data_soon(base: str, expr: str, timeout: float = 20.0) -> bool:
    """Data now or within ``timeout``: layers built on rates of the layer below (namespace from pod from
    GPU) get their first samples an evaluation or two after the layer below."""
    deadline = time.monotonic() + timeout
    while not query(base, expr):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s")
        time.sleep(0.25)


# Grafana's global variables, with the values a dashboard on this test stack (1 s scrapes) would get.
GRAFANA_BUILTINS = {"__rate_interval": "5s", "__interval": "1s", "__interval_ms": "1000", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def substitute(expr: str, values: Mapping[str, str], builtins: Mapping[str, str] = GRAFANA_BUILTINS) -> str:
    """The query as Grafana sends it: every ``$name`` / ``${name}`` replaced; unknown names fail."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name not in values:
            raise KeyError(f"variable ${name} is not defined by the dashboard")
        return values[name]

    return _VARIABLE.sub(value, expr)
