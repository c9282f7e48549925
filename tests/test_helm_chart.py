"""The Helm chart: rendered by Helm's Go code, every object checked by real schema validators.

Core objects go through kubernetes-validate --strict for the oldest and newest Kubernetes the chart
supports; ServiceMonitor, PodMonitor and PrometheusRule through the prometheus-operator CRD schemas
vendored in tests/schemas/prometheus-operator/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import REPO
from helm_support import CHART_DIR, CI_VALUES, NAMESPACE, Rendered, helm_sync, render
from smlens import __version__, cli
from smlens import settings as config
from smlens.verdicts import thresholds

KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())
CRD_SCHEMAS = REPO / "tests" / "schemas" / "prometheus-operator"
VALUES_CASES = [None, *CI_VALUES]
VALUES_IDS = ["default", *(p.stem for p in CI_VALUES)]


def _strict(node: Any) -> Any:
    """The CRD schema as the API server applies it: unknown fields are errors, not silently pruned."""
    if isinstance(node, dict):
        node = {key: _strict(value) for key, value in node.items()}
        prunes = not node.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in node and "additionalProperties" not in node and prunes:
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((CRD_SCHEMAS / f"{kind.lower()}-v1.json").read_text())
    return jsonschema.Draft7Validator(_strict(schema))


def validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        crd_validator(obj["kind"]).validate(obj)
        return
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("values", VALUES_CASES, ids=VALUES_IDS)
def test_every_rendered_object_is_valid(values: Path | None) -> None:
    rendered = render(values)
    assert rendered.objects
    for obj in rendered.objects:
        assert obj["metadata"]["name"], obj
        validate(obj)


def test_the_validators_reject_what_the_api_server_would() -> None:
    rendered = render()
    monitor = rendered.one("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["honorlabels"] = True
    with pytest.raises(jsonschema.ValidationError, match="honorlabels"):
        validate(monitor)
    daemonset = rendered.one("DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(jsonschema.ValidationError, match="hostPid"):
        validate(daemonset)


@pytest.mark.parametrize("values", VALUES_CASES, ids=VALUES_IDS)
def test_helm_lint_strict_passes(values: Path | None) -> None:
    loaded = yaml.safe_load(values.read_text()) if values else None
    report = helm_python.lint(CHART_DIR, loaded, strict=True, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_version_follows_the_package() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == helm_sync.chart_version(__version__)


# --- values.schema.json ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus": 1}, "additional properties 'bogus' not allowed"),
        ({"serviceMonitor": {"intervall": "15s"}}, "additional properties 'intervall' not allowed"),
        ({"serviceMonitor": {"interval": "15 seconds"}}, "at '/serviceMonitor/interval'"),
        ({"port": "10132"}, "at '/port': got string, want integer"),
        ({"interval": "1s"}, "at '/interval'"),
        ({"backend": "gpm"}, "at '/backend': value must be one of 'auto', 'nvml', 'dcgm', 'sim'"),
        ({"image": {"digest": "latest"}}, "at '/image/digest'"),
        ({"podResources": {"enabled": "yes"}}, "at '/podResources/enabled': got string, want boolean"),
        ({"thresholds": {"hollow_sm_activ": 0.2}}, "additional properties 'hollow_sm_activ' not allowed"),
        ({"thresholds": {"hollow_sm_active": 1.5}}, "at '/thresholds/hollow_sm_active'"),
        ({"thresholds": {"hollow_sm_active": "high"}}, "at '/thresholds/hollow_sm_active'"),
        ({"thresholds": {"hollow_for": "15 minutes"}}, "at '/thresholds/hollow_for'"),
        ({"thresholds": {"runbook_base_url": "https://x/a b"}}, "at '/thresholds/runbook_base_url'"),
        ({"prometheusRelease": "kube prometheus"}, "at '/prometheusRelease'"),
        ({"prometheusRelease": "x" * 64}, "at '/prometheusRelease'"),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render(values)
    assert message in str(caught.value)


def test_schema_accepts_global_and_set_style_numbers() -> None:
    # `global` is what a parent chart passes down; `--set thresholds.x=0.2` gives the string "0.2".
    render({"global": {"imageRegistry": "registry.example.com"}})
    render({"thresholds": {"hollow_sm_active": "0.2", "tensor_busy": 1}})
    assert "--interval=0.5" in render({"interval": "0.5"}).container["args"]


def test_schema_knows_exactly_the_shipped_thresholds() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    known = set(schema["properties"]["thresholds"]["properties"])
    assert known == set(yaml.safe_load(thresholds.SHIPPED.read_text()))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"podMonitor": {"enabled": True}},
            "serviceMonitor.enabled and podMonitor.enabled are both true",
        ),
        (
            {"securityContext": {"runAsUser": 1000}},
            "podResources.enabled needs the container to run as uid 0",
        ),
        (
            {
                "podResources": {"enabled": False},
                "dcgm": {"embedded": True},
                "securityContext": {"runAsUser": 1},
            },
            "dcgm.embedded needs the container to run as uid 0",
        ),
        (
            {"webConfig": {"enabled": True}},
            "webConfig.enabled needs webConfig.config, webConfig.tlsSecret or",
        ),
        (
            {"webConfig": {"enabled": True, "existingSecret": "web"}},
            "webConfig.existingSecret: set webConfig.scrape.scheme to https or http",
        ),
        (
            {"webConfig": {"enabled": True, "tlsSecret": "tls", "protectProbes": True}},
            "webConfig.protectProbes puts the probes behind basic auth",
        ),
        ({"service": {"enabled": False}}, "serviceMonitor.enabled needs service.enabled"),
    ],
)
def test_contradictory_values_fail_with_one_sentence(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


# --- the DaemonSet ----------------------------------------------------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_default_daemonset_has_pod_labels_with_least_privilege() -> None:
    """One switch (podResources.enabled, on by default): uid 0 for the kubelet's root-owned socket,
    and nothing more: every capability dropped, read-only root filesystem, no privilege escalation."""
    rendered = render()
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    container = rendered.container
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert pod["hostPID"] is False
    assert pod["automountServiceAccountToken"] is False
    (host_path,) = [v["hostPath"] for v in pod["volumes"] if "hostPath" in v]
    assert host_path["path"] == "/var/lib/kubelet/pod-resources"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == host_path["path"])
    assert mount["readOnly"] is True


def test_strict_non_root_mode_gives_up_pod_labels() -> None:
    rendered = render({"podResources": {"enabled": False}})
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    security = rendered.container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65532
    assert security["runAsGroup"] == 65532
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    assert "Workload labels" in rendered.notes and "strict non-root mode" in rendered.notes


def test_monitoring_objects_render_only_where_the_crds_are_served() -> None:
    """An offline render sees no monitoring.coreos.com/v1: auto leaves the objects out and says so;
    always renders them (helm template, GitOps); never leaves them out."""
    kinds = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    auto = render({"monitoringCRDs": "auto"})
    assert not [o for o in auto.objects if o["kind"] in kinds]
    assert {o["kind"] for o in render().objects} >= {"ServiceMonitor", "PrometheusRule"}
    assert not [o for o in render({"monitoringCRDs": "never"}).objects if o["kind"] in kinds]


def test_notes_describe_only_the_monitoring_objects_that_were_rendered() -> None:
    """NOTES.txt must not describe a ServiceMonitor or PrometheusRule and then say neither exists."""
    auto = render({"monitoringCRDs": "auto"}).notes
    assert "No ServiceMonitor was rendered: Helm sees no monitoring.coreos.com/v1" in auto
    assert "No PrometheusRule was rendered either." in auto
    assert "set monitoringCRDs=always" in auto and "port 10132 of every pod" in auto
    assert "rules/ directory" in auto
    for described in ("scrapes the exporters through", "PrometheusRule smlens", "release label", "up{job="):
        assert described not in auto, described
    web = render(
        {**yaml.safe_load((CHART_DIR / "ci" / "webconfig-values.yaml").read_text()), "monitoringCRDs": "auto"}
    )
    assert "scrapes with scheme" not in web.notes and "it serves https only" in web.notes
    rules_only = render({"monitoringCRDs": "auto", "serviceMonitor": {"enabled": False}}).notes
    assert "No ServiceMonitor or PodMonitor was created" in rules_only
    assert "No PrometheusRule was rendered: Helm sees no monitoring.coreos.com/v1" in rules_only
    never = render(
        {"monitoringCRDs": "never", "serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": True}}
    )
    assert "No PodMonitor was rendered: monitoringCRDs=never leaves it out" in never.notes
    rendered = render().notes  # monitoringCRDs=always
    assert "scrapes the exporters through ServiceMonitor smlens." in rendered
    assert "Alerting and recording rules: PrometheusRule smlens." in rendered
    assert "not rendered" not in rendered and "were NOT" not in rendered


def test_one_value_gives_every_monitoring_object_the_release_label() -> None:
    kinds = ("ServiceMonitor", "PrometheusRule")
    rendered = render({"prometheusRelease": "kps"})
    assert [rendered.one(kind)["metadata"]["labels"]["release"] for kind in kinds] == ["kps", "kps"]
    assert "ServiceMonitor smlens, labelled release=kps." in rendered.notes
    assert "PrometheusRule smlens, labelled release=kps." in rendered.notes
    assert "prometheusRelease=" not in rendered.notes  # nothing left to set
    pods = render(
        {"prometheusRelease": "kps", "serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": True}}
    )
    assert pods.one("PodMonitor")["metadata"]["labels"]["release"] == "kps"
    assert all("release" not in render().one(kind)["metadata"]["labels"] for kind in kinds)
    # Values written before prometheusRelease existed render as they did; an object's own label wins.
    old = render(
        {kind: {"additionalLabels": {"release": "kps"}} for kind in ("serviceMonitor", "prometheusRule")}
    )
    assert [old.one(kind)["metadata"]["labels"]["release"] for kind in kinds] == ["kps", "kps"]
    both = render({"prometheusRelease": "kps", "prometheusRule": {"additionalLabels": {"release": "other"}}})
    assert [both.one(kind)["metadata"]["labels"]["release"] for kind in kinds] == ["kps", "other"]


def test_default_daemonset_runs_on_gpu_nodes_only() -> None:
    rendered = render()
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    container = rendered.container
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))  # never takes a GPU
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]}
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert rendered.one("DaemonSet")["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_daemonset_names_the_node_and_asks_the_runtime_for_nvml() -> None:
    container = render().container
    env = _env(container)
    assert env["SMLENS_HOSTNAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert container["ports"] == [{"name": "metrics", "containerPort": 10132, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}


def test_pod_resources_mounts_the_directory_read_only() -> None:
    rendered = render(CHART_DIR / "ci" / "attribution-values.yaml")
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    (mount,) = [m for m in rendered.container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in rendered.container["args"]
    assert pod["hostPID"] is True
    assert "--process-attribution" in rendered.container["args"]
    assert rendered.container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"


def test_privileged_drops_the_settings_kubernetes_forbids_with_it() -> None:
    rendered = render(CHART_DIR / "ci" / "minimal-values.yaml")
    security = rendered.container["securityContext"]
    assert security["privileged"] is True
    assert "allowPrivilegeEscalation" not in security and "capabilities" not in security
    assert {o["kind"] for o in rendered.objects} == {"DaemonSet"}
    assert rendered.one("DaemonSet")["metadata"]["name"] == "gpu-exporter"


def test_dcgm_variant_image_and_hostengine() -> None:
    assert render({"dcgm": {"enabled": True}}).container["image"] == "smlens:0.1.0-dcgm"
    assert render().container["image"] == "smlens:0.1.0"
    rendered = render(CHART_DIR / "ci" / "dcgm-values.yaml")
    container = rendered.container
    assert container["image"] == (
        "registry.example.com/gpu/smlens@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    assert "--dcgm-hostengine=$(NODE_IP):5555" in container["args"]
    assert "--admin-token-file=/etc/smlens-admin/token" in container["args"]
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    (token,) = [v for v in pod["volumes"] if v["name"] == "admin-token"]
    assert token["secret"] == {
        "secretName": "smlens-admin-token",
        "items": [{"key": "token", "path": "token", "mode": 0o400}],  # uid 0 (pod labels on): owner only
    }
    assert _env(container)["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert container["args"][-1] == "--energy-interval=30"
    dashboards = [cm for cm in rendered.of_kind("ConfigMap") if "-dashboard-" in cm["metadata"]["name"]]
    assert dashboards
    for dashboard in dashboards:
        assert dashboard["metadata"]["namespace"] == "grafana"
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "smlens"


def _resolved_settings(args: list[str]) -> config.SourceSettings:
    expanded = [re.sub(r"\$\((\w+)\)", "10.0.0.7", arg) for arg in args]  # as the kubelet expands $(VAR)
    parsed = cli._parser().parse_args(expanded)
    return config.resolve(parsed.command, vars(parsed), environ={"SMLENS_HOSTNAME": "node-a"})


@pytest.mark.parametrize("values", VALUES_CASES, ids=VALUES_IDS)
def test_the_exporter_accepts_every_flag_the_chart_passes(values: Path | None) -> None:
    container = render(values).container
    assert container["args"][0] == "serve"
    settings = _resolved_settings(container["args"])
    assert settings.listen == ("0.0.0.0", 10132)


def test_threshold_overrides_reach_the_exporter_as_a_file_it_loads(tmp_path: Path) -> None:
    rendered = render(CHART_DIR / "ci" / "podmonitor-values.yaml")
    (configmap,) = [c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-thresholds")]
    path = tmp_path / "thresholds.yaml"
    path.write_text(configmap["data"]["thresholds.yaml"])
    loaded = thresholds.load(path)
    assert (loaded.hollow_sm_active, loaded.busy_utilization, loaded.hollow_for) == (0.2, 0.9, "30m")
    assert "--thresholds=/etc/smlens/verdicts/thresholds.yaml" in rendered.container["args"]
    annotations = rendered.one("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch("[0-9a-f]{64}", annotations["checksum/thresholds"])
    assert not [c for c in render().of_kind("ConfigMap") if c["metadata"]["name"].endswith("-thresholds")]


# --- monitors ---------------------------------------------------------------------------------------------


def _endpoint(rendered: Rendered, kind: str) -> dict[str, Any]:
    spec = rendered.one(kind)["spec"]
    (endpoint,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    return dict(endpoint)


@pytest.mark.parametrize(
    ("values", "kind"),
    [(None, "ServiceMonitor"), (CHART_DIR / "ci" / "podmonitor-values.yaml", "PodMonitor")],
)
def test_monitor_keeps_the_exporter_pod_off_gpu_series(values: Path | None, kind: str) -> None:
    rendered = render(values)
    assert len(rendered.of_kind("ServiceMonitor") + rendered.of_kind("PodMonitor")) == 1
    endpoint = _endpoint(rendered, kind)
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    relabelings = endpoint["relabelings"]
    for label in ("namespace", "pod", "container"):
        moved = {"action": "replace", "sourceLabels": [label], "targetLabel": f"exporter_{label}"}
        assert moved in relabelings
    assert {"action": "labeldrop", "regex": "namespace|pod|container"} in relabelings
    assert {
        "action": "replace",
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
    } in relabelings
    selector = rendered.one(kind)["spec"]["selector"]["matchLabels"]
    pod_labels = rendered.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert rendered.one(kind)["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_user_relabelings_come_after_the_charts() -> None:
    rendered = render(CHART_DIR / "ci" / "attribution-values.yaml")
    endpoint = _endpoint(rendered, "ServiceMonitor")
    user = {"action": "replace", "targetLabel": "cluster", "replacement": "gpu-east"}
    assert endpoint["relabelings"][-1] == user
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "20s")
    assert rendered.one("ServiceMonitor")["metadata"]["labels"]["release"] == "kps"
    assert rendered.one("PrometheusRule")["metadata"]["labels"]["release"] == "kps"


# --- NOTES.txt --------------------------------------------------------------------------------------------


def test_notes_tell_what_to_do_next() -> None:
    notes = render().notes
    assert "kubectl -n monitoring port-forward ds/smlens 10132" in notes
    assert "--set prometheusRelease=<your kube-prometheus-stack release>" in notes
    assert "podResources.enabled=true" in render({"podResources": {"enabled": False}}).notes
    labelled = render(CHART_DIR / "ci" / "attribution-values.yaml").notes
    assert "prometheusRelease" not in labelled
    assert "Workload labels" not in labelled


def test_profile_value_adds_compute_and_sys_admin_only_when_enabled() -> None:
    assert "SYS_ADMIN" not in json.dumps(render().container)
    container = render({"profile": {"enabled": True}}).container
    assert _env(container)["NVIDIA_DRIVER_CAPABILITIES"] == "utility,compute"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    values = {"profile": {"enabled": True}, "nvidia": {"driverCapabilities": "compute,utility"}}
    both = render(values).container
    assert _env(both)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    validate(render({"profile": {"enabled": True}}).one("DaemonSet"))
