"""The chart's monitors, applied by a real Prometheus to a real smlens exporter (sim backend).

Prometheus Operator turns a ServiceMonitor/PodMonitor endpoint into a scrape config whose relabelings
first label the target with the exporter pod's namespace, pod, container (and service, job, endpoint),
then apply the endpoint's own relabelings. This test rebuilds that chain as prometheus-operator v0.93.0
generates it (pkg/prometheus/promcfg.go), with static __meta_kubernetes_* labels standing in for
Kubernetes discovery, appends the relabelings the chart rendered, and checks what Prometheus stores: the
exporter's labels (the workload's namespace/pod/container included) arrive unchanged, the exporter pod
shows only as exporter_*, and the node is named. A second job without the chart's relabelings shows the
leak the chart prevents.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, ExporterFactory, free_port, require_tool, wait_ready
from helm_support import CHART_DIR, NAMESPACE, render
from test_dcgm_exporter_mapping import dcgm_exporter

EXPORTER_POD = {
    "__meta_kubernetes_namespace": NAMESPACE,
    "__meta_kubernetes_pod_name": "smlens-x7k2p",
    "__meta_kubernetes_pod_container_name": "smlens",
    "__meta_kubernetes_pod_node_name": "gpu-node-1",
    "__meta_kubernetes_service_name": "smlens",
}
SNAKE = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def operator_relabelings(kind: str, job: str) -> list[dict[str, Any]]:
    """The target labels prometheus-operator v0.93.0 sets before the endpoint's own relabelings."""
    rules: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": job},
        {"target_label": "endpoint", "replacement": "metrics"},
    ]
    if kind == "ServiceMonitor":
        rules.insert(1, {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"})
    return rules


def prometheus_rule(relabeling: dict[str, Any]) -> dict[str, Any]:
    """A RelabelConfig of the CRD as Prometheus' relabel_configs entry (as the operator writes it)."""
    rule = {SNAKE.get(key, key): value for key, value in relabeling.items()}
    if "action" in rule:
        rule["action"] = rule["action"].lower()
    return rule


def scrape_job(
    name: str, target: str, honor_labels: bool, relabelings: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "job_name": name,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "honor_labels": honor_labels,
        "static_configs": [{"targets": [target], "labels": EXPORTER_POD}],
        "relabel_configs": relabelings,
    }


class Prometheus:
    """A real Prometheus on a free loopback port, started once its config is written."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.config = directory / "prometheus.yml"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, config: dict[str, Any]) -> None:
        self.config.write_text(yaml.safe_dump(config))
        log = open(self.directory / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_ready(f"{self.url}/-/ready", self.process)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(require_tool("prometheus"), tmp_path)
    yield server
    if server.process is not None:
        server.process.terminate()
        server.process.wait(timeout=10)


def series(url: str, match: str, job: str) -> list[dict[str, str]]:
    """Label sets of the series Prometheus stored for ``match`` from ``job``, once the scrape landed."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/api/v1/series", params={"match[]": f'{match}{{job="{job}"}}'}, timeout=5)
        found: list[dict[str, str]] = response.json()["data"]
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"Prometheus stored no {match} series for job {job}")


