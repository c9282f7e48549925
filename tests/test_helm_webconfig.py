"""The chart's web config: the Secret it mounts is a file the exporter accepts, and the monitors, probes,
NOTES and NetworkPolicy match what the exporter serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from helm_support import CHART_DIR, NAMESPACE, Rendered, render
from smlens.web.webconfig import web_config_from
from tls_support import TestCA

WEB_VALUES = CHART_DIR / "ci" / "webconfig-values.yaml"


def endpoint(rendered: Rendered, kind: str = "ServiceMonitor") -> dict[str, Any]:
    spec = rendered.one(kind)["spec"]
    (found,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    return dict(found)


def volume_secrets(rendered: Rendered) -> dict[str, str]:
    volumes = rendered.one("DaemonSet")["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}


def test_web_config_from_values_is_a_file_the_exporter_accepts(tmp_path: Path) -> None:
    rendered = render(WEB_VALUES)
    (secret,) = rendered.of_kind("Secret")
    assert secret["metadata"]["name"] == "smlens-web-config"
    text = secret["stringData"]["web-config.yml"]
    assert yaml.safe_load(text)["tls_server_config"] == {
        "cert_file": "/etc/smlens-tls/tls.crt",
        "key_file": "/etc/smlens-tls/tls.key",
    }
    # The kubernetes.io/tls Secret's files, where the pod would see them.
    ca = TestCA(tmp_path)
    issued = ca.issue("tls", ["smlens.monitoring.svc"])
    text = text.replace("/etc/smlens-tls/tls.crt", str(issued.cert)).replace(
        "/etc/smlens-tls/tls.key", str(issued.key)
    )
    config = web_config_from(yaml.safe_load(text), Path("/etc/smlens-web/web-config.yml"))
    assert config.tls is not None
    assert set(config.users) == {"prometheus"}
    assert config.headers == ((b"x-content-type-options", b"nosniff"),)

    container = rendered.container
    assert "--web-config-file=/etc/smlens-web/web-config.yml" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (mounts["web-config"], mounts["web-tls"]) == ("/etc/smlens-web", "/etc/smlens-tls")
    assert volume_secrets(rendered) == {"web-config": "smlens-web-config", "web-tls": "smlens-tls"}


def test_monitor_and_probes_speak_https_with_the_credentials_secret() -> None:
    rendered = render(WEB_VALUES)
    found = endpoint(rendered)
    assert found["scheme"] == "https"
    assert found["tlsConfig"] == {
        "ca": {"secret": {"name": "smlens-tls", "key": "ca.crt"}},
        "serverName": f"smlens.{NAMESPACE}.svc",
    }
    assert found["basicAuth"] == {
        "username": {"name": "smlens-scrape-auth", "key": "username"},
        "password": {"name": "smlens-scrape-auth", "key": "password"},
    }
    for probe in ("livenessProbe", "readinessProbe"):
        assert rendered.container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert "it serves https only" in rendered.notes
    assert "basic auth from Secret smlens-scrape-auth" in rendered.notes


def test_podmonitor_gets_the_same_scrape_settings() -> None:
    values = yaml.safe_load(WEB_VALUES.read_text())
    values.update(serviceMonitor={"enabled": False}, podMonitor={"enabled": True}, service={"enabled": False})
    found = endpoint(render(values), "PodMonitor")
    assert found["scheme"] == "https" and "tlsConfig" in found and "basicAuth" in found


def test_existing_secret_and_explicit_scrape_settings() -> None:
    rendered = render(
        {
            "webConfig": {
                "enabled": True,
                "existingSecret": "my-web-config",
                "scrape": {"scheme": "https", "tlsConfig": {"insecureSkipVerify": True}},
            }
        }
    )
    assert not rendered.of_kind("Secret")
    assert volume_secrets(rendered) == {"web-config": "my-web-config"}
    found = endpoint(rendered)
    assert (found["scheme"], found["tlsConfig"]) == ("https", {"insecureSkipVerify": True})
    assert "basicAuth" not in found


def test_basic_auth_only_keeps_http_and_warns_without_credentials() -> None:
    rendered = render(
        {"webConfig": {"enabled": True, "config": {"basic_auth_users": {"p": "$2b$04$" + "a" * 53}}}}
    )
    assert endpoint(rendered)["scheme"] == "http"
    assert "tlsConfig" not in endpoint(rendered)
    assert "scheme" not in rendered.container["livenessProbe"]["httpGet"]
    assert "Prometheus will get 401 on every scrape" in rendered.notes


def test_protected_probes_need_headers_and_pass_the_flag() -> None:
    header = {"httpHeaders": [{"name": "Authorization", "value": "Basic cDpx"}]}
    rendered = render(
        {
            "webConfig": {"enabled": True, "tlsSecret": "tls", "protectProbes": True},
            "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": "metrics", **header}},
            "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "metrics", **header}},
        }
    )
    assert "--web-protect-probes" in rendered.container["args"]
    assert rendered.container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_plaintext_password_in_values_is_refused_naming_the_key() -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render({"webConfig": {"enabled": True, "config": {"basic_auth_users": {"p": "secret"}}}})
    assert "/webConfig/config/basic_auth_users/p" in str(caught.value)


def test_default_chart_has_no_web_config_and_no_network_policy() -> None:
    rendered = render()
    assert not rendered.of_kind("Secret") and not rendered.of_kind("NetworkPolicy")
    assert endpoint(rendered)["scheme"] == "http"
    assert not any(a.startswith("--web-") for a in rendered.container["args"])


def test_network_policy_admits_only_prometheus_on_the_port() -> None:
    rendered = render(WEB_VALUES)
    policy = rendered.one("NetworkPolicy")["spec"]
    pod_labels = rendered.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 10132, "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    assert "NetworkPolicy smlens admits only these peers" in rendered.notes
    assert f'"kubernetes.io/metadata.name":"{NAMESPACE}"' in rendered.notes


def test_network_policy_names_the_prometheus_namespace_and_refuses_an_empty_from() -> None:
    values = {"networkPolicy": {"enabled": True, "prometheusNamespace": "kps"}}
    (peer,) = render(values).one("NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kps"}}
    own = [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert (
        render({"networkPolicy": {"enabled": True, "from": own}}).one("NetworkPolicy")["spec"]["ingress"][0][
            "from"
        ]
        == own
    )
    with pytest.raises(helm_python.HelmValuesError):  # in Kubernetes an empty from admits every source
        render({"networkPolicy": {"enabled": True, "from": []}})