def served_gpu_labels(exporter: str) -> list[dict[str, str]]:
    """Labels of the exporter's gpu_sm_active_ratio series, once its attribution has landed."""
    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(f"{exporter}/metrics", timeout=5).text
        served = [
            sample.labels
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "gpu_sm_active_ratio"
        ]
        if any("pod" in labels for labels in served) or time.monotonic() > deadline:
            return served
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("values", "kind"),
    [(None, "ServiceMonitor"), (CHART_DIR / "ci" / "podmonitor-values.yaml", "PodMonitor")],
)
def test_prometheus_stores_workload_labels_and_never_the_exporter_pods(
    values: Path | None, kind: str, prometheus: Prometheus, start_exporter: ExporterFactory
) -> None:
    exporter = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", "gpu-node-1")
    served = served_gpu_labels(exporter)
    attributed = [labels for labels in served if "pod" in labels]
    assert len(attributed) < len(served), "the sim must serve GPUs with and without a workload"

    monitor = render(values).one(kind)
    (endpoint,) = monitor["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    job = "smlens" if kind == "ServiceMonitor" else f"{NAMESPACE}/{monitor['metadata']['name']}"
    target = exporter.removeprefix("http://")
    chart = [prometheus_rule(r) for r in endpoint["relabelings"]]
    prometheus.start(
        {
            "scrape_configs": [
                scrape_job("chart", target, endpoint["honorLabels"], operator_relabelings(kind, job) + chart),
                scrape_job("baseline", target, True, operator_relabelings(kind, "baseline")),
            ]
        }
    )
    url = prometheus.url

    stored = {s["uuid"]: s for s in series(url, "gpu_sm_active_ratio", job)}
    exporter_pod = {
        "exporter_namespace": NAMESPACE,
        "exporter_pod": "smlens-x7k2p",
        "exporter_container": "smlens",
        "node": "gpu-node-1",
    }
    target_labels = {"__name__", "instance", "job", "endpoint", "service", *exporter_pod}
    for labels in served:
        got = stored[labels["uuid"]]
        assert {k: v for k, v in got.items() if k not in target_labels} == labels
        assert {k: got[k] for k in exporter_pod} == exporter_pod
    (up,) = series(url, "up", job)
    assert not {"namespace", "pod", "container"} & up.keys()
    assert up["exporter_pod"] == "smlens-x7k2p" and up["node"] == "gpu-node-1"

    leaked = {s["uuid"]: s for s in series(url, "gpu_sm_active_ratio", "baseline")}
    unattributed = next(labels for labels in served if "pod" not in labels)
    assert leaked[unattributed["uuid"]]["pod"] == "smlens-x7k2p"  # what the chart's relabelings prevent


def migration_doc_monitor() -> dict[str, Any]:
    """The dcgm-exporter ServiceMonitor endpoint that docs/migration.md tells users to set."""
    text = (REPO / "docs" / "migration.md").read_text()
    start = text.index("```yaml\nhonorLabels: true", text.index("In the dcgm-exporter ServiceMonitor"))
    block = text[start + len("```yaml\n") : text.index("```", start + 3)]
    endpoint: dict[str, Any] = yaml.safe_load(block)
    return endpoint


def test_dcgm_exporter_scrape_from_the_migration_doc_leaves_unheld_gpus_unowned(
    prometheus: Prometheus,
) -> None:
    """dcgm-exporter labels a GPU with its pod only where a pod holds it (its transformation/kubernetes.go
    sets the attributes under `if exists`). honorLabels alone lets the
    exporter pod's target labels fill in the unheld GPU's pod; the documented relabelling does not."""
    documented = migration_doc_monitor()
    node_only = [r for r in documented["relabelings"] if r.get("targetLabel") == "node"]
    with dcgm_exporter() as target:
        prometheus.start(
            {
                "scrape_configs": [
                    scrape_job(
                        "documented",
                        target,
                        documented["honorLabels"],
                        operator_relabelings("ServiceMonitor", "documented")
                        + [prometheus_rule(r) for r in documented["relabelings"]],
                    ),
                    scrape_job(
                        "honor-only",
                        target,
                        True,
                        operator_relabelings("ServiceMonitor", "honor-only")
                        + [prometheus_rule(r) for r in node_only],
                    ),
                ]
            }
        )
        stored = {s["gpu"]: s for s in series(prometheus.url, "DCGM_FI_DEV_GPU_UTIL", "documented")}
        leaked = {s["gpu"]: s for s in series(prometheus.url, "DCGM_FI_DEV_GPU_UTIL", "honor-only")}
    held, unheld = stored["0"], stored["1"]
    assert (held["namespace"], held["pod"], held["container"]) == ("ml", "train-0", "main")
    assert not {"namespace", "pod", "container"} & unheld.keys()
    assert unheld["exporter_pod"] == "smlens-x7k2p" and unheld["node"] == "gpu-node-1"
    assert leaked["1"]["pod"] == "smlens-x7k2p"  # the exporter pod named as the unheld GPU's owner
